"""The Python models that run inside Triton. ``specbuild package`` copies each file as ``<model>/1/model.py``.

They need ``specbuild`` importable in the server's Python environment (it is, in both Docker images and in
the venv that ``specbuild serve`` starts the bundled server from); the logic they use lives in importable,
tested modules (:mod:`specbuild.serve.text`, :mod:`specbuild.speculation.loop`, :mod:`specbuild.speculation.torch_engine`).
"""

MODEL_SOURCES = {
    "preprocessing": "preprocessing.py",
    "orchestrator": "orchestrator.py",
    "postprocessing": "postprocessing.py",
    "torch_engine": "torch_engine_model.py",
    "llmapi_adapter": "llmapi_adapter.py",
    "llmapi_stand_in": "llmapi_stand_in_model.py",
}

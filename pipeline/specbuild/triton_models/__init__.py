"""The ensemble's python models as they run inside Triton (``preprocessing``, ``orchestrator``, ``postprocessing``:
each file is shipped as ``<model>/1/model.py``), their glue to the python backend, and the pure modules they run:
requests parsed, engines called and text decoded by the same code the OpenAI-compatible API and the tests use."""

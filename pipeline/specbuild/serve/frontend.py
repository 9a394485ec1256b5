"""Run specbuild's OpenAI-compatible API (:mod:`specbuild.serve.openai_api`) with uvicorn in a thread of this
process, next to a Triton server: started, checked and stopped like :class:`~specbuild.serve.server.TritonServer`.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path
from types import TracebackType

from specbuild.errors import ServerError, UsageError
from specbuild.serve.processes import free_port, reachable_host
from specbuild.spec import TRITON_DEFAULTS


def serves_openai(repository: str | Path) -> bool:
    """Whether the API can serve the release in ``repository``: it calls specbuild's orchestrator and uses the
    preprocessing model's tokenizer (a tensorrt-llm-llmapi release has neither)."""
    from specbuild.package.contract import ORCHESTRATOR_MODEL, PREPROCESSING_MODEL

    repository = Path(repository)
    return (repository / ORCHESTRATOR_MODEL / "config.pbtxt").is_file() and \
        (repository / PREPROCESSING_MODEL / "1" / "tokenizer").is_dir()


class OpenAIFrontend:
    """The API for the model repository ``repository``, served as ``model`` (the release's name), calling its
    orchestrator on Triton's gRPC ``triton_url``; listening on ``host:port`` (loopback unless told otherwise;
    port 0: a free one). A context manager."""

    def __init__(self, repository: str | Path, triton_url: str, model: str, *, host: str = TRITON_DEFAULTS.host,
                 port: int = TRITON_DEFAULTS.openai_port, startup_timeout: float = 60.0) -> None:
        self.repository = Path(repository)
        self.triton_url = triton_url
        self.model = model
        self.host = host
        self.port = port
        self.startup_timeout = startup_timeout
        self._server = None
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        """The API's base URL, ``http://host:port/v1`` (loopback for a server bound to every interface)."""
        return f"http://{reachable_host(self.host)}:{self.port}/v1"

    def start(self) -> OpenAIFrontend:
        try:
            import uvicorn
        except ImportError as exc:
            raise ServerError("the OpenAI-compatible API needs FastAPI and uvicorn",
                              "install the serve extra: pip install 'specbuild[serve]'") from exc
        from specbuild.serve.openai_api import create_app
        from specbuild.serve.orchestrator_client import OrchestratorClient

        if self._thread is not None:
            raise UsageError("this front end is already started")
        app = create_app(OrchestratorClient.for_release(self.triton_url, self.repository), self.model)
        self.port = self.port or free_port(self.host if self.host not in ("0.0.0.0", "::") else "")
        self._server = uvicorn.Server(uvicorn.Config(app, host=self.host, port=self.port, log_level="warning",
                                                     timeout_graceful_shutdown=5))
        self._thread = threading.Thread(target=self._server.run, name="openai-frontend", daemon=True)
        self._thread.start()
        deadline = time.monotonic() + self.startup_timeout
        while not self._server.started:
            if not self._thread.is_alive():
                self._thread = None
                raise ServerError(f"the OpenAI-compatible API could not listen on {self.host}:{self.port}",
                                  "choose another --openai-port, or free that one")
            if time.monotonic() > deadline:
                self.stop()
                raise ServerError(f"the OpenAI-compatible API did not start within {self.startup_timeout:g} s")
            time.sleep(0.05)
        return self

    def is_running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def stop(self) -> None:
        """Stop serving (in-flight requests get a few seconds); idempotent."""
        if self._server is not None:
            self._server.should_exit = True
        if self._thread is not None:
            self._thread.join(timeout=15)
        self._server, self._thread = None, None

    def __enter__(self) -> OpenAIFrontend:
        return self.start()

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.stop()

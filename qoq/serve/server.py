"""Run the app under uvicorn, with a draining shutdown.

SIGTERM (or Ctrl-C): stop admitting (new generation requests and /health get 503, the socket stays open so
clients are told), wait up to `drain_timeout` seconds for running requests to finish, abort what is left,
then let uvicorn close connections and run the lifespan shutdown (the engine thread stops); exit 0.
A second signal skips the wait.
"""

from __future__ import annotations

import logging
import sys
import threading
import time

import uvicorn

from qoq.serve.app import CountResponses, build_app
from qoq.serve.engine_loop import EngineLoop
from qoq.serve.metrics import Metrics
from qoq.serve.serving import ServerState

log = logging.getLogger("qoq.serve")
SWITCH_INTERVAL_S = 0.0005


class DrainingServer(uvicorn.Server):
    def __init__(self, config: uvicorn.Config, state: ServerState, drain_timeout: float):
        super().__init__(config)
        self.state, self.drain_timeout = state, drain_timeout
        self._drain_thread: threading.Thread | None = None

    def handle_exit(self, sig, frame) -> None:  # uvicorn's signal handler (main thread)
        if self._drain_thread is None:
            self.state.draining = True
            self._drain_thread = threading.Thread(target=self._drain, name="qoq-drain", daemon=True)
            self._drain_thread.start()
        else:  # a second signal: stop now
            self.state.engine_loop.abort_all()
            self.should_exit = True

    def _drain(self) -> None:
        loop = self.state.engine_loop
        log.info("draining: %d request(s) running, waiting up to %.0f s", loop.num_active, self.drain_timeout)
        deadline = time.monotonic() + self.drain_timeout
        while loop.num_active and time.monotonic() < deadline and not self.should_exit:
            time.sleep(0.05)
        if loop.num_active:
            log.warning("drain timeout: aborting %d request(s)", loop.num_active)
            loop.abort_all()
            end = time.monotonic() + 5.0
            while loop.num_active and time.monotonic() < end:
                time.sleep(0.05)
        time.sleep(0.2)  # let the last responses' final events go out
        self.should_exit = True


def configure_logging(level: str) -> None:
    logger = logging.getLogger("qoq.serve")
    if not logger.handlers:
        handler = logging.StreamHandler()
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
        logger.addHandler(handler)
    logger.setLevel(level.upper())
    logger.propagate = False


def run_server(engine, model_name: str, host: str, port: int, api_key: str | None, drain_timeout: float,
               log_level: str = "info") -> None:
    configure_logging(log_level)
    # the engine thread and the event loop share the GIL: a step waiting to take it back from a busy loop
    # waits up to one switch interval (5 ms by default, a whole decode step)
    sys.setswitchinterval(SWITCH_INTERVAL_S)
    t = time.perf_counter()
    if n := engine.capture_graphs():  # before listening: no request waits on a capture
        log.info("captured %d decode CUDA graphs in %.1f s", n, time.perf_counter() - t)
    metrics = Metrics(model_name)
    state = ServerState(EngineLoop(engine, metrics), model_name, api_key)
    app = CountResponses(build_app(state, metrics), metrics)
    config = uvicorn.Config(app, host=host, port=port, log_level=log_level, access_log=False, lifespan="on",
                            timeout_graceful_shutdown=5, timeout_keep_alive=5)
    server = DrainingServer(config, state, drain_timeout)
    log.info("serving %s (%s) on http://%s:%d: max_model_len %d, %d KV pages", model_name, engine.artifact_dir,
             host, port, engine.max_model_len, engine.blocks.num_pages)
    server.run()
    if state.engine_loop.error is not None:
        raise SystemExit(1)

"""The engine's own thread: HTTP handlers never call the engine (a step holds its lock), they talk to this
loop through a thread-safe command queue, and it hands each request's outputs back to the handler's
asyncio queue with `loop.call_soon_threadsafe`.

    handle = RequestHandle("cmpl-1", prompt_ids, params)
    engine_loop.submit(handle)          # from the event loop; never blocks
    out = await handle.queue.get()      # RequestOutput, or an EngineFailure
    engine_loop.abort(handle)           # client gone: the engine frees its pages

The thread sleeps on the command queue while the engine is idle and steps while work exists; between
steps it admits new requests and applies aborts. It also records the metrics and the per-request log line.
"""

from __future__ import annotations

import asyncio
import logging
import queue
import threading
import time

from qoq.engine.sequence import RequestOutput

log = logging.getLogger("qoq.serve")


class EngineFailure(Exception):
    """Put on a request's queue when the engine refused it (ValueError) or a step raised."""

    def __init__(self, message: str, status: int):
        super().__init__(message)
        self.status = status


class RequestHandle:
    def __init__(self, request_id: str, prompt_ids: list[int], params):
        self.request_id = request_id
        self.prompt_ids = prompt_ids
        self.params = params
        self.queue: asyncio.Queue = asyncio.Queue()
        self.engine_id: int | None = None
        self.arrival = time.perf_counter()
        self.first_token: float | None = None
        self.last_token: float | None = None
        self.num_generated = 0
        self.cancelled = False  # aborted before the engine saw it
        self.done = False  # set by the HTTP side once it has read the final output


def _deliver(batch: list) -> None:
    for handle, item in batch:
        handle.queue.put_nowait(item)


class EngineLoop:
    def __init__(self, engine, metrics):
        self.engine = engine
        self.metrics = metrics
        self.error: BaseException | None = None  # a step raised: the engine is dead, health says so
        self._commands: queue.SimpleQueue = queue.SimpleQueue()
        self._handles: dict[int, RequestHandle] = {}  # engine id -> handle (engine thread only)
        self._active = 0  # submitted, not yet finished
        self._active_lock = threading.Lock()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._stopping = threading.Event()
        self._batch: list | None = None  # a step's (handle, item) pairs while _dispatch collects them
        self._snapshot()

    # -- the HTTP side ---------------------------------------------------------------------------
    @property
    def num_active(self) -> int:
        return self._active

    @property
    def accepting(self) -> bool:
        return self._thread is not None and self._thread.is_alive() and not self._stopping.is_set()

    def start(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._thread = threading.Thread(target=self._run, name="qoq-engine", daemon=True)
        self._thread.start()

    def submit(self, handle: RequestHandle) -> None:
        with self._active_lock:
            self._active += 1
        self._commands.put(("add", handle))

    def abort(self, handle: RequestHandle) -> None:
        self._commands.put(("abort", handle))

    def abort_all(self) -> None:
        self._commands.put(("abort_all", None))

    def stop(self, timeout: float = 10.0) -> None:
        self._stopping.set()
        self._commands.put(("wake", None))
        if self._thread is not None:
            self._thread.join(timeout)

    # -- the engine thread -----------------------------------------------------------------------
    def _run(self) -> None:
        try:
            while not self._stopping.is_set():
                idle = self.error is not None or not self.engine.has_unfinished()
                self._apply_commands(block=idle)
                if self.engine.has_unfinished() and self.error is None:
                    try:
                        outputs = self.engine.step()
                    except Exception as e:  # a bug or a device fault: fail everything, refuse new work
                        log.exception("engine step failed")
                        self._fail_all(e)
                        continue
                    self._dispatch(outputs)
                self._snapshot()
        except BaseException as e:  # a bug in this loop: say so on /health rather than hang every request
            log.exception("the engine loop failed")
            self.error = e
        finally:
            self._stopping.set()
            self._apply_commands(block=False)
            for handle in list(self._handles.values()):
                try:
                    self.engine.abort(handle.engine_id)
                except Exception:  # noqa: BLE001 - a broken engine: the handle must still end
                    pass
                self._finish(handle, "abort", RequestOutput(handle.engine_id, [], "", True, "abort"))
            self._snapshot()

    def _apply_commands(self, block: bool) -> None:
        try:
            cmd, handle = self._commands.get(timeout=0.1) if block else self._commands.get_nowait()
        except queue.Empty:
            return
        while True:
            if cmd == "add":
                self._add(handle)
            elif cmd == "abort":
                if handle.engine_id is None:
                    handle.cancelled = True
                else:
                    self.engine.abort(handle.engine_id)  # its final output comes with the next step
            elif cmd == "abort_all":
                for h in list(self._handles.values()):
                    self.engine.abort(h.engine_id)
            try:
                cmd, handle = self._commands.get_nowait()
            except queue.Empty:
                return

    def _add(self, handle: RequestHandle) -> None:
        if handle.cancelled or self._stopping.is_set():
            self._finish(handle, "abort", RequestOutput(-1, [], "", True, "abort"))
            return
        if self.error is not None:
            self._push(handle, EngineFailure(f"the engine failed: {self.error}", 503))
            self._release()
            return
        try:
            handle.engine_id = self.engine.add_request(handle.prompt_ids, handle.params)
        except ValueError as e:  # the HTTP side checks limits first; this is the engine's last word
            self._push(handle, EngineFailure(str(e), 400))
            self._release()
            return
        except Exception as e:  # noqa: BLE001 - a bug: fail this request, keep serving the others
            log.exception("add_request failed")
            self._push(handle, EngineFailure(f"internal error: {e}", 500))
            self._release()
            return
        self._handles[handle.engine_id] = handle
        self.metrics.admitted(len(handle.prompt_ids))

    def _dispatch(self, outputs: list[RequestOutput]) -> None:
        """A step's outputs reach the event loop in one callback (one wake-up, not one per request)."""
        now = time.perf_counter()
        self._batch = []
        for out in outputs:
            handle = self._handles.get(out.request_id)
            if handle is None:
                continue
            if out.new_token_ids:
                n = len(out.new_token_ids)
                if handle.first_token is None:
                    handle.first_token = now
                    self.metrics.token(ttft=now - handle.arrival, n=n)
                else:
                    self.metrics.token(itl=now - handle.last_token, n=n)
                handle.last_token = now
                handle.num_generated += n
            if out.finished:
                self._finish(handle, out.finish_reason or "stop", out)
            else:
                self._push(handle, out)
        batch, self._batch = self._batch, None
        if batch:
            self._call(_deliver, batch)

    def _finish(self, handle: RequestHandle, status: str, final) -> None:
        self._handles.pop(handle.engine_id, None)
        now = time.perf_counter()
        self.metrics.finished(status, now - handle.arrival)
        ttft = f"{handle.first_token - handle.arrival:.3f}s" if handle.first_token is not None else "-"
        log.info("request %s: status=%s prompt_tokens=%d completion_tokens=%d ttft=%s total=%.3fs",
                 handle.request_id, status, len(handle.prompt_ids), handle.num_generated, ttft,
                 now - handle.arrival)
        self._push(handle, final)
        self._release()

    def _fail_all(self, error: Exception) -> None:
        self.error = error
        for handle in list(self._handles.values()):
            try:
                self.engine.abort(handle.engine_id)
            except Exception:  # noqa: BLE001 - the engine is already broken; the handle must still end
                pass
            self._finish(handle, "error", EngineFailure(f"the engine failed: {error}", 500))

    def _release(self) -> None:
        with self._active_lock:
            self._active -= 1

    def _push(self, handle: RequestHandle, item) -> None:
        if self._batch is not None:  # inside _dispatch: goes with the step's batch
            self._batch.append((handle, item))
        else:
            self._call(handle.queue.put_nowait, item)

    def _call(self, fn, arg) -> None:
        try:
            self._loop.call_soon_threadsafe(fn, arg)
        except RuntimeError:  # the event loop is closed: nobody is listening any more
            pass

    def _snapshot(self) -> None:
        blocks, sched = self.engine.blocks, self.engine.scheduler
        self.metrics.set_gauges(running=len(sched.running), waiting=len(sched.waiting),
                                pages_used=blocks.num_pages - blocks.num_free_pages,
                                pages_free=blocks.num_free_pages, pages_total=blocks.num_pages)

"""How the `qoq` command fails: every error is one line on stderr (`error: ...`) and a non-zero exit;
`--debug` or QOQ_DEBUG=1 lets the exception through with its stack instead. SIGTERM and SIGHUP are
turned into an exception like SIGINT's, so temp dirs are removed however the run is stopped.

Exit codes: 1 an error, 2 a usage error (click's), 128 + N killed by signal N (130 SIGINT, 143 SIGTERM).
"""

from __future__ import annotations

import json
import math
import os
import signal
import sys
import threading
from contextlib import contextmanager
from functools import wraps

import click
import typer

DEBUG_ENV = "QOQ_DEBUG"
HANDLED_SIGNALS = (signal.SIGTERM, signal.SIGHUP)
OOM_MARKERS = ("out of memory", "can't allocate memory", "not enough memory")


class state:  # noqa: N801  set by the top-level callback on every invocation
    debug = False


def debug_enabled() -> bool:
    return state.debug or os.environ.get(DEBUG_ENV, "") not in ("", "0")


class Terminated(BaseException):
    """The process got SIGTERM or SIGHUP (a BaseException, like KeyboardInterrupt, so no
    `except Exception` swallows it and every `with` block's cleanup runs)."""

    def __init__(self, signum: int):
        super().__init__(signum)
        self.signum = signum


def _raise_terminated(signum, _frame):
    raise Terminated(signum)


@contextmanager
def signals_as_exceptions():
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = {s: signal.signal(s, _raise_terminated) for s in HANDLED_SIGNALS}
    try:
        yield
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)


def one_line(e: BaseException) -> tuple[str, int]:
    """(message, exit code) for an exception that reached the command."""
    if isinstance(e, KeyboardInterrupt):
        return "interrupted (SIGINT); nothing was written", 128 + signal.SIGINT
    if isinstance(e, Terminated):
        return f"terminated ({signal.Signals(e.signum).name}); nothing was written", 128 + e.signum
    if isinstance(e, KeyError) and e.args:
        msg = str(e.args[0])
    elif isinstance(e, OSError) and e.strerror and e.filename:
        msg = f"{e.filename}: {e.strerror}"
    else:
        msg = str(e) or type(e).__name__
    msg = " ".join(msg.split())
    if isinstance(e, MemoryError) or (isinstance(e, RuntimeError) and any(m in msg.lower() for m in OOM_MARKERS)):
        return f"out of memory: {msg}", 1
    if not isinstance(e, (ValueError, KeyError, OSError, ImportError, RuntimeError, NotImplementedError)):
        return f"internal error ({type(e).__name__}: {msg}); rerun with --debug for the stack", 1
    return msg, 1


def one_line_errors(fn):
    """Wrap a command: any exception becomes `error: <one line>` on stderr and its exit code."""

    @wraps(fn)
    def wrapper(*args, **kwargs):
        try:
            with signals_as_exceptions():
                return fn(*args, **kwargs)
        except (typer.Exit, click.exceptions.Exit, click.exceptions.ClickException, click.exceptions.Abort):
            raise
        except BaseException as e:  # noqa: BLE001  the CLI boundary
            if isinstance(e, SystemExit) or debug_enabled():
                raise
            msg, code = one_line(e)
            print(f"error: {msg}", file=sys.stderr)
            raise typer.Exit(code) from None

    return wrapper


def _finite(value):
    """The value with every NaN/inf float replaced by None, so the JSON is valid JSON."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_finite(v) for v in value]
    return value


def json_text(data) -> str:
    return json.dumps(_finite(data), indent=2, default=str, allow_nan=False)

"""Stopping a run cleanly: SIGTERM and Ctrl-C ask it to stop, and it stops at the next safe
point (a training step, an evaluation batch, a worker's wait for work) by raising
``KeyboardInterrupt`` there, which the driver records as an interrupted trial.

The signal handler itself raises nothing. Python runs a handler between any two bytecodes of
the main thread, including inside a finaliser or a weakref callback (SQLAlchemy has some),
where an exception is printed as "Exception ignored" and dropped: a worker stopped that way
trained on to the end of its trial. A handler that raised could also cut a store write in half.

A second Ctrl-C stops at once (for work with no safe point nearby, e.g. loading a large data
set); a second SIGTERM changes nothing, so the parent-death signal a worker also gets when its
``ablate run`` exits cannot cut short the recording of its trial.
"""

from __future__ import annotations

import signal
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

_requested = threading.Event()


def requested() -> bool:
    return _requested.is_set()


def request() -> None:
    """Ask the run to stop at its next safe point (what SIGTERM and Ctrl-C do)."""
    _requested.set()


def check() -> None:
    """A safe point: raise ``KeyboardInterrupt`` if a stop was asked for."""
    if _requested.is_set():
        raise KeyboardInterrupt


def sleep(seconds: float) -> None:
    """``time.sleep`` that ends early, raising ``KeyboardInterrupt``, when a stop is asked for."""
    deadline = time.monotonic() + seconds
    while (left := deadline - time.monotonic()) > 0:
        check()
        time.sleep(min(left, 0.1))
    check()


def _on_signal(signum: int, frame) -> None:
    if signum == signal.SIGINT and _requested.is_set():
        raise KeyboardInterrupt  # a second Ctrl-C: now
    _requested.set()


@contextmanager
def stop_signals() -> Iterator[None]:
    """Within this block SIGTERM and Ctrl-C ask for a stop; the caller's handlers (and a clear
    request) are restored after. Outside the main thread (where handlers cannot be set) it
    changes nothing."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    before = {sig: signal.signal(sig, _on_signal) for sig in (signal.SIGTERM, signal.SIGINT)}
    _requested.clear()
    try:
        yield
    finally:
        for sig, handler in before.items():
            signal.signal(sig, handler)
        _requested.clear()

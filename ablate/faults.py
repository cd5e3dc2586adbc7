"""Test hook for resume tests: die at a named point instead of racing a timer.

``ABLATE_TEST_KILL_AT=NAME@K`` makes the process SIGKILL itself the K-th time it reaches
point NAME: ``train`` (after an epoch), ``evaluate`` (before the final evaluation), ``track``
(before the result is logged), ``tell`` (after MLflow has the result, before Optuna does).
Unset, it costs one dictionary lookup.
"""

from __future__ import annotations

import os
import signal

KILL_ENV = "ABLATE_TEST_KILL_AT"
_reached: dict[str, int] = {}


def fault_point(name: str) -> None:
    wanted = os.environ.get(KILL_ENV)
    if not wanted:
        return
    point, _, nth = wanted.partition("@")
    if point != name:
        return
    _reached[name] = _reached.get(name, 0) + 1
    if _reached[name] >= int(nth or 1):
        os.kill(os.getpid(), signal.SIGKILL)

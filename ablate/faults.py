"""Test hook for resume tests: die at a named point instead of racing a timer.

``ABLATE_TEST_KILL_AT=NAME@K`` makes the process SIGKILL itself the K-th time it reaches
point NAME: ``load`` (before the data is read), ``train`` (after an epoch), ``evaluate`` (before
the final evaluation), ``track`` (before the result is logged), ``tell`` (after MLflow has the
result, before Optuna does), ``report`` (before the report is written), ``decide`` (a research
loop's candidate decided, before its ledger has the decision).
``ABLATE_TEST_REACHED=DIR`` makes it create ``DIR/NAME`` at each
point reached (a test that signals the process waits for it). Unset, they cost two lookups.
"""

from __future__ import annotations

import os
import signal

KILL_ENV = "ABLATE_TEST_KILL_AT"
REACHED_ENV = "ABLATE_TEST_REACHED"
_reached: dict[str, int] = {}


def fault_point(name: str) -> None:
    if reached := os.environ.get(REACHED_ENV):
        open(os.path.join(reached, name), "a").close()
    wanted = os.environ.get(KILL_ENV)
    if not wanted:
        return
    point, _, nth = wanted.partition("@")
    if point != name:
        return
    _reached[name] = _reached.get(name, 0) + 1
    if _reached[name] >= int(nth or 1):
        os.kill(os.getpid(), signal.SIGKILL)

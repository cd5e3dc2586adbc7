"""Shared by the tests that stop a real ``ablate`` process with SIGTERM at a given phase."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from ablate.faults import REACHED_ENV


def sigterm_at(point: str, args: list[str], cwd: Path) -> tuple[int, float, str]:
    """Start ``python -m ablate.commands.cli *args`` in ``cwd``, wait until it reaches fault point ``point``
    (:data:`ablate.faults.REACHED_ENV`) and a second more, send SIGTERM: (exit status, seconds from
    the signal to the exit, stderr). Waits for the point, not a fixed time: start-up under load
    with two test processes takes several seconds."""
    reached = cwd / "reached"
    reached.mkdir(exist_ok=True)
    run = subprocess.Popen(
        [sys.executable, "-m", "ablate.commands.cli", *args],
        cwd=cwd,
        env={**os.environ, REACHED_ENV: str(reached)},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and not (reached / point).exists() and run.poll() is None:
            time.sleep(0.2)
        time.sleep(1.0)  # inside the phase by now
        assert run.poll() is None, run.communicate()
        stopped = time.monotonic()
        run.send_signal(signal.SIGTERM)
        _, err = run.communicate(timeout=60)
        return run.returncode, time.monotonic() - stopped, err
    finally:
        run.kill()

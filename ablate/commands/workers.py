"""Workers on this machine: ``ablate run --workers N`` (or ``--gpus``) starts N ``ablate worker``
processes sharing the study's stores and follows them from the store; a SLURM array starts the
same command line (:mod:`ablate.commands.slurm`). A worker stops with the process that started it."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from typing import TYPE_CHECKING

from ablate import stopping
from ablate.commands.console import progress_bars
from ablate.commands.progress import StoreWatch
from ablate.drive import Donors, Stores, prepare, progress
from ablate.errors import AblateError, RunFailed
from ablate.study.load import Study

if TYPE_CHECKING:  # pragma: no cover
    from ablate.commands.gpus import GpuPlan

# Set by `ablate run --workers N` for its workers: the pid they stop with.
PARENT_ENV = "ABLATE_WORKER_OF"
POLL_S = 2.0  # how often the parent of N workers reads the store for its progress


def run_workers(
    study: Study,
    stores: Stores,
    workers: int,
    quiet: bool,
    retry_failed: bool,
    gpus: GpuPlan | None = None,
    donors: Donors | None = None,
):
    """N ``ablate worker`` processes on this machine, sharing the study's stores (with ``gpus``:
    each sees the GPU the plan deals it)."""
    prepare(study, stores)  # create the stores and queues once: schema creation must not race
    cmd = worker_command(study, stores, retry_failed, donors)
    with progress_bars(quiet) as bars:
        watch = StoreWatch(study, stores, bars, quiet, workers)  # before any worker takes a trial
        env = {**os.environ, PARENT_ENV: str(os.getpid())}
        procs = [subprocess.Popen(cmd, env={**env, **(gpus.env(i) if gpus else {})}) for i in range(workers)]
        try:
            while any(p.poll() is None for p in procs):
                stopping.sleep(POLL_S)
                watch.poll()
            watch.poll()
        except BaseException:
            for p in procs:
                p.terminate()
            for p in procs:  # they record their trials as interrupted before this run returns
                try:
                    p.wait(timeout=60)
                except subprocess.TimeoutExpired:
                    pass
            raise
    crashed = [p.returncode for p in procs if p.returncode not in (0, 1)]
    if crashed:
        # Workers that met bad input (status 2) said why; a crash or kill is a failed run.
        error = AblateError if all(code == 2 for code in crashed) else RunFailed
        raise error(
            f"{len(crashed)} of {workers} workers exited with status {crashed[0]}; "
            f"run the study again to resume"
        )
    return watch.before, standing_failures(study, stores)


def worker_command(study: Study, stores: Stores, retry_failed: bool, donors: Donors | None) -> list[str]:
    """The ``ablate worker`` command line of one of a study's workers (run in this folder: a
    SLURM job starts in the folder it was submitted from)."""
    cmd = [sys.executable, "-m", "ablate.commands.cli", "worker", str(study.path), *study.overrides]
    cmd += ["--output", str(stores.output_dir), "--storage", stores.optuna_url]
    cmd += ["--tracking-uri", stores.tracking_uri, "--quiet"]
    if retry_failed:
        cmd.append("--retry-failed")
    for source in donors.sources if donors else ():
        cmd += ["--reuse", source]
    if donors and donors.older_kinds:
        cmd.append("--reuse-older-kinds")
    return cmd


def standing_failures(study: Study, stores: Stores) -> list[tuple[str, int, str]]:
    return [(v, seed, reason) for v, r in progress(study, stores).items() for seed, reason in r.failures]


def stop_with_parent() -> None:
    """On Linux, a worker of `ablate run --workers N` gets SIGTERM (a clean stop, see
    :mod:`ablate.stopping`) when that process dies, even by SIGKILL, instead of training on as
    an orphan."""
    parent = os.environ.get(PARENT_ENV)
    if not parent or not sys.platform.startswith("linux"):
        return
    import ctypes

    pr_set_pdeathsig = 1
    ctypes.CDLL(None, use_errno=True).prctl(pr_set_pdeathsig, signal.SIGTERM)
    if os.getppid() != int(parent):  # it died before the request took effect
        raise KeyboardInterrupt

"""``ablate run --launcher slurm``: a study's workers as a SLURM job array, submitted through
submitit (the library Hydra's SLURM launcher uses), each job one ``ablate worker`` against the
study's stores. The jobs' ids and logs are kept in the output folder (``slurm/jobs.json``) for
``ablate status`` (each job's state beside the trials') and ``ablate cancel``.

Nothing a job holds is lost when it ends early. Cancelled (``scancel``, Ctrl-C, ``ablate
cancel``), its worker gets SIGTERM, records its trial as interrupted at a safe point, and another
worker's next sync queues it again (a SIGKILL frees the worker's lock file or stops its heartbeat
on a shared database: the same, later). Preempted or at its time limit, the job gets submitit's
signal (SIGUSR2, 90 s ahead) and submitit requeues it: the new start is one more worker.

Light to import: each job's Python loads this module to start the worker as a child process.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
from datetime import UTC, datetime
from enum import StrEnum
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from ablate.commands.console import err, out, progress_bars
from ablate.commands.options import OutputOpt, OverridesArg, StudyArg
from ablate.errors import AblateError, RunFailed, first_line

if TYPE_CHECKING:  # pragma: no cover
    from ablate.drive import Donors, Stores
    from ablate.study.load import Study
    from ablate.study.spec import SlurmSpec

JOBS_FILE = Path("slurm") / "jobs.json"  # in the output folder: every submission's jobs
POLL_S = 5.0  # how often `ablate run --launcher slurm` reads the store and the queue
MAX_REQUEUES = 10  # a job at its time limit is requeued this many times (then it ends)
# States of a job still queued or at work (squeue's long names); any other state is an end.
ACTIVE = frozenset({"PENDING", "RUNNING", "CONFIGURING", "COMPLETING", "REQUEUED", "RESIZING", "SUSPENDED"})
ACTIVE |= {"REQUEUE_FED", "REQUEUE_HOLD", "SIGNALING", "STAGE_OUT", "STOPPED", "RESV_DEL_HOLD"}


class Launcher(StrEnum):
    """Where ``ablate run`` starts its workers."""

    local = "local"  # processes on this machine
    slurm = "slurm"  # a SLURM job array


SLURM = "SLURM jobs (--launcher slurm)"
LauncherOpt = Annotated[
    Launcher,
    typer.Option(
        help="Start the workers here, or as SLURM jobs (settings: these options, then the study file's "
        "slurm:, then ~/.config/ablate/slurm.yaml)."
    ),
]
PartitionOpt = Annotated[str | None, typer.Option(help="Partition.", rich_help_panel=SLURM)]
TimeOpt = Annotated[
    str | None, typer.Option(help="Time per job: minutes or [D-]HH:MM:SS.", rich_help_panel=SLURM)
]
MemOpt = Annotated[str | None, typer.Option(help="Memory per job, e.g. 16G.", rich_help_panel=SLURM)]
CpusOpt = Annotated[
    int | None, typer.Option("--cpus-per-task", min=1, help="CPUs per job.", rich_help_panel=SLURM)
]
GpusOpt = Annotated[
    int | None, typer.Option("--gpus-per-task", min=1, help="GPUs per job.", rich_help_panel=SLURM)
]
AccountOpt = Annotated[str | None, typer.Option(help="Account charged.", rich_help_panel=SLURM)]
SbatchOpt = Annotated[
    list[str] | None,
    typer.Option(metavar="--KEY=VALUE", help="Another sbatch option (repeatable).", rich_help_panel=SLURM),
]


def user_config() -> Path:
    """The user's defaults for the jobs: ``$XDG_CONFIG_HOME/ablate/slurm.yaml`` (``~/.config``)."""
    return Path(os.environ.get("XDG_CONFIG_HOME") or Path.home() / ".config") / "ablate" / "slurm.yaml"


def settings(launcher: Launcher, study: Study, *options: Any) -> SlurmSpec | None:
    """``ablate run``'s SLURM settings (None: local workers) from its options in the order of
    :data:`OPTIONS` (None or empty: not given)."""
    return job_settings(study, **dict(zip(OPTIONS, options, strict=True))) if launcher == "slurm" else None


OPTIONS = ("partition", "time", "mem", "cpus_per_task", "gpus_per_task", "account", "sbatch")


def job_settings(study: Study, **given: Any) -> SlurmSpec:
    """The jobs' settings: the command line's (``given``; None or empty: not given) over the study
    file's ``slurm:`` over the user's config file; a bad value named where it was written."""
    import yaml
    from pydantic import ValidationError

    from ablate.study.spec import SlurmSpec

    def checked(values: Any, where: Any) -> SlurmSpec:
        try:
            return SlurmSpec.model_validate(values)
        except ValidationError as exc:
            problem = exc.errors()[0]
            key = ".".join(str(part) for part in problem["loc"])
            raise AblateError(f"{where(key)}: {problem['msg']}") from None

    merged: dict[str, Any] = {}
    path = user_config()
    if path.is_file():
        try:
            mapping = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
        except (yaml.YAMLError, OSError, UnicodeDecodeError) as exc:
            raise AblateError(f"{path}: cannot read: {first_line(exc)}") from None
        merged.update(checked(mapping, lambda key: f"{path}: {key}").model_dump(exclude_unset=True))
    merged.update(study.spec.slurm.model_dump(exclude_unset=True))
    option = lambda key: f"--{key.replace('_', '-')}"  # noqa: E731
    merged.update(checked({k: v for k, v in given.items() if v}, option).model_dump(exclude_unset=True))
    return SlurmSpec.model_validate(merged)


class WorkerJob:
    """What each job of the array runs: ``ablate worker`` as a child process. Its SIGUSR2 is
    ignored: that signal is submitit's (preemption, time limit), which requeues the job; SLURM's
    SIGTERM then stops the worker cleanly."""

    def __init__(self, command: list[str]):
        self.command = command

    def __call__(self, index: int) -> int:
        code = subprocess.call(self.command, preexec_fn=_ignore_requeue_signal)
        if code not in (0, 1, 130):  # 1: trials failed (said in the log); 130: stopped
            raise RuntimeError(f"ablate worker exited with status {code} (its lines are above)")
        return code

    def checkpoint(self, index: int) -> Any:
        """Requeued as it is (submitit calls this when the job is preempted or times out): the
        store holds the work, the worker none."""
        from submitit.helpers import DelayedSubmission

        return DelayedSubmission(self, index)


def _ignore_requeue_signal() -> None:
    signal.signal(signal.SIGUSR2, signal.SIG_IGN)


def submit(study: Study, stores: Stores, workers: int, settings: SlurmSpec, command: list[str]) -> list[str]:
    """Submit ``workers`` jobs running ``command`` (one array), record them and print their ids."""
    import submitit

    folder = stores.output_dir / "slurm"
    extra: dict[str, Any] = {"requeue": True}  # a job on a failed node goes back to the queue
    for line in settings.sbatch:
        key, _, value = line.removeprefix("#SBATCH").strip().removeprefix("--").partition("=")
        extra[key] = value or True
    chosen = {key: getattr(settings, key) for key in ("partition", "mem", "cpus_per_task", "gpus_per_task")}
    chosen["account"] = settings.account
    try:
        executor = submitit.SlurmExecutor(folder=folder / "%j", max_num_timeout=MAX_REQUEUES)
        executor.update_parameters(
            job_name=f"ablate-{study.name}",
            time=settings.time,
            setup=settings.setup,
            array_parallelism=workers,
            additional_parameters=extra,
            **{key: value for key, value in chosen.items() if value is not None},
        )
        jobs = executor.map_array(WorkerJob(command), range(workers))
    except (RuntimeError, OSError) as exc:  # no srun / sbatch here; sbatch refused the request
        raise AblateError(f"SLURM did not take the jobs: {first_line(exc)}") from None
    record(stores.output_dir, [(job.job_id, str(job.paths.stdout), str(job.paths.stderr)) for job in jobs])
    ids = [job.job_id for job in jobs]
    out.print(f"submitted {len(ids)} SLURM job(s): {' '.join(ids)}", markup=False, highlight=False)
    err.print(
        f"logs: {folder}/<job>/; `ablate status {study.path}` shows them", markup=False, highlight=False
    )
    return ids


def record(output_dir: Path, jobs: list[tuple[str, str, str]]) -> None:
    """Add a submission's jobs (id, stdout, stderr) to ``slurm/jobs.json``."""
    path = output_dir / JOBS_FILE
    held = recorded(output_dir)
    when = datetime.now(UTC).isoformat(timespec="seconds")
    held += [{"id": i, "log": o, "errors": e, "submitted": when} for i, o, e in jobs]
    path.parent.mkdir(parents=True, exist_ok=True)
    temporary = path.with_suffix(".tmp")
    temporary.write_text(json.dumps({"jobs": held}, indent=1))
    temporary.replace(path)


def recorded(output_dir: Path) -> list[dict[str, str]]:
    path = output_dir / JOBS_FILE
    try:
        return list(json.loads(path.read_text())["jobs"])
    except FileNotFoundError:
        return []
    except (ValueError, KeyError, TypeError, OSError) as exc:
        raise AblateError(f"{path}: not a list of SLURM jobs ablate wrote: {first_line(exc)}") from None


def states(ids: list[str]) -> dict[str, str]:
    """Each job's state as SLURM has it: squeue while the controller holds the job (its
    MinJobAge after the end), then sacct where accounting is kept; else ``ENDED``."""
    found: dict[str, str] = {}
    for array in dict.fromkeys(i.split("_")[0] for i in ids):  # one query per submission
        listed = _ask(["squeue", "-h", "-r", "-t", "all", "-j", array, "-o", "%i|%T"])
        found.update(line.split("|", 1) for line in listed if "|" in line)
    missing = [i for i in ids if i not in found]
    if missing:
        kept = _ask(["sacct", "-n", "-P", "-X", "-o", "JobID,State", "-j", ",".join(missing)])
        found.update((j, s.split()[0]) for j, s in (line.split("|", 1) for line in kept if "|" in line) if s)
    return {i: found.get(i, "ENDED") for i in ids}


def _ask(command: list[str]) -> list[str]:
    """A SLURM query's lines; none where it failed (a job id the controller forgot, no accounting)."""
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired):
        return []
    return done.stdout.splitlines() if done.returncode == 0 else []


def cancel(ids: list[str]) -> list[str]:
    """Cancel those of ``ids`` still queued or running (their workers stop cleanly); returns them."""
    live = [i for i, state in states(ids).items() if state in ACTIVE]
    if live:
        try:
            subprocess.run(["scancel", *live], capture_output=True, timeout=60, check=True)
        except (OSError, subprocess.SubprocessError) as exc:
            raise AblateError(f"scancel failed: {first_line(exc)}") from None
    return live


def start_jobs(
    study: Study,
    stores: Stores,
    workers: int,
    settings: SlurmSpec,
    retry_failed: bool = False,
    donors: Donors | None = None,
) -> list[str]:
    """The study's jobs: those an earlier ``ablate run`` submitted for this output folder while
    they are still queued or at work (the shell that followed them was lost: they are followed,
    not doubled), else a new array, its stores and queues made once before any job opens them."""
    from ablate.commands.workers import worker_command
    from ablate.drive import prepare

    earlier = [job["id"] for job in recorded(stores.output_dir)]
    live = [i for i, state in states(earlier).items() if state in ACTIVE] if earlier else []
    if live:
        err.print(f"following {len(live)} SLURM job(s) submitted before: {' '.join(live)}", markup=False)
        return live
    prepare(study, stores)
    return submit(study, stores, workers, settings, worker_command(study, stores, retry_failed, donors))


def run_jobs(
    study: Study,
    stores: Stores,
    workers: int,
    quiet: bool,
    settings: SlurmSpec,
    retry_failed: bool = False,
    donors: Donors | None = None,
    submitted: list[str] | None = None,
) -> tuple[int, list[tuple[str, int, str]]]:
    """Submit the workers (:func:`start_jobs`; ``submitted``: jobs already started), follow the
    study in its store until every job has ended (Ctrl-C or a stop cancels them); the trials
    complete before, and the failures standing in the study."""
    from ablate import stopping
    from ablate.commands.progress import StoreWatch
    from ablate.commands.workers import standing_failures
    from ablate.drive import progress

    with progress_bars(quiet) as bars:
        watch = StoreWatch(study, stores, bars, quiet, workers)
        ids = submitted or start_jobs(study, stores, workers, settings, retry_failed, donors)
        try:
            while any(state in ACTIVE for state in states(ids).values()):
                stopping.sleep(POLL_S)
                watch.poll()
            watch.poll()
        except BaseException:
            stopped = cancel(ids)
            err.print(f"cancelled {len(stopped)} SLURM job(s)", markup=False, highlight=False)
            raise
    left = sum(r.left + r.running for r in progress(study, stores).values())
    if left:
        ended = ", ".join(f"{i} {s}" for i, s in states(ids).items())
        raise RunFailed(
            f"the SLURM jobs ended ({ended}) with {left} trial(s) left; their logs are in "
            f"{stores.output_dir / 'slurm'}; run the study again to resume"
        )
    return watch.before, standing_failures(study, stores)


def show_jobs(output_dir: Path) -> None:
    """``ablate status``'s lines of the study's SLURM jobs: id, state, log."""
    jobs = recorded(output_dir)
    if not jobs:
        return
    now = states([job["id"] for job in jobs])
    for job in jobs:
        line = f"job {job['id']}: {now[job['id']]}  log {job['log']}"
        out.print(line, markup=False, highlight=False, soft_wrap=True)


def cancel_command(study_file: StudyArg, overrides: OverridesArg = None, output: OutputOpt = None) -> None:
    """Cancel the SLURM jobs `ablate run --launcher slurm` submitted for a study; their trials
    in flight are queued again for the next run."""
    from ablate.drive import Stores
    from ablate.study.ladder import one_rung
    from ablate.study.load import load_study
    from ablate.study.several import each_study

    study = load_study(study_file, check_files=False, overrides=overrides or ())
    one_rung(study, "ablate cancel")
    for each, where in each_study(study, output):  # several data sets: each data set's jobs
        output_dir = Stores.for_study(each, where).output_dir
        jobs = [job["id"] for job in recorded(output_dir)]
        if not jobs:
            out.print(f"{each.name}: no SLURM jobs recorded in {output_dir / JOBS_FILE}", markup=False)
            continue
        stopped = cancel(jobs)
        out.print(
            f"{each.name}: cancelled {len(stopped)} of {len(jobs)} SLURM job(s) {' '.join(stopped)}".strip()
        )

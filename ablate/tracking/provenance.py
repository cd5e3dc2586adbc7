"""What produced a run, and the conditions under which its numbers reproduce bit for bit.

Two kinds of record, both MLflow tags (:func:`provenance`): the code (the ablate version, the
study repository's commit and whether it had uncommitted changes), and the machine's conditions
(:func:`conditions`): torch's version and build (BLAS / LAPACK, oneDNN), the CPU's model and the
instruction set torch's kernels use, the intra-op and inter-op thread counts and the threading
variables of the environment, the determinism settings, which fast paths ran (the fused kernels
compiled for this CPU, fbgemm's jagged kernels), CUDA where a trial ran on a GPU, and Python and
the platform. Float rounding depends on each of them; a trial run twice under the same ones ends
bit-identical (``tests/test_determinism.py``).

:func:`pin_threads` sets the thread count a study asks for (``train.threads``) before it trains.
"""

from __future__ import annotations

import os
import platform
import re
import subprocess
from functools import cache
from importlib import metadata
from pathlib import Path

PREFIX = "ablate.env."  # the tags of :func:`conditions`
PROVENANCE_TAGS = ("ablate.version", "ablate.git_commit", "ablate.git_dirty")  # the code's tags
THREAD_VARIABLES = ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OMP_WAIT_POLICY", "KMP_BLOCKTIME", "OMP_DYNAMIC")
GIT_TIMEOUT_S = 5

# The conditions the report's Methods names, in order, with their labels; the rest are recorded only.
LABELS = {
    "torch": "torch",
    "blas": "BLAS / LAPACK",
    "cpu": "CPU",
    "cpu_capability": "CPU kernels",
    "threads": "threads (intra-op / inter-op)",
    "thread_env": "threading variables",
    "deterministic": "deterministic algorithms",
    "fast_paths": "fast paths",
    "cuda": "CUDA",
    "python": "Python",
    "platform": "platform",
}


def pin_threads(threads: int | None) -> None:
    """Torch's intra-op thread count for the trials: ``threads``, or None to leave torch's own
    choice (every core, or ``OMP_NUM_THREADS``)."""
    import torch

    if threads is not None and torch.get_num_threads() != threads:
        torch.set_num_threads(threads)


@cache
def cpu_model() -> str:
    """The CPU's model name as the kernel reports it (``AMD EPYC``), else the platform's guess."""
    try:
        text = Path("/proc/cpuinfo").read_text(errors="replace")
    except OSError:
        text = ""
    found = re.search(r"^model name\s*:\s*(.+)$", text, re.MULTILINE)
    return (found.group(1).strip() if found else platform.processor()) or platform.machine()


def _build_info() -> dict[str, str]:
    """``BLAS_INFO`` and friends of ``torch.__config__.show()``."""
    import torch

    shown = torch.__config__.show()
    settings = dict(re.findall(r"(\w+)=([^,\n]*)", shown))
    mkl = re.search(r"Math Kernel Library Version ([\w.-]+)", shown)
    onednn = re.search(r"MKL-DNN (v[\w.]+)", shown)
    blas = settings.get("BLAS_INFO", "unknown")
    lapack = settings.get("LAPACK_INFO", "unknown")
    text = f"{blas}{f' {mkl.group(1)}' if mkl and blas == 'mkl' else ''} / {lapack}"
    return {"blas": text + (f"; oneDNN {onednn.group(1)}" if onednn else "")}


def conditions(device: str = "cpu", compiled: str = "off") -> dict[str, str]:
    """This process's conditions as tags (``ablate.env.<name>``): see the module's note.
    ``device``: where the trials train (``cuda`` adds the GPU, CUDA and cuDNN); ``compiled``: the
    study's ``train.compile``, said with the fast paths where it is on."""
    import torch

    from ablate import fastpaths

    found = {
        "torch": torch.__version__,
        **_build_info(),
        "cpu": f"{cpu_model()} ({os.cpu_count()} logical cores)",
        "cpu_capability": torch.backends.cpu.get_cpu_capability(),
        "threads": f"{torch.get_num_threads()} / {torch.get_num_interop_threads()}",
        "thread_env": _thread_env(),
        "deterministic": str(torch.are_deterministic_algorithms_enabled()).lower(),
        "fast_paths": ", ".join(f"{p}={'on' if fastpaths.enabled(p) else 'off'}" for p in fastpaths.PATHS)
        + f"; fused kernels {'built' if _kernels_built() else 'not built (torch forms)'}; {_fbgemm()}"
        + ("" if compiled == "off" else f"; step forward compiled (train.compile: {compiled})"),
        "python": platform.python_version(),
        "platform": platform.platform(),
    }
    if device.startswith("cuda") and torch.cuda.is_available():
        name = torch.cuda.get_device_name()
        cudnn = torch.backends.cudnn.version()
        found["cuda"] = (
            f"{name}; CUDA {torch.version.cuda}; cuDNN {cudnn}; TF32 matmul "
            + str(torch.backends.cuda.matmul.allow_tf32).lower()
        )
    return {PREFIX + key: value for key, value in found.items()}


def _thread_env() -> str:
    """The threading variables set, and whether OpenMP read ablate's wait policy (torch loaded after it)."""
    import ablate

    said = ", ".join(f"{v}={os.environ[v]}" for v in THREAD_VARIABLES if v in os.environ) or "none set"
    return said if ablate.WAIT_POLICY_SET else f"{said} (torch was loaded before ablate set OMP_WAIT_POLICY)"


def _fbgemm() -> str:
    """Which fbgemm-gpu distribution is installed (found without importing it: that takes seconds)."""
    for name in ("fbgemm-gpu-cpu", "fbgemm-gpu", "fbgemm-gpu-nightly-cpu", "fbgemm-gpu-nightly"):
        try:
            return f"{name} {metadata.version(name)}"
        except metadata.PackageNotFoundError:
            continue
    return "no fbgemm-gpu (torch's jagged forms)"


def _kernels_built() -> bool:
    """Whether the fused kernels' library is (or can be) loaded: built for this CPU (-march=native)."""
    from ablate import kernels

    return kernels.library() is not None


def described(tags: dict[str, str]) -> list[tuple[str, str]]:
    """(label, value) of the recorded conditions in ``tags`` (``ablate.env.*``), in
    :data:`LABELS` order: what the report's Methods lists."""
    return [(label, tags[PREFIX + key]) for key, label in LABELS.items() if PREFIX + key in tags]


def _git(folder: Path, *args: str) -> str | None:
    """``git -C folder args`` output, or None (no git, not a repository, too slow)."""
    try:
        done = subprocess.run(
            ["git", "-C", str(folder), *args],
            capture_output=True,
            text=True,
            timeout=GIT_TIMEOUT_S,
            env={**os.environ, "GIT_OPTIONAL_LOCKS": "0"},  # `status` leaves the index to the user's git
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return done.stdout.strip() if done.returncode == 0 else None


def provenance(study_file: Path, device: str = "cpu", compiled: str = "off") -> dict[str, str]:
    """Tags naming what produced a run: the ablate version and, where the study file lives in a
    git repository, its commit and whether tracked files (or the study file, untracked) differ;
    and this process's :func:`conditions`."""
    import ablate  # the package is initialised before any of its modules: no upward dependency

    version, commit_tag, dirty_tag = PROVENANCE_TAGS
    tags = {version: ablate.__version__}
    folder = study_file.parent
    commit = _git(folder, "rev-parse", "HEAD")
    if commit:
        tags[commit_tag] = commit
        changed = _git(folder, "status", "--porcelain", "--untracked-files=no")
        tracked = _git(folder, "ls-files", "--", study_file.name)
        if changed is not None and tracked is not None:
            tags[dirty_tag] = "true" if changed or not tracked else "false"
    return {**tags, **conditions(device, compiled)}

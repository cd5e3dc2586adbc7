"""Which final trials a worker trains as one pack (:mod:`ablate.training.packed`): how many
(``train.pack``), and the queued seeds of the variant it just took that join it.

``off`` never packs; a number packs up to that many anywhere (members' steps stacked on a GPU,
:mod:`ablate.training.stacked`; members step at once on a CPU with several torch threads, one
single-threaded stream each; they take turns elsewhere: exact, but no faster). ``auto`` is the
driver's choice: on a GPU the size measured fastest for the variant's model
(:mod:`ablate.training.packsize`, once per variant and worker); on the CPU 1, since the idle
side-by-side (issue 57, benchmarks/RESULTS.md "Packed trials on the CPU") gained 1.08× for two
SASRec ML-1M seeds at the study's micro_batches 4, and stacking ran 0.75–0.89× a trial alone.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

import optuna
import torch
from optuna.trial import FrozenTrial, TrialState

from ablate.drive.ledger import Key, drop_reason, key_of
from ablate.drive.queue import Queue
from ablate.study.load import Study

# The run tag a packed trial carries: the seeds trained in its pack, its own among them.
PACK_TAG = "ablate.packed_with"


def pack_size(
    study: Study, device: torch.device, measure: Callable[[], int | None] | None = None
) -> int | None:
    """How many final trials of one variant a worker trains at once (``train.pack``); ``measure``:
    the size measured on this worker's GPU (what ``auto`` takes there; None: not measured yet)."""
    pack = study.spec.train.pack
    if pack == "off":
        return 1
    if pack == "auto":
        return measure() if measure is not None and device.type == "cuda" else 1
    return int(pack)


def claim_mates(
    study: Study,
    size: int,
    queue: Queue,
    taken: optuna.Trial,
    planned: list[Key],
    worker: str,
    seen: Mapping[Key | None, list[FrozenTrial]],
) -> list[optuna.Trial]:
    """Queued final trials of ``taken``'s variant claimed for its pack, up to ``size`` in all
    (:func:`pack_size`), each as wanted as ``taken`` (:func:`~.ledger.drop_reason`) and marked as
    ``worker``'s. A task that trains its own model (``function``) never packs. The candidates are
    the waiting trials of the worker's last read of the queue by key (``seen``), not a new read
    (a take costs the same at any queue size, issue 56): one another worker took since fails its
    claim."""
    count = size - 1
    if count < 1 or study.task.runs_trials:
        return []
    variant = taken.user_attrs.get("variant")
    ours = [t for key, trials in seen.items() if key is not None and key[0] == variant for t in trials]
    mates: list[optuna.Trial] = []
    for candidate in sorted(ours, key=lambda t: t.number):
        if len(mates) >= count:
            break
        key = key_of(candidate)
        if candidate.state != TrialState.WAITING or candidate.number == taken.number:
            continue
        if drop_reason(seen[key], candidate.number, key, planned):
            continue
        trial = queue.claim(candidate)
        if trial is not None:
            trial.set_user_attr("worker", worker)
            mates.append(trial)
    return mates

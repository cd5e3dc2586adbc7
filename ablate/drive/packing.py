"""Which final trials a worker trains as one pack (:mod:`ablate.training.packed`): how many
(``train.pack``), and the queued seeds of the variant it just took that join it.

``auto`` packs where packing measures faster: on the CPU with several torch threads, as many
seeds as there are threads, each member stepping in a single-threaded stream of its own
(benchmarks/RESULTS.md, "Packed trials on the CPU"); on a GPU the members would only take turns,
so ``auto`` trains each trial alone there. ``off`` never packs; a number packs up to that many
anywhere (members take turns where they cannot step at once: exact, no faster).
"""

from __future__ import annotations

import optuna
import torch
from optuna.trial import TrialState

from ablate.drive.ledger import Key, Queue, drop_reason, key_of
from ablate.study.load import Study

# The run tag a packed trial carries: the seeds trained in its pack, its own among them.
PACK_TAG = "ablate.packed_with"


def pack_size(study: Study, device: torch.device) -> int:
    """How many final trials of one variant a worker trains at once (``train.pack``)."""
    pack = study.spec.train.pack
    if pack == "off":
        return 1
    if pack == "auto":
        threads = torch.get_num_threads()
        return threads if device.type == "cpu" and threads > 1 else 1
    return int(pack)


def claim_mates(
    study: Study, device: torch.device, queue: Queue, taken: optuna.Trial, planned: list[Key], worker: str
) -> list[optuna.Trial]:
    """Queued final trials of ``taken``'s variant claimed for its pack, up to :func:`pack_size` in
    all, each as wanted as ``taken`` (:func:`~.ledger.drop_reason`) and marked as ``worker``'s. A
    task that trains its own model (``function``) never packs."""
    count = pack_size(study, device) - 1
    if count < 1 or study.task.runs_trials:
        return []
    variant = taken.user_attrs.get("variant")
    trials = queue.trials()
    mates: list[optuna.Trial] = []
    for candidate in trials:
        if len(mates) >= count:
            break
        key = key_of(candidate)
        if candidate.state != TrialState.WAITING or key is None or key[0] != variant:
            continue
        if candidate.number == taken.number or drop_reason(trials, candidate.number, key, planned):
            continue
        trial = queue.claim(candidate)
        if trial is not None:
            trial.set_user_attr("worker", worker)
            mates.append(trial)
    return mates

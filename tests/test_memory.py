"""ablate.training.memory: the objects alive before a study's trials are left out of each trial's collection
while they run, and handed back after; garbage the trials make is still collected."""

from __future__ import annotations

import gc
import subprocess
import sys
import weakref

from ablate.training.memory import frozen_before_trials


class _Node:
    pass


def test_objects_alive_before_the_trials_are_frozen_while_they_run_and_handed_back():
    before = gc.get_freeze_count()
    with frozen_before_trials():
        assert gc.get_freeze_count() > 0
        cycle = _Node()
        cycle.me = cycle  # a trial's cyclic garbage: only the collector frees it
        gone = weakref.ref(cycle)
        del cycle
        gc.collect()
        assert gone() is None
    assert gc.get_freeze_count() == before == 0


def test_handed_back_when_a_trial_raises():
    try:
        with frozen_before_trials():
            raise KeyboardInterrupt
    except KeyboardInterrupt:
        pass
    assert gc.get_freeze_count() == 0


def test_torch_dynamo_is_frozen_with_the_rest_only_where_the_trials_train_here():
    """torch's optimizers import torch._dynamo at their first use: where the trials train in this
    process it is imported before the freeze (left out, it cost each trial's collection 0.1 s);
    where a task's own code trains in a child, the worker never needs it."""
    probe = (
        "import sys, gc\n"
        "from ablate.training.memory import frozen_before_trials\n"
        "for here in (False, True):\n"
        "    with frozen_before_trials(trains_here=here):\n"
        "        print('torch._dynamo' in sys.modules, len(gc.get_objects()) < gc.get_freeze_count())\n"
    )
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True)
    assert out.returncode == 0 and out.stdout.split() == ["False", "True", "True", "True"], out.stderr[-2000:]

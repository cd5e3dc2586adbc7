"""ablate.training.memory: the objects alive before a study's trials are left out of each trial's collection
while they run, and handed back after; garbage the trials make is still collected."""

from __future__ import annotations

import gc
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

"""A trial's curve points (its per-epoch or per-report metrics) sent to MLflow in batches: at most
one request every :data:`CURVE_EVERY_S` seconds from the run's start, and whatever is left with
the trial's final numbers (or its failure).

A request per report was most of what a tracking server spent on a short trial (issue 56: a
``function`` trial reporting 20 values made 22 ``log-batch`` requests); an epoch longer than the
interval is still sent as it ends, so the MLflow UI follows a long trial as before. Points a worker
killed with ``kill -9`` never sent belong to a run that is marked killed and trained again, which
logs its whole curve (a resumed trial replays its earlier epochs)."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator

from mlflow.entities import Metric

# How often one run's buffered curve points are sent, at most (a trial's end sends the rest).
CURVE_EVERY_S = 5.0
# MLflow's limit on the metrics of one log_batch request.
METRICS_PER_BATCH = 1000


def in_batches(metrics: list[Metric]) -> Iterator[list[Metric]]:
    """``metrics`` cut into requests MLflow accepts (at least one, possibly empty)."""
    yield metrics[:METRICS_PER_BATCH]
    for start in range(METRICS_PER_BATCH, len(metrics), METRICS_PER_BATCH):
        yield metrics[start : start + METRICS_PER_BATCH]


class Curves:
    """Each run's curve points not sent yet; ``send(run_id, metrics)`` sends one batch."""

    def __init__(self, send: Callable[[str, list[Metric]], None], every_s: float = CURVE_EVERY_S):
        self.send, self.every_s = send, every_s
        self.pending: dict[str, list[Metric]] = {}
        self.sent_at: dict[str, float] = {}
        self.lock = threading.Lock()  # packed members and a task's reporter may log from threads

    def opened(self, run_id: str) -> None:
        """A run just made: its first points wait the interval too (a short trial's whole curve
        goes with its end)."""
        with self.lock:
            self.sent_at[run_id] = time.monotonic()

    def add(self, run_id: str, metrics: list[Metric]) -> None:
        """Keep ``metrics`` for ``run_id``; send its points if none were sent in the interval (a run
        not :meth:`opened` here sends its first at once)."""
        with self.lock:
            self.pending.setdefault(run_id, []).extend(metrics)
            now = time.monotonic()
            due = now - self.sent_at.get(run_id, -float("inf")) >= self.every_s
            batch = self.pending.pop(run_id) if due else []
            if due:
                self.sent_at[run_id] = now
        for chunk in in_batches(batch) if batch else ():
            self.send(run_id, chunk)

    def take(self, run_id: str) -> list[Metric]:
        """``run_id``'s points not sent yet, handed to the caller (its final request), forgotten here."""
        with self.lock:
            self.sent_at.pop(run_id, None)
            return self.pending.pop(run_id, [])

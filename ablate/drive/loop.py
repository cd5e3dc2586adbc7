"""A research loop's folder: the gate's settings (``loop.yaml``), its ledger (``ledger.jsonl``: every
candidate queued, taken up and decided, appended and synced line by line), its lock, and each
configuration's trials (``runs/<key>/``, :mod:`.gate_trials`).

``Loop.try_change`` queues a candidate and decides the queue in order, one at a time under the
folder's lock. Killed at any point (kill -9), the next call finds the candidate taken up and not
decided and decides it first, from the same key, overrides and level: the seeds its trials finished
are read back from the store, the one in flight trains again, none counts twice. A failure is a
decision (``failed``) and never moves the incumbent.
"""

from __future__ import annotations

import fcntl
import json
import os
import uuid
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from ablate.drive.gate_trials import LoopTrainer, configuration_key, resolve
from ablate.errors import AblateError, parse_json
from ablate.faults import fault_point
from ablate.schema import Strict
from ablate.stats.gate import Gate, GateDecision, GateSettings, Outcome

LOOP_FILE, LEDGER, LOCK = "loop.yaml", "ledger.jsonl", "lock"


class LoopSpec(Strict):
    """``loop.yaml``: the loop's identity, its study file and starting overrides, and its rules."""

    id: str
    study: str  # the study file (absolute) each configuration is a set of overrides of
    start: list[str] = []  # the first incumbent's overrides
    metric: str  # the primary metric, as the study file names it
    gate: GateSettings


@dataclass(frozen=True)
class Queued:
    number: int
    description: str
    overrides: list[str]  # the change, applied over the incumbent's overrides when taken up
    simpler: bool


class Loop:
    """A loop folder, opened; every method reads the ledger afresh (another process may have written)."""

    def __init__(self, folder: str | Path):
        self.folder = Path(folder)
        path = self.folder / LOOP_FILE
        if not path.is_file():
            raise AblateError(
                f"{self.folder}: not a loop folder (no {LOOP_FILE}); make one with `ablate gate init`"
            )
        try:
            self.spec = LoopSpec.model_validate(yaml.safe_load(path.read_text(encoding="utf-8")))
        except (ValidationError, yaml.YAMLError, TypeError) as exc:
            first = str(exc).strip().splitlines()
            raise AblateError(f"{path}: not a loop file ({' '.join(first[:3])})") from None
        self.ledger = self.folder / LEDGER
        events = self._events()
        if not events or events[0].get("loop") != self.spec.id:
            found = events[0].get("loop") if events else None
            raise AblateError(
                f"{self.ledger}: belongs to loop {found!r}, not to this folder's loop {self.spec.id!r} "
                "(a ledger copied from another loop's folder); give each loop its own folder"
            )

    # -- making one ---------------------------------------------------------------------------
    @classmethod
    def init(cls, folder: str | Path, study: str | Path, overrides: Sequence[str] = (), **rules: Any) -> Loop:
        """A new loop over ``study`` (its ``overrides`` the first incumbent) in an empty ``folder``;
        ``rules``: :class:`~ablate.stats.gate.GateSettings` (``margin`` required, in metric units)."""
        folder, study = Path(folder), Path(study).resolve()
        if (folder / LOOP_FILE).exists():
            raise AblateError(f"{folder}: already holds a loop ({LOOP_FILE}); open it, or give a new folder")
        if folder.exists() and any(folder.iterdir()):
            raise AblateError(f"{folder}: not empty and not a loop folder; give a new or empty folder")
        resolved = resolve(study, overrides)  # the study file's problems, before anything is written
        metric = resolved.metrics[0]
        higher = resolved.task.metric_higher_is_better(metric)
        try:
            settings = GateSettings(**{"higher_is_better": higher, **rules})
        except ValidationError as exc:
            error = exc.errors()[0]
            raise AblateError(f"gate setting {'.'.join(map(str, error['loc']))}: {error['msg']}") from None
        spec = LoopSpec(
            id=uuid.uuid4().hex[:12], study=str(study), start=list(overrides), metric=metric, gate=settings
        )
        folder.mkdir(parents=True, exist_ok=True)
        (folder / LOOP_FILE).write_text(yaml.safe_dump(spec.model_dump(), sort_keys=False), encoding="utf-8")
        loop = cls.__new__(cls)
        loop.folder, loop.spec, loop.ledger = folder, spec, folder / LEDGER
        loop._append({"loop": spec.id, "event": "start", "key": configuration_key(resolved)})
        return Loop(folder)

    # -- reading ------------------------------------------------------------------------------
    def _events(self) -> list[dict[str, Any]]:
        """The ledger's events; a last line a crash cut off is left out (the next append replaces it)."""
        if not self.ledger.is_file():
            return []
        lines = self.ledger.read_text(encoding="utf-8").split("\n")
        events = []
        for i, line in enumerate(lines, start=1):
            if not line.strip():
                continue
            try:
                events.append(parse_json(line))
            except json.JSONDecodeError:
                if i == len(lines):  # no newline after it: cut off mid-write
                    break
                raise AblateError(f"{self.ledger}:{i}: not a ledger line (edited by hand?)") from None
        return events

    def _append(self, event: dict[str, Any]) -> None:
        with open(self.ledger, "a+", encoding="utf-8") as f:
            f.seek(0, os.SEEK_END)
            if f.tell():
                f.seek(f.tell() - 1)
                if f.read(1) != "\n":  # a line cut off by a crash: end it, so it is skipped
                    f.write("\n")
            f.write(json.dumps(event, ensure_ascii=False) + "\n")
            f.flush()
            os.fsync(f.fileno())

    def gate(self) -> Gate:
        """The gate as the ledger's decisions leave it."""
        events = self._events()
        decided = [GateDecision.from_dict(e["decision"]) for e in events if e.get("event") == "decided"]
        return Gate(self.spec.gate, events[0]["key"], decided)

    def configurations(self) -> dict[str, list[str]]:
        """Each configuration's key → its overrides (the start and every candidate taken up)."""
        events = self._events()
        found = {events[0]["key"]: list(self.spec.start)}
        for e in events:  # the first spelling of a key stays (a refused "no change" spells the incumbent)
            if e.get("event") == "taken":
                found.setdefault(e["key"], e["overrides"])
        return found

    def history(self) -> list[GateDecision]:
        return self.gate().history

    def queued(self) -> list[Queued]:
        """Candidates queued and not decided, in order."""
        events = self._events()
        done = {e["decision"]["number"] for e in events if e.get("event") == "decided"}
        return [
            Queued(e["number"], e["description"], e["overrides"], e["simpler"])
            for e in events
            if e.get("event") == "queued" and e["number"] not in done
        ]

    def status(self) -> dict[str, Any]:
        gate = self.gate()
        incumbent = gate.incumbent
        changes = [d.description for d in gate.history if d.outcome is Outcome.KEEP]
        return {
            "incumbent": incumbent,
            "incumbent_overrides": self.configurations()[incumbent],
            "kept": changes,
            "candidates": len(gate.history),
            "next_level": gate.next_level(),
            "queued": [q.description for q in self.queued()],
            "paired_seeds": sum(len(d.seeds) for d in gate.history),  # the candidates' seeds
        }

    # -- trying -------------------------------------------------------------------------------
    def try_change(
        self, description: str = "", overrides: Sequence[str] = (), simpler: bool = False
    ) -> list[GateDecision]:
        """Queue a change (none: only resume the queue) and decide every queued candidate in order;
        the decisions made by this call."""
        with self._locked():
            if overrides or description:
                incumbent = self.configurations()[self.gate().incumbent]
                resolve(Path(self.spec.study), [*incumbent, *overrides])  # invalid: one line, nothing queued
                numbers = [e["number"] for e in self._events() if e.get("event") == "queued"]
                self._append(
                    {
                        "event": "queued",
                        "number": max(numbers, default=0) + 1,
                        "description": description or " ".join(overrides),
                        "overrides": list(overrides),
                        "simpler": simpler,
                    }
                )
            return [self._decide(q) for q in self.queued()]

    def _decide(self, queued: Queued) -> GateDecision:
        gate = self.gate()
        taken = [e for e in self._events() if e.get("event") == "taken" and e["number"] == queued.number]
        if taken:  # taken up before a kill: the same configuration again
            key, full = taken[0]["key"], taken[0]["overrides"]
        else:
            full = [*self.configurations()[gate.incumbent], *queued.overrides]
            try:
                key = configuration_key(resolve(Path(self.spec.study), full))
            except AblateError as exc:  # valid when queued, not over the incumbent it meets now
                return self._record(gate, queued, f"does not validate over the incumbent: {exc}")
            self._append({"event": "taken", "number": queued.number, "key": key, "overrides": full})
        trainer = LoopTrainer(self.folder, Path(self.spec.study), self.spec.metric, self.configurations())
        decision = gate.consider(key, trainer, queued.description, queued.simpler)
        fault_point("decide")
        self._append({"event": "decided", "decision": decision.as_dict()})
        return decision

    def _record(self, gate: Gate, queued: Queued, reason: str) -> GateDecision:
        decision = GateDecision(
            len(gate.history) + 1,
            "",
            queued.description,
            Outcome.FAILED,
            reason,
            gate.incumbent,
            queued.simpler,
        )
        self._append({"event": "decided", "decision": decision.as_dict()})
        return decision

    @contextmanager
    def _locked(self) -> Iterator[None]:
        """One ``try`` at a time per loop: the lock dies with its process (kill -9 included)."""
        with open(self.folder / LOCK, "a+", encoding="utf-8") as f:
            try:
                fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                f.seek(0)
                holder = f.read().strip() or "another process"
                raise AblateError(
                    f"{self.folder}: another `ablate gate try` is deciding this loop's queue ({holder}); "
                    "queue again when it is done"
                ) from None
            f.seek(0)
            f.truncate()
            f.write(f"pid {os.getpid()}")
            f.flush()
            try:
                yield
            finally:
                f.truncate(0)
                fcntl.flock(f, fcntl.LOCK_UN)

"""The interface a task plugin (entry-point group ``ablate.task``) implements.

A task owns everything data-shaped: loading and splitting, turning examples into token
batches, the input embedding and output head around the shared backbone, the training
loss, and evaluation. The core owns the backbone, the optimiser loop, tracking and stats.

Dimensions: ``b`` batch, ``n`` tokens, ``d`` model width.
"""

from __future__ import annotations

import errno
import hashlib
import json
import stat
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor, wait
from dataclasses import asdict, dataclass
from functools import cache
from pathlib import Path
from typing import Any, ClassVar, TypeVar

import pandas as pd
import torch
from pydantic import BaseModel, ValidationError
from torch import Tensor, nn

from ablate import stopping
from ablate.cache import file_digest
from ablate.components import BuildContext, Component, Options
from ablate.margins import default_margin
from ablate.schema import errors_again


def untagged(exc: ValidationError, at: tuple, tag: Any) -> ValidationError:
    """``exc`` with the discriminated-union tag pydantic puts after ``at`` removed from each
    error location (``data.synthetic.users`` → ``data.users``)."""
    n = len(at)
    errors = [
        {**e, "loc": e["loc"][:n] + e["loc"][n + 1 :] if e["loc"][: n + 1] == (*at, tag) else e["loc"]}
        for e in exc.errors(include_url=False)
    ]
    return errors_again(exc.title, errors)


Item = TypeVar("Item")
Result = TypeVar("Result")


def cpu_streams(
    work: Callable[[Item], Result], items: Iterable[Item], device: torch.device
) -> Iterator[Result]:
    """``work(item)`` for each item, results in the items' order.

    On a CPU with several torch threads the items go to one Python thread per torch thread,
    each running its ops single-threaded (torch releases the GIL inside ops): at small matrices
    (d = 50, a few thousand rows) two single-threaded streams beat one two-threaded stream
    (benchmarks/seqrec.py) — evaluation batches, and training's micro-batches
    (ablate.training.parts). Grad mode and autocast are thread-local, so the caller's are carried
    into the threads. At most two items per stream are in flight.
    """
    streams = torch.get_num_threads() if torch.device(device).type == "cpu" else 1
    if streams == 1:
        for item in items:
            stopping.check()  # SIGTERM / Ctrl-C stop here, between batches
            yield work(item)
        return
    grad, autocast = torch.is_grad_enabled(), torch.is_autocast_enabled("cpu")
    dtype = torch.get_autocast_dtype("cpu")

    def in_stream(item: Item) -> Result:
        if torch.get_num_threads() != 1:  # this thread's own count (OpenMP's is per thread)
            torch.set_num_threads(1)
        with torch.set_grad_enabled(grad), torch.autocast("cpu", dtype=dtype, enabled=autocast):
            return work(item)

    pending = deque()
    try:
        for item in items:
            pending.append(_stream_pool(streams).submit(in_stream, item))
            if len(pending) >= 2 * streams:
                stopping.check()
                yield pending.popleft().result()
        while pending:
            yield pending.popleft().result()
    finally:  # stopped early: drop what has not started, let what has finish
        for future in pending:
            future.cancel()
        wait(pending)


@cache
def _stream_pool(streams: int) -> ThreadPoolExecutor:
    """One pool per stream count, kept: a fresh pool per batch cost SASRec's training step 7–12%
    (new threads' first ops set up per-thread state; benchmarks/RESULTS.md, session 12). Its
    threads run their ops single-threaded (``cpu_streams``)."""
    return ThreadPoolExecutor(streams, thread_name_prefix="ablate-stream")


class TaskOptions(Options):
    """Options of a task whose ``data`` is a union of formats told apart by ``format``:
    validation errors name ``data.users`` as the study file does, not pydantic's
    ``data.synthetic.users``."""

    @classmethod
    def model_validate(cls, obj: Any, **kwargs: Any):
        try:
            return super().model_validate(obj, **kwargs)
        except ValidationError as exc:
            data = obj.get("data") if isinstance(obj, dict) else None
            raise untagged(exc, ("data",), data.get("format") if isinstance(data, dict) else None) from None


# The key under which a trial of one's own returns its test units' scores (Task.run_trial).
PER_UNIT_KEY = "units"


@dataclass
class Evaluation:
    """Metrics on one split: the summary (metric -> mean) and per-unit values.

    ``per_unit`` has one row per evaluation unit (user, window, row): a ``unit`` column
    and one column per metric. The report's paired tests across units use it.
    """

    summary: dict[str, float]
    per_unit: pd.DataFrame


@dataclass(frozen=True)
class LossPart:
    """A part of a batch's loss that is a mean of its own (e.g. over one micro-batch's targets),
    counting ``share`` of the batch's: training adds the model's auxiliary loss to ``value``
    before weighting, ``(value + auxiliary) · share``, so a batch cut into parts weighs the
    auxiliary loss as the whole batch does."""

    value: Tensor
    share: float


def data_file_problem(path: Path) -> str | None:
    """Why ``path`` cannot be read as data, or None: missing, or neither a regular file nor a
    folder — a FIFO or a device such as ``/dev/zero`` would block or never end, so it is refused
    before it is opened."""
    try:
        mode = path.stat().st_mode
    except FileNotFoundError:
        return f"{'folder' if path.suffix == '' else 'file'} not found: {path}"
    except OSError as exc:  # a symbolic link loop, a folder on the way not readable
        if exc.errno == errno.ELOOP:
            return f"a symbolic link loop (its links never reach a file): {path}"
        return f"cannot be read ({exc.strerror or type(exc).__name__}): {path}"
    if stat.S_ISREG(mode) or stat.S_ISDIR(mode):
        return None
    return f"not a regular file or folder (a pipe, socket or device): {path}"


class TrialReporter:
    """What a task that trains its own model (:meth:`Task.run_trial`) hands its training code:
    where the trial stands and how it tells ablate so. The driver supplies the implementation
    (:mod:`ablate.drive.execution`).

    ``seed``: the trial's seed (the global RNGs are seeded with it already). ``device``: where
    ``train.device`` says to train (``"cpu"``, ``"cuda"``; a ``--gpus`` worker sees its GPU as
    ``cuda``). ``checkpoint_path``: a file path of this trial's own (its folder exists), for tools
    that write their own checkpoints; it belongs to this configuration and seed, survives an
    interrupted run and is removed once the trial ends."""

    seed: int
    device: str
    checkpoint_path: Path

    def report(self, epoch: int, metrics: dict[str, float]) -> None:
        """One epoch's metrics (``{"valid.acc": 0.9, "train.loss": 0.3}``), logged as the trial's
        curves; the primary validation metric (``valid.<primary>``) feeds a search's pruner."""
        raise NotImplementedError

    def should_prune(self) -> bool:
        """Whether a search's pruner has stopped this trial: return (what is returned then is not
        used; the trial is recorded as pruned)."""
        raise NotImplementedError

    def save_state(self, state: dict[str, Any]) -> None:
        """Keep ``state`` (tensors and plain values: a model's and an optimiser's ``state_dict``,
        the epoch) so that a run stopped mid-trial resumes from it; the curves reported so far are
        kept with it."""
        raise NotImplementedError

    def resume_state(self) -> dict[str, Any] | None:
        """The last :meth:`save_state` of this configuration and seed (its curves logged again),
        or None: train from the start."""
        raise NotImplementedError


# The study run's artifact holding the task's trivial baselines and its evaluation protocol
# (:meth:`Task.reference`), so that a report rebuilt from the tracking store shows them.
BASELINES_ARTIFACT = "baselines.json"


@dataclass(frozen=True)
class Baseline:
    """A trivial predictor a task's reports show beside the variants: its ``name``
    (``"popularity"``), how it predicts (``about``, one clause) and its test metrics
    (``values``: metric → the split's value), evaluated on the same test units under the same
    protocol as the variants; deterministic, with no seed."""

    name: str
    about: str
    values: dict[str, float]


class Task:
    """Base class for tasks. Subclasses set ``Options`` and ``LossOptions`` and implement
    the methods below. ``options`` is a validated ``Options`` instance; ``base_dir`` is the
    folder of the study file (relative data paths are resolved against it).

    ``version`` is part of every trial's fingerprint (:func:`ablate.drive.ledger.fingerprint`).
    Bump it when the same options start to give other numbers (data preparation, splits, the
    model around the blocks, the loss, the metrics), so that stores and trial files made before
    stop counting as this task's results. A new option or a changed default needs no bump (a
    fingerprint holds every option's value, the loss's too, defaults filled in), except a task's
    first changed default while it is at version 1: stores made before fingerprints were
    resolved, accepted until then (:func:`ablate.drive.ledger.fingerprints`), hold only the
    options written."""

    Options: ClassVar[type[Options]] = Options
    # A pydantic model (or a discriminated union wrapped in a RootModel) for ``train.loss``.
    LossOptions: ClassVar[type[BaseModel]] = Options
    # Evaluation units have an order / tokens are used causally.
    ordered: ClassVar[bool] = True
    # The version of this task's numbers: bumped when they change (see above).
    version: ClassVar[int] = 1

    def __init__(self, options: Options, base_dir: Path):
        self.options = options
        self.base_dir = base_dir

    @classmethod
    def kind_name(cls) -> str:
        """The entry-point name the registry found this task under."""
        return getattr(cls, "_kind", cls.__name__)

    # -- a task that trains its own model ----------------------------------------------
    @property
    def runs_trials(self) -> bool:
        """Whether this task overrides :meth:`run_trial`: it trains its own model, and ablate's
        backbone, batches, loss and evaluation are not used."""
        return type(self).run_trial is not Task.run_trial

    def run_trial(self, config: dict[str, Any], seed: int, reporter: TrialReporter) -> dict[str, float]:
        """Train and evaluate one (variant, seed) with the variant's free-form ``model.config``;
        returns its final metrics, ``valid.<metric>`` and ``test.<metric>`` for every metric the
        study names, and may return under :data:`PER_UNIT_KEY` the test units' scores (metric →
        {unit id: score}, ``test.<metric>`` their mean) for the report's paired tests across units.
        Overridden only by a task that trains its own model (:attr:`runs_trials`)."""
        raise NotImplementedError

    def options_problem(self) -> tuple[tuple[str | int, ...], str] | None:
        """What makes these options unusable before any data is read (e.g. a callable that does
        not import), as (its key under ``task``, the message); None when nothing does."""
        return None

    def code_source(self) -> str | None:
        """The file of code beyond ablate's own that ``ablate run`` imports (e.g. a training
        script), found without importing it; None (the default): none."""
        return None

    def code_digest(self) -> str | None:
        """The code the trials run beyond ablate's own, by content (e.g. a training script's
        source): part of every trial's fingerprint, so changed code trains again rather than
        reusing trials of the old. None (the default): none."""
        return None

    # -- validation (cheap, no data loading) ------------------------------------------
    def features(self) -> frozenset[str]:
        """Side information the configured data provides, e.g. ``{"timestamps"}``."""
        return frozenset()

    def check_metric(self, name: str) -> str | None:
        """None if ``name`` is a metric this task computes, else a one-line reason."""
        raise NotImplementedError

    def incompatibility(self, slot: str, kind: type[Component], options: Options) -> str | None:
        """Why a ``slot`` component of ``kind`` (with ``options``) would make this task degenerate —
        e.g. a readout token that never sees a feature, so every row gets the same prediction — or
        None. The study loader asks for every component of every variant, after the kind's own
        requirements; a reason fails validation naming the component's key. Default: None."""
        return None

    def data_path(self) -> Path | None:
        """The file or folder the options' ``data.path`` names (relative to the study file's
        folder), or None for data without a path (synthetic)."""
        path = getattr(getattr(self.options, "data", None), "path", None)
        return None if path is None else self.base_dir / Path(path).expanduser()

    def data_files(self) -> dict[str, Path]:
        """Option name → each data file (or folder) the options name; default: ``data.path``."""
        path = self.data_path()
        return {} if path is None else {"path": path}

    def data_digest(self) -> str | None:
        """What the trials train on, by content: a digest of every file :meth:`data_files` names
        (None for data made from the options alone, such as synthetic data, which the fingerprint
        already covers). Recorded with each trial, so a data file changed under finished trials
        is caught before new ones train on it."""
        files = self.data_files()
        if not files:
            return None
        parts = {name: file_digest(path) for name, path in sorted(files.items())}
        return hashlib.sha256(json.dumps(parts, sort_keys=True).encode()).hexdigest()[:16]

    def check_files(self) -> str | None:
        """None if every data file the options name exists, else a one-line reason."""
        path = self.data_path()
        return None if path is None else data_file_problem(path)

    # -- data ------------------------------------------------------------------------
    def load(self) -> Any:
        """Load and split the data (raises ``DataError`` on bad files). Cached by callers."""
        raise NotImplementedError

    def data_summary(self, data: Any) -> dict[str, int | float | str]:
        """What the loaded data holds, label → value, for the report and the study's MLflow run
        (e.g. ``{"users": 6040, "items": 3416, "test units": 6040}``); default: nothing."""
        return {}

    def artifacts(self, data: Any) -> dict[str, bytes | Path]:
        """Files kept with the study's run once the data is loaded: artifact name → its bytes or a
        file to copy (e.g. which source id each index the model uses stands for, so predictions
        can be traced back). The driver stores them under ``data/``; default: none."""
        return {}

    def values_width(self) -> int:
        """Width of the raw value window each token carries in ``TokenContext.values``
        (e.g. a forecast channel's lookback); 0 when tokens carry none."""
        return 0

    def max_len(self, data: Any) -> int:
        """Longest token sequence a batch will hold."""
        raise NotImplementedError

    def train_batches(self, data: Any, batch_size: int, generator: torch.Generator) -> Iterable[Any]:
        """One epoch of shuffled training batches (objects with ``.to(device)``)."""
        raise NotImplementedError

    def batch_tokens(self, batch: Any) -> int:
        """Real (unpadded) tokens in a batch, for the tokens/s cost column."""
        raise NotImplementedError

    # -- model -----------------------------------------------------------------------
    def build_model(self, backbone: nn.Module, ctx: BuildContext, data: Any) -> nn.Module:
        """Wrap the backbone with this task's embedding and head."""
        raise NotImplementedError

    def loss(self, model: nn.Module, batch: Any, loss: BaseModel, generator: torch.Generator) -> Tensor:
        """The batch's training loss, without the components' auxiliary losses: training adds
        those (:meth:`~ablate.components.Component.auxiliary_loss`)."""
        raise NotImplementedError

    @property
    def splits_batches(self) -> bool:
        """Whether this task overrides :meth:`split_batch` (``train.micro_batches`` > 1 allowed)."""
        return type(self).split_batch is not Task.split_batch

    def split_batch(self, model: nn.Module, batch: Any, parts: int) -> list[tuple[Any, float]] | None:
        """``batch`` cut into at most ``parts`` sub-batches, each with its share of the batch's
        loss weight (its :meth:`loss` is a mean of its own; the shares sum to 1), for
        ``train.micro_batches``: training backpropagates ``loss(sub-batch) · share`` per piece,
        the whole batch's mean loss with less padding. None (the default): this task trains whole
        batches only, and a study asking for micro-batches is refused before training."""
        return None

    @torch.no_grad()
    def evaluate(
        self,
        model: nn.Module,
        data: Any,
        split: str,
        metrics: list[str],
        device: torch.device,
        batch_size: int,
    ) -> Evaluation:
        """Metrics on ``split`` (``"valid"`` or ``"test"``), with per-unit values."""
        raise NotImplementedError

    def loss_problem(self, loss: BaseModel, data: Any) -> tuple[tuple[str | int, ...], str] | None:
        """What makes ``train.loss`` unusable with these data (e.g. more sampled negatives than
        items to draw from), as (its key under ``train.loss``, the message); None when nothing
        does. Checked before any training, so that no trial meets it."""
        return None

    def metric_higher_is_better(self, name: str) -> bool:
        return True

    def default_margin(self, name: str) -> float | str | None:
        """The practical margin of metric ``name`` when the study file sets none, in the form
        ``report.margin`` takes (``0.002``; ``"2%"`` of the baseline's mean; ``"2% of error"``,
        of its distance to a perfect score); by default the metric family's
        (:func:`ablate.margins.default_margin`: accuracy-like 2% of error, others 2% of the mean)."""
        return default_margin(name)

    # -- what the report places the variants against ------------------------------------
    def baselines(self, data: Any, metrics: list[str]) -> list[Baseline]:
        """The task's standard trivial baselines (popularity, repeat-last, majority class, a
        linear model, as fits) on the test split: each metric of ``metrics`` computed on the
        same test units under the same protocol as :meth:`evaluate`; default: none."""
        return []

    def protocol(self, metrics: list[str]) -> str:
        """One or two sentences for the report's Methods: how the data are split, what a test
        unit is, how each metric is computed (candidates, ties, scale); default: none."""
        return ""

    def reference(self, data: Any, metrics: list[str]) -> dict[str, Any]:
        """What :data:`BASELINES_ARTIFACT` holds: ``{"protocol": text, "baselines": [{"name",
        "about", "values"}, ...]}`` (:meth:`protocol`, :meth:`baselines`)."""
        found = self.baselines(data, metrics)
        return {"protocol": self.protocol(metrics), "baselines": [asdict(b) for b in found]}

    # -- training schedule -----------------------------------------------------------
    def on_epoch_end(self, model: nn.Module, epoch: int) -> None:
        """Called after each training epoch (1-based), before validation. By default every
        :class:`~ablate.components.Component` in the model gets its ``epoch_end(epoch)`` (e.g.
        ``fr_graph`` freezing its topology after k epochs); a task may override to add its own
        schedule."""
        for module in model.modules():
            if isinstance(module, Component):
                module.epoch_end(epoch)

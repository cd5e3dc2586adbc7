"""The schema of a study file: pydantic models for every section (``task``, ``model``, ``train``,
``metrics``, ``report``, …). Parsing and locating errors is :mod:`ablate.study.file`; resolving
components against the registry and expanding variants is :mod:`ablate.study.load`; the search space
is :mod:`ablate.study.search`.
"""

from __future__ import annotations

import re
from typing import Annotated, Any, ClassVar, Literal

import torch
from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    TypeAdapter,
    ValidatorFunctionWrapHandler,
    WrapValidator,
    field_validator,
    model_validator,
)

from ablate.model.spec import ComponentSpec, ModelSpec, NormSpec  # noqa: F401 - the model: section
from ablate.optim.optimizers import OPTIMIZERS
from ablate.optim.schedules import LR_SCHEDULES
from ablate.registry import COMPONENT_SLOTS
from ablate.schema import Int, Strict
from ablate.stats.sequential import SequentialSeeds
from ablate.stats.settings import LADDER_SCALES, ReportSection, ReportSettings
from ablate.study.search import SearchSpec

BASE = "base"

# Slots whose width knob ``match_params`` may name: every single-component slot (bias is a list).
MatchableSlot = Literal[tuple(slot for slot in COMPONENT_SLOTS if slot != "bias")]


# `train.precision`: ``auto`` resolves by device (bf16 on CUDA, fp32 elsewhere); the others are what
# a trial trains in wherever it runs.
Precision = Literal["auto", "fp32", "bf16"]


def _spelt_off(value: Any) -> Any:
    """``off`` as the option's word: YAML 1.1, which PyYAML reads, takes a bare ``off`` (in a study
    file or a ``key=off`` override) for false."""
    return "off" if value is False else value


# `train.compile`: the training step's forward under torch.compile (ablate.training.compiled): off
# (eager), default (inductor's kernels), reduce-overhead (those replayed as CUDA graphs; CUDA only:
# elsewhere as default).
Compile = Annotated[Literal["off", "default", "reduce-overhead"], BeforeValidator(_spelt_off)]


# `train.pack`: seeds of a variant trained as one pack (ablate.training.packed): ``auto`` lets the
# driver choose (ablate.drive.packing), ``off`` trains each alone, a number packs up to that many.
def _pack(value: Any) -> Any:
    value = _spelt_off(value)
    if value in ("auto", "off") or (type(value) is int and value >= 1):
        return value
    raise ValueError(f"expected auto, off or a number of trials ≥ 1, got {value!r}")


Pack = Annotated[Literal["auto", "off"] | int, BeforeValidator(_pack)]


class TaskSpec(BaseModel):
    model_config = ConfigDict(extra="allow")
    kind: str


class VarySpec(Strict):
    """``train.vary``: which sources of training randomness change from seed to seed
    (Bouthillier et al. 2021). A source that does not vary draws from seed 0 in every trial, so
    the spread across seeds is the varying sources' alone. All vary by default, drawn from one
    stream per seed: training exactly as before the option existed."""

    init: bool = True  # the weights' initialisation
    order: bool = True  # the task's generator: batch order, sampled negatives
    dropout: bool = True  # the global RNG during training: dropout masks, other draws in forward

    @property
    def everything(self) -> bool:
        return self.init and self.order and self.dropout


class ParamGroupSpec(Strict):
    """One ``train.param_groups`` entry: the parameters whose dotted name matches ``params`` (a
    regular expression, searched) train with their own learning rate and/or weight decay (e.g.
    T2G-Former's column embeddings at lr 0.01, no decay on norms and biases)."""

    params: str
    lr: float | None = Field(None, gt=0, allow_inf_nan=False)  # None: train.lr (a schedule scales it alike)
    weight_decay: float | None = Field(None, ge=0, allow_inf_nan=False)  # None: train.weight_decay

    @field_validator("params")
    @classmethod
    def _pattern(cls, v: str) -> str:
        try:
            re.compile(v)
        except re.error as exc:
            raise ValueError(f"not a regular expression: {exc}") from exc
        return v


class SecondStageSpec(Strict):
    """``train.second_stage``: once the first stage early-stops, every component's
    ``stage_end`` hook runs (``fr_graph`` freezes its topology) and training goes on with a fresh
    patience until it early-stops again, within ``train.epochs`` in all (T2G-Former's schedule).
    The result is the best validation epoch of both stages; the optimiser, its moments and the
    learning-rate schedule carry on."""

    # Evaluations without improvement that end the second stage; None: train.patience.
    patience: int | None = Field(None, gt=0)
    # The weights the second stage starts from: the first stage's best (``best``) or its last
    # (``last``: T2G-Former's released code, which continues from where early stopping struck).
    start: Literal["best", "last"] = "best"


Beta = Annotated[float, Field(ge=0.0, lt=1.0)]


class TrainSpec(Strict):
    epochs: int = Field(20, gt=0)
    batch_size: int = Field(128, gt=0)
    # Rows per evaluation forward; unset: 64 on CPU, where each torch thread evaluates its own
    # batches (ablate.tasks.cpu_streams) and 64 rows of a d ≈ 50 model stay in a core's
    # cache, 512 on a GPU. ML-1M full ranking: 0.98–1.22× (median ≈ 1.13×) as fast as one
    # two-threaded stream of 128 rows, 1.05–1.6× of 512 (benchmarks/RESULTS.md, session 8).
    eval_batch_size: int | None = Field(None, gt=0)
    lr: float = Field(1e-3, gt=0, allow_inf_nan=False)
    weight_decay: float = Field(0.0, ge=0, allow_inf_nan=False)
    optimizer: OPTIMIZERS.field = "adam"
    # Adam's decay rates of its moment estimates, each in [0, 1).
    betas: tuple[Beta, Beta] = (0.9, 0.98)
    grad_clip: float | None = Field(None, gt=0, allow_inf_nan=False)
    # Stop when the primary validation metric has not improved for this many evaluations.
    patience: int | None = Field(None, gt=0)
    eval_every: int = Field(1, gt=0)
    loss: dict[str, Any] = {}
    device: str = "auto"
    # torch's intra-op threads per trial; unset: torch's own count (every core, or OMP_NUM_THREADS).
    # The float rounding of matrix products depends on it: a study pins it to reproduce bit for bit.
    threads: int | None = Field(None, ge=1)
    # Training steps under bf16 autocast (weights and optimizer stay fp32; evaluation is fp32):
    # ``auto`` = bf16 on CUDA, fp32 elsewhere; ``bf16`` on CPU uses AMX / AVX-512-BF16 if present.
    precision: Precision = "auto"
    # Sources of randomness that vary with the seed (the rest use seed 0 in every trial).
    vary: VarySpec = VarySpec()
    # Per-epoch learning-rate factor (ablate.optim.schedules.LR_SCHEDULES): constant, type1 (halved each
    # epoch from the third on, Time-Series-Library's), cosine (to 0 at `epochs`).
    lr_schedule: LR_SCHEDULES.field = "constant"
    # Parameters (by name pattern) with their own lr / weight decay; the first match wins.
    param_groups: list[ParamGroupSpec] = []
    # Train again after early stopping, with each component's stage_end hook run first.
    second_stage: SecondStageSpec | None = None
    # Each training batch cut by the task into this many parts (seqrec: rows sorted by length,
    # each group padded to its own longest row), each part's mean loss weighted by its share and
    # backpropagated before the next part's forward, then one optimiser step: the whole batch's
    # mean loss with less padding, one part's graph held at a time, parts in parallel CPU streams.
    micro_batches: int = Field(1, ge=1)
    # The training step's forward under torch.compile (ablate.training.compiled): how a step runs, not
    # what it computes (the same dropout draws on the CPU, float rounding moved ≤ 1e-6), so left out of
    # fingerprints like threads and pack (a study resumed with it switched keeps its trials); each
    # run's conditions record it (ablate.tracking.provenance).
    compile: Compile = "off"
    # Final trials of a variant trained together in one process, each exactly as alone; not part
    # of what a trial trains (its fingerprint leaves it out).
    pack: Pack = "auto"

    # Options added after stores existed: a study that leaves them at their defaults trains as
    # before they existed, so its trials' fingerprints leave them out and old stores resume.
    LATER_OPTIONS: ClassVar[tuple[str, ...]] = (
        "lr_schedule",
        "param_groups",
        "second_stage",
        "micro_batches",
        "compile",
    )
    ADDED_LATER: ClassVar[dict[str, Any]] = {"compile": "off"}

    def later_options_at_default(self) -> set[str]:
        """The :attr:`LATER_OPTIONS` a fingerprint may leave out."""
        fields = type(self).model_fields
        return {name for name in self.LATER_OPTIONS if getattr(self, name) == fields[name].get_default()}

    def eval_rows(self, device: torch.device) -> int:
        """Rows per evaluation forward on ``device``."""
        if self.eval_batch_size is not None:
            return self.eval_batch_size
        return 64 if torch.device(device).type == "cpu" else 512

    @field_validator("device")
    @classmethod
    def _device(cls, v: str) -> str:
        if v not in ("auto", "cpu") and not re.fullmatch(r"cuda(:\d+)?|mps", v):
            raise ValueError("expected 'auto', 'cpu', 'cuda', 'cuda:N' or 'mps'")
        return v

    @model_validator(mode="after")
    def _stages(self) -> TrainSpec:
        if self.second_stage is not None and self.patience is None:
            raise ValueError(
                "second_stage needs patience: the second stage starts when the first has gone "
                "`patience` evaluations without improvement"
            )
        return self


class MetricsSpec(Strict):
    primary: str
    also: list[str] = []


def _seed_range(seed: int) -> int:
    # What torch's generators take (numpy's gets the seed mod 2³²); past it every trial would fail.
    if not 0 <= seed < 2**64:
        raise ValueError(f"a seed is a whole number from 0 to 2**64 - 1 (got {seed})")
    return seed


Seed = Annotated[Int, AfterValidator(_seed_range)]
_SEED_LIST = TypeAdapter(Annotated[list[Seed], Field(min_length=1)])


def _seeds(data: Any, handler: ValidatorFunctionWrapHandler) -> list[int] | SequentialSeeds:
    """``seeds:`` as a list or a design, each validated as itself: a problem names
    ``seeds.initial`` or ``seeds.1``, not both readings of the union."""
    if isinstance(data, dict):
        return SequentialSeeds.model_validate(data)
    if isinstance(data, SequentialSeeds):
        return data
    seeds = _SEED_LIST.validate_python(data)
    if len(set(seeds)) != len(seeds):
        raise ValueError("seeds must be distinct")
    return seeds


SeedsField = Annotated[list[int] | SequentialSeeds, WrapValidator(_seeds)]


# Names become parts of file names (trial files, checkpoints, report folders): at most this long,
# so ``<variant>-seed<k>-<fingerprint>.trial.json.gz`` stays under a file system's 255 bytes.
MAX_NAME = 100


def _variant_names(variants: dict[str, Any]) -> dict[str, Any]:
    for name in variants:
        if len(name) > MAX_NAME:
            raise ValueError(f"variant name {name[:20]!r}… has {len(name)} characters (at most {MAX_NAME})")
        if not name.strip() or any(not ch.isprintable() for ch in name):
            raise ValueError(f"variant name {name!r} is empty or holds a control character")
    return variants


# SLURM's --time forms: minutes, MM:SS, HH:MM:SS, D-HH, D-HH:MM, D-HH:MM:SS.
_SLURM_TIME = re.compile(r"(?:(\d+)-)?(\d+)(?::(\d+))?(?::(\d+))?")


def slurm_minutes(value: Any) -> Any:
    """A job's time limit as whole minutes (rounded up), from minutes or SLURM's ``[D-]HH:MM:SS``."""
    if not isinstance(value, str) or value.strip().isdigit():
        return value
    found = _SLURM_TIME.fullmatch(value.strip())
    if not found:
        raise ValueError("expected minutes or SLURM's [D-]HH:MM[:SS] (e.g. 4:00:00, 1-12:00)")
    days, first, second, third = (int(g) if g else 0 for g in found.groups())
    if found.group(1):  # D-HH[:MM[:SS]]
        seconds = ((days * 24 + first) * 60 + second) * 60 + third
    elif found.group(4):  # HH:MM:SS
        seconds = (first * 60 + second) * 60 + third
    else:  # MM:SS (SLURM's reading of two numbers without a day)
        seconds = first * 60 + second
    return max(1, -(-seconds // 60))


# A partition or account as sbatch reads it (a comma list of names): nothing that could end the
# option's line in the job script and start another (#SBATCH injection).
_SLURM_NAMES = re.compile(r"[\w.+@:-]+(,[\w.+@:-]+)*")


def slurm_names(value: str | None) -> str | None:
    if value is not None and not _SLURM_NAMES.fullmatch(value):
        allowed = "letters, digits, _ . + @ : -, commas between"
        raise ValueError(f"expected SLURM names ({allowed}), not {value!r}")
    return value


SlurmNames = Annotated[str | None, AfterValidator(slurm_names)]


class SlurmSpec(Strict):
    """``slurm:``: the jobs ``ablate run --launcher slurm`` submits, one ``ablate worker`` each
    (a user's ``~/.config/ablate/slurm.yaml`` holds the same keys; the command line wins). Not
    part of any trial's fingerprint: where a trial ran does not change its numbers."""

    partition: SlurmNames = None
    time: Annotated[int, BeforeValidator(slurm_minutes), Field(gt=0)] = 60  # minutes per job
    mem: str | None = Field(None, pattern=r"^\d+[KMGTkmgt]?$")  # per job, as sbatch --mem (16G)
    cpus_per_task: int | None = Field(None, gt=0)
    gpus_per_task: int | None = Field(None, gt=0)
    account: SlurmNames = None
    # More sbatch options, long form: ["--qos=high", "--constraint=a100", "--exclusive"].
    # (no control character in a value: a newline would start #SBATCH lines of its own)
    sbatch: list[Annotated[str, Field(pattern=r"^(#SBATCH[ \t]+)?--[A-Za-z][\w-]*(=[^\x00-\x1f]+)?$")]] = []
    setup: list[str] = []  # shell lines run before the worker starts (module load …, source …/activate)


RungName = Annotated[str, Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9_-]*$", max_length=40)]


class LadderSpec(Strict):
    """``ladder:``: the model sizes every variant trains at, each rung a list of ``key=value``
    overrides of the study file (``w64: [model.dim=64, model.blocks=2]``) making a study of its
    own named ``<study>.<rung>`` (:mod:`ablate.study.ladder`); the report reads the effect's trend
    over log10 of the rungs' parameters or training compute (:mod:`ablate.stats.ladder`)."""

    rungs: dict[RungName, list[str]] = Field(min_length=1)
    # what a rung's size is: its baseline's parameters, or its training GFLOP (rungs over tokens)
    scale: LADDER_SCALES.field = "parameters"
    # the size (in ``scale``'s unit) the trend is extrapolated (or interpolated) to
    target: float | None = Field(None, gt=0)
    # μP-style width scaling of Adam's learning rate (Yang et al. 2022, Tensor Programs V): the
    # attention's and FFN's weight matrices train at lr · lr_base_dim / dim on each rung, the
    # rest (embeddings, norms, connections) at lr, so that an lr tuned at one width holds at all
    lr_base_dim: int | None = Field(None, gt=0)


class StudySpec(Strict):
    name: str = Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]*$", max_length=MAX_NAME)
    description: str = ""
    task: TaskSpec
    model: ModelSpec = ModelSpec()
    variants: Annotated[dict[str, dict[str, Any]], AfterValidator(_variant_names)] = {}
    grid: dict[str, list[Any]] = {}
    train: TrainSpec = TrainSpec()
    search: SearchSpec = SearchSpec()
    # Scale each variant's declared width knob (the slot's ``width_option``) so its backbone
    # has the base's parameter count within 2%; ``true`` means the ffn slot.
    match_params: bool | MatchableSlot = False
    # A list of seeds, or a sequential design ``{initial, max, step}`` (seeds added where needed).
    seeds: SeedsField = [0]
    metrics: MetricsSpec
    # What the report compares and how; the study fills in the rest (Study.report_settings).
    report: ReportSection = ReportSettings()
    # Where the Optuna and MLflow stores live; default runs/<name> under the working dir.
    output: str | None = None
    # The SLURM jobs of `ablate run --launcher slurm` (no trial's fingerprint includes them).
    slurm: SlurmSpec = SlurmSpec()
    # Model sizes (rungs) every variant trains at: one study per rung, the trend over them.
    ladder: LadderSpec | None = None

    @property
    def seed_list(self) -> list[int]:
        """Every seed a variant may get: the list given, or a sequential design's 0 … max−1."""
        return self.seeds.seeds() if isinstance(self.seeds, SequentialSeeds) else list(self.seeds)

    @property
    def sequential(self) -> SequentialSeeds | None:
        """The sequential design, or None when every variant gets every seed of the list."""
        return self.seeds if isinstance(self.seeds, SequentialSeeds) else None

    def matched_slot(self) -> str:
        """The slot whose width knob ``match_params`` scales (``true``: the FFN)."""
        return "ffn" if self.match_params is True else str(self.match_params)

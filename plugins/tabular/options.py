"""Options of the tabular task (``task:`` in a study file)."""

from __future__ import annotations

from typing import Annotated, Any, ClassVar, Literal

from pydantic import Field, model_serializer, model_validator

from ablate.components import Options
from ablate.tasks import TaskOptions
from ablate_plugins.text_files import Encoding, Separator, memory_problem

TaskType = Literal["regression", "binclass", "multiclass"]
# What to do with a missing value: refuse the data (naming file and row), drop the rows that have
# one, or fill in (numeric: the training mean; categorical: a category of its own, "missing").
MissingPolicy = Literal["error", "drop", "impute"]


class NpyData(Options):
    """The FT-Transformer / T2G-Former folder layout: ``N_{train,val,test}.npy`` (numeric),
    optional ``C_*.npy`` (categorical), ``y_*.npy`` and ``info.json`` (``task_type``)."""

    format: Literal["npy"]
    path: str  # the folder; relative paths are resolved against the study file's folder
    missing: MissingPolicy = "error"


class CsvData(Options):
    """CSV files with declared columns: one file split at random with ``split_seed``, or separate
    ``valid`` / ``test`` files, or a ``split_column`` naming each row's split."""

    format: Literal["csv"]
    path: str  # the training rows (and those of the splits no file or split column gives)
    target: str
    task_type: TaskType
    numeric: list[str] = []
    categorical: list[str] = []
    missing: MissingPolicy  # declared, never assumed
    # Missing-value markers besides an empty field.
    na_values: list[str] = ["NA", "NaN", "nan", "?"]
    # train / valid / test shares of the rows drawn at random from `path` (FT-Transformer's); with a
    # `valid` or `test` file, the other splits share `path` in proportion to theirs.
    ratios: tuple[float, float, float] = (0.64, 0.16, 0.2)
    split_seed: int = 0
    header: bool = True  # false: the file's first line is data and `columns` names the columns
    columns: list[str] | None = None
    sep: Separator = ","  # "\t" for TSV, ";" ...; longer separators are regular expressions
    encoding: Encoding = None  # the files' text encoding; None: UTF-8
    valid: str | None = None  # a file of validation rows, laid out as `path`
    test: str | None = None  # a file of test rows, laid out as `path`
    split_column: str | None = None  # a column whose value in each row is train, valid or test
    # Lines whose first field starts with this are skipped in every file (UCI's adult.test opens
    # with the line "|1x3 Cross validator": comment: "|").
    comment: str | None = Field(None, min_length=1, max_length=1)
    # Removed from the end of each target label that ends with it (UCI's adult.test writes ">50K."
    # and "<=50K." for adult.data's ">50K" and "<=50K": label_suffix: ".").
    label_suffix: str | None = Field(None, min_length=1)

    # Options added after fingerprints by meaning, at the value that reads the files as before: a
    # trial's fingerprint leaves them out there (a file they change failed to load without them).
    LATER: ClassVar[dict[str, Any]] = {"comment": None, "label_suffix": None}

    @model_serializer(mode="wrap")
    def _later_left_out(self, handler: Any) -> dict[str, Any]:
        dumped = handler(self)
        return {k: v for k, v in dumped.items() if not (k in self.LATER and v == self.LATER[k])}

    @model_validator(mode="after")
    def _columns(self) -> CsvData:
        if not self.numeric and not self.categorical:
            raise ValueError("declare at least one feature column in numeric or categorical")
        both = set(self.numeric) & set(self.categorical)
        if both:
            raise ValueError(f"column(s) {', '.join(sorted(both))} declared both numeric and categorical")
        if self.target in set(self.numeric) | set(self.categorical):
            raise ValueError(f"the target '{self.target}' is also declared as a feature")
        if any(r <= 0 for r in self.ratios) or abs(sum(self.ratios) - 1.0) > 1e-6:
            raise ValueError(f"ratios must be three positive shares summing to 1 (got {self.ratios})")
        if self.label_suffix is not None and self.task_type == "regression":
            raise ValueError("label_suffix is for class labels; a regression target is a number")
        if self.comment is not None and self.comment in (self.sep, '"'):
            raise ValueError(f"comment {self.comment!r} would also split or quote fields; use another mark")
        self._check_layout()
        self._check_splits()
        return self

    def _check_layout(self) -> None:
        if self.header and self.columns is not None:
            raise ValueError("columns names the columns of a file without a header; set header: false")
        if not self.header and self.columns is None:
            raise ValueError("header: false needs columns: the names of the file's columns, in order")
        if self.columns is not None:
            twice = sorted({c for c in self.columns if self.columns.count(c) > 1})
            if twice:
                raise ValueError(f"columns names {', '.join(twice)} more than once")
            absent = [c for c in self.declared() if c not in self.columns]
            if absent:
                raise ValueError(f"declared column(s) {', '.join(absent)} not in columns")

    def _check_splits(self) -> None:
        if self.split_column is None:
            if self.valid is not None and self.test is not None and "ratios" in self.model_fields_set:
                raise ValueError("ratios are not used when both valid and test files are given")
            return
        if self.valid is not None or self.test is not None:
            raise ValueError("split_column and valid / test files are two ways to split: choose one")
        if self.split_column in (self.target, *self.numeric, *self.categorical):
            raise ValueError(
                f"split_column '{self.split_column}' is also declared as the target or a feature"
            )
        if "ratios" in self.model_fields_set or "split_seed" in self.model_fields_set:
            raise ValueError(
                "ratios and split_seed are not used with split_column: its values split the rows"
            )

    def declared(self) -> list[str]:
        """Every column the options name, in file-reading order."""
        split = [self.split_column] if self.split_column else []
        return [self.target, *self.numeric, *self.categorical, *split]

    def files(self) -> dict[str, str]:
        """Option name → path of each file the options name: ``path`` first."""
        named = {"path": self.path, "valid": self.valid, "test": self.test}
        return {k: v for k, v in named.items() if v is not None}


class SyntheticData(Options):
    """Generated rows with a known target function (see :func:`data.synthetic`)."""

    format: Literal["synthetic"] = "synthetic"
    rows: int = Field(600, ge=20)
    numeric: int = Field(4, ge=0)
    categorical: int = Field(2, ge=0)
    cardinality: int = Field(4, ge=2)
    task_type: TaskType = "regression"
    classes: int = Field(3, ge=2)  # for multiclass
    noise: float = Field(0.1, ge=0.0)
    seed: int = 0

    @model_validator(mode="after")
    def _features(self) -> SyntheticData:
        if self.numeric + self.categorical == 0:
            raise ValueError("synthetic data needs at least one numeric or categorical feature")
        # Per numeric value its draw, copies and scaled forms; per category a code and its string.
        estimate = self.rows * (self.numeric * 40 + self.categorical * 100 + 64)
        problem = memory_problem(
            estimate + self.categorical * self.cardinality * 8,
            f"{self.rows} rows × {self.numeric} numeric + {self.categorical} categorical features",
        )
        if problem:
            raise ValueError(problem)
        return self


DataOptions = Annotated[SyntheticData | NpyData | CsvData, Field(discriminator="format")]


class TabularOptions(TaskOptions):
    data: DataOptions = SyntheticData()
    # Numeric feature scaling fitted on the training rows: quantile (sklearn QuantileTransformer with
    # normal output, as FT-Transformer / T2G-Former), standard (z-score) or none.
    scaling: Literal["quantile", "standard", "none"] = "quantile"
    # FT-Transformer's / T2G-Former's preprocessing fits the quantile transform on training features
    # jittered by N(0, σ_j²), σ_j = noise / max(std_j, noise) (seeded, 0): tied values, such as a
    # whole-number feature's, then span their quantiles instead of sharing one. 0 fits on the values
    # as they are. The transform is applied to the un-jittered values of every split.
    quantile_noise: float = Field(1e-3, ge=0.0)
    # Standardise a regression target with training statistics (predictions are mapped back, so
    # RMSE is in the target's original units).
    standardize_target: bool = True

"""Options of the seqrec task (``task:`` in a study file) and a helper for union errors."""

from __future__ import annotations

from typing import Annotated, Any, ClassVar, Literal

from pydantic import Field, field_validator, model_validator

from ablate.components import Options
from ablate.tasks import TaskOptions
from ablate_plugins.text_files import Encoding, Separator, memory_problem

# What generating synthetic data holds per interaction (item, timestamp, gap, draws) and per user
# (its arrays' headers), in bytes; items cost their successor, popularity and draw tables.
BYTES_PER_INTERACTION, BYTES_PER_USER, BYTES_PER_ITEM = 40, 400, 48


class SyntheticData(Options):
    """Generated sequences with a planted successor map (see :func:`data.synthetic`)."""

    format: Literal["synthetic"] = "synthetic"
    users: int = Field(500, gt=0)
    items: int = Field(200, ge=2)
    min_len: int = Field(15, ge=3)  # sequence lengths, before the leave-one-out split
    max_len: int = Field(40, ge=3)
    follow: float = Field(0.8, ge=0.0, le=1.0)
    seed: int = 0
    timestamps: bool = True

    @field_validator("users")
    @classmethod
    def _users_fit(cls, users: int) -> int:
        # Each user holds at least 3 interactions (min_len ≥ 3): a lower bound, checked alone so
        # the error names `users`; the model check below uses the lengths.
        _fits(users * (BYTES_PER_USER + 3 * BYTES_PER_INTERACTION), f"{users} users")
        return users

    @field_validator("items")
    @classmethod
    def _items_fit(cls, items: int) -> int:
        _fits(items * BYTES_PER_ITEM, f"{items} items")
        return items

    @model_validator(mode="after")
    def _lengths(self) -> SyntheticData:
        if self.min_len > self.max_len:
            raise ValueError(f"min_len ({self.min_len}) must not exceed max_len ({self.max_len})")
        mean = (self.min_len + self.max_len) / 2
        _fits(
            self.users * (BYTES_PER_USER + mean * BYTES_PER_INTERACTION) + self.items * BYTES_PER_ITEM,
            f"{self.users} users × {mean:g} interactions on average ({self.items} items)",
        )
        return self


def _fits(estimate: float, what: str) -> None:
    problem = memory_problem(estimate, what)
    if problem:
        raise ValueError(problem)


class FileData(Options):
    """Options every file format shares."""

    path: str  # relative paths are resolved against the study file's folder
    k_core: int | None = Field(None, ge=1)  # repeatedly drop users and items with fewer rows
    remap: bool = True  # items → 1..m in id order; false keeps the file's (positive) ids
    encoding: Encoding = None  # the file's text encoding; None: UTF-8
    # How user and item ids are read (see ids.py): auto — integers if every id of a column is one,
    # else text; integer — refuse any other id; text — every id is text ("007" is not "7").
    ids: Literal["auto", "integer", "text"] = "auto"


class MovieLensData(FileData):
    """MovieLens ``u.data`` (tab) or ``ratings.dat`` (``::``), optionally ``.gz``."""

    format: Literal["movielens"]
    min_rating: float | None = None  # keep ratings >= this


class UserItemData(FileData):
    """SASRec's ``user item`` lines, chronological per user (no timestamps)."""

    format: Literal["user_item"]


class UserLinesData(FileData):
    """One line per user: ``user i1 i2 …`` (S3-Rec / ICLRec; no timestamps)."""

    format: Literal["user_lines"]


class TableData(FileData):
    """CSV / TSV with named (``header: true``) or 0-based (``header: false``) columns."""

    format: Literal["csv"]
    sep: Separator = ","  # "\t" for TSV; longer separators are regular expressions
    header: bool = True
    user: str | int = "user"
    item: str | int = "item"
    timestamp: str | int | None = None
    rating: str | int | None = None
    min_rating: float | None = None

    @model_validator(mode="after")
    def _rating(self) -> TableData:
        if self.min_rating is not None and self.rating is None:
            raise ValueError("min_rating needs a rating column: set 'rating'")
        return self


class JsonLinesData(FileData):
    """JSON lines: one JSON object per line, one interaction each, its fields named by key (the
    Amazon Reviews format, optionally ``.gz``; Amazon 2018: ``user: reviewerID, item: asin,
    timestamp: unixReviewTime, rating: overall``; 2023: ``user: user_id, item: parent_asin,
    timestamp: timestamp, timestamp_unit: ms, rating: rating``). Other keys are ignored."""

    format: Literal["jsonl"]
    user: str = "user_id"  # RecBole's atomic-file names
    item: str = "item_id"
    timestamp: str | None = None
    # What the timestamps count: seconds, or milliseconds (Amazon 2023), read as seconds.
    timestamp_unit: Literal["s", "ms"] = "s"
    rating: str | None = None
    min_rating: float | None = None

    @model_validator(mode="after")
    def _rating(self) -> JsonLinesData:
        if self.min_rating is not None and self.rating is None:
            raise ValueError("min_rating needs a rating key: set 'rating'")
        if self.timestamp is None and "timestamp_unit" in self.model_fields_set:
            raise ValueError("timestamp_unit needs a timestamp key: set 'timestamp'")
        return self


DataOptions = Annotated[
    SyntheticData | MovieLensData | UserItemData | UserLinesData | TableData | JsonLinesData,
    Field(discriminator="format"),
]


class SeqRecOptions(TaskOptions):
    data: DataOptions = SyntheticData()
    max_len: int = Field(50, gt=0)  # history window: the last max_len items
    # How plain metric names (hr@10) rank: against every item the user has not seen ("full"), or
    # against `sampled_negatives` items drawn uniformly from those the user never interacted
    # with ("sampled", SASRec's protocol). Names prefixed "full." / "sampled." pin a protocol.
    protocol: Literal["full", "sampled"] = "full"
    sampled_negatives: int = Field(100, gt=0)
    # Position-wise layers run on the real tokens only (values + offsets); attention on padded blocks.
    jagged: bool = True
    cache: bool = True  # keep parsed files in the dataset cache (see data.cached)
    # Training batches: sort each run of length_pool × batch_size shuffled users by length before
    # cutting it into batches (less padding; 1 = plain shuffled batches).
    # Length pooling changes what a batch is (users of similar length together, so short
    # histories weigh more in each mean): on SASRec ML-1M it learned more slowly and ended lower
    # (reports/sasrec_ml1m/NOTE.md). `train.micro_batches` saves padding without changing the
    # objective: this task cuts a batch into groups of rows of similar length (Task.split_batch).
    length_pool: int = Field(1, ge=1)
    # Score (and train) with cosine similarity: L2-normalised outputs and item vectors (HSTU / FuXi-α).
    normalize: bool = False
    # The item catalogue: a file of every item, one per line, its id first (MovieLens movies.dat:
    # ``id::title::genres``), relative to the data file's folder. Items of the catalogue no one
    # rated get table rows too: negatives are drawn and ranking is done among all of them, as the
    # HSTU / FuXi-α trainers do with ML-1M's 3,883 movies. None: the items that occur in the data.
    catalogue: str | None = None

    # Options added after fingerprints by meaning, at the value that trains as before.
    ADDED_LATER: ClassVar[dict[str, Any]] = {**TaskOptions.ADDED_LATER, "catalogue": None}

    @model_validator(mode="after")
    def _catalogue_needs_files(self) -> SeqRecOptions:
        if self.catalogue is not None and not isinstance(self.data, FileData):
            raise ValueError("catalogue: a catalogue extends a data file's items; synthetic data has none")
        if self.catalogue is not None and not self.data.remap:
            raise ValueError("catalogue: the catalogue numbers items 1..m in id order; set data.remap: true")
        return self

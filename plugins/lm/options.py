"""Options of the causal language-modelling task (``task:`` in a study file) and of its loss.

The two-line form ``task: {kind: lm, data: {path: my_texts/}}`` reads every ``.txt`` file of a
folder with raw-byte tokens; everything else has a default.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import Field, model_validator

from ablate.components import Options
from ablate.tasks import TaskOptions
from ablate_plugins.text_files import Encoding


class FileData(Options):
    """A text file, a ``.jsonl`` file (one JSON object a line, its ``text_field``), a ``.parquet``
    file (its ``text_field`` column), or a folder of them (the files ``pattern`` matches, in name
    order). Each text file, JSON line or parquet row is one document: no window spans two."""

    format: Literal["files"] = "files"
    path: str  # relative paths are resolved against the study file's folder
    pattern: str = "**/*.txt"  # which files of a folder are read (a glob, recursive with **)
    text_field: str = "text"  # the .jsonl key / .parquet column holding each document's text
    encoding: Encoding = None  # the files' text encoding; None: UTF-8
    # Held-out text in files of its own (same reading rules); None: the tail fraction of `path`.
    valid_path: str | None = None
    test_path: str | None = None


class StdlibData(Options):
    """The running interpreter's standard-library sources (every machine has them, offline): the
    files ``pattern`` matches in its ``stdlib`` folder, in name order, each one document. The
    Python version is part of the data summary (another version is other text)."""

    format: Literal["stdlib"]
    pattern: str = "*.py"
    max_bytes: int | None = Field(None, gt=0)  # read files in name order until this many bytes


class SyntheticData(Options):
    """Generated English-like documents with planted structure (counting runs, repeated phrases),
    so tests run with no files."""

    format: Literal["synthetic"]
    documents: int = Field(64, ge=2)
    words: int = Field(120, ge=4)  # words per document
    seed: int = 0


DataOptions = Annotated[FileData | StdlibData | SyntheticData, Field(discriminator="format")]


class BytesTokenizer(Options):
    """Raw UTF-8 bytes: ids 0–255, plus one document-start id (256). Nothing to train."""

    kind: Literal["bytes"] = "bytes"


class BPETokenizer(Options):
    """A byte-level BPE (Hugging Face ``tokenizers``) trained on the training split only; cached
    by the training text's digest and these options."""

    kind: Literal["bpe"]
    vocab_size: int = Field(4096, ge=260, le=65536)  # including the 256 bytes and <|doc|>
    min_frequency: int = Field(2, ge=1)  # a merge is learned from pairs seen this often


class FileTokenizer(Options):
    """A ``tokenizer.json`` of your own (Hugging Face ``tokenizers``); ``bos`` is its token that
    starts every document."""

    kind: Literal["file"]
    path: str
    bos: str | None = None  # None: the first of <|doc|>, <|endoftext|>, <s>, <|im_start|>, [BOS] it has


TokenizerOptions = Annotated[BytesTokenizer | BPETokenizer | FileTokenizer, Field(discriminator="kind")]


class LMOptions(TaskOptions):
    data: DataOptions = SyntheticData(format="synthetic")
    tokenizer: TokenizerOptions = BytesTokenizer()
    # Tokens a training window predicts (it reads window + 1: inputs and the next token of each).
    window: int = Field(256, ge=2)
    # Held-out text by bytes, drawn across the documents (the tail of their order by a hash of
    # their names; see .corpus): validation, then test.
    valid_fraction: float = Field(0.05, gt=0.0, lt=0.5)
    test_fraction: float = Field(0.05, gt=0.0, lt=0.5)
    # Each held-out split is scored on eval_bytes bytes of it, drawn evenly from all its documents
    # (the same text whatever the tokenizer, so bits per byte compare across tokenizers).
    eval_bytes: int = Field(1 << 18, ge=64)
    # Training windows per epoch, drawn afresh each epoch; None: every window once.
    windows_per_epoch: int | None = Field(None, ge=1)
    # true: position-wise layers run on the real tokens only (values + offsets), attention on padded
    # rows — faster where many documents are shorter than a window; the MoE's per-sequence balance
    # (balance: sequence) needs false, where the FFN sees the rows.
    jagged: bool = False
    tie_embeddings: bool = True  # the output head is the input embedding table (MiniMind, GPT-2)

    @classmethod
    def model_validate(cls, obj: Any, **kwargs: Any):
        # `data: {path: …}` without a format reads files: the two-line task section.
        if isinstance(obj, dict) and isinstance(obj.get("data"), dict) and "format" not in obj["data"]:
            obj = {**obj, "data": {"format": "files", **obj["data"]}}
        return super().model_validate(obj, **kwargs)

    @model_validator(mode="after")
    def _held_out(self) -> LMOptions:
        if self.valid_fraction + self.test_fraction >= 0.9:
            raise ValueError(
                f"valid_fraction + test_fraction = {self.valid_fraction + self.test_fraction:g} leaves "
                f"less than a tenth of the text to train on; lower them"
            )
        return self


class LossOptions(Options):
    """``train.loss``: next-token cross-entropy, the mean over a batch's predicted tokens."""

    kind: Literal["cross_entropy"] = "cross_entropy"

"""Causal language modelling (``lm``): text files, ``.jsonl``, ``.parquet`` or the interpreter's
standard library; byte or BPE tokens; documents cut into windows no attention crosses; validation
loss, perplexity and bits per byte on a fixed held-out budget."""

from .batches import Batch, Tokens, collate, windows_of
from .corpus import Corpus, cut_tail, load_corpus, split, synthetic_documents
from .evaluation import summary, window_metrics
from .model import LMModel
from .options import LMOptions, LossOptions
from .task import LMData, LMTask
from .vocab import ByteTokens, HFTokens, char_byte_ends, make_tokenizer

__all__ = [
    "Batch",
    "ByteTokens",
    "Corpus",
    "HFTokens",
    "LMData",
    "LMModel",
    "LMOptions",
    "LMTask",
    "LossOptions",
    "Tokens",
    "char_byte_ends",
    "collate",
    "cut_tail",
    "load_corpus",
    "make_tokenizer",
    "split",
    "summary",
    "synthetic_documents",
    "window_metrics",
    "windows_of",
]

"""The ``lm`` task: causal language modelling on text (next-token cross-entropy)."""

from __future__ import annotations

import logging
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ablate.components import BuildContext
from ablate.errors import DataError
from ablate.jagged import Jagged
from ablate.tasks import Baseline, Evaluation, Task, data_file_problem

from . import baselines, evaluation
from .batches import Batch, Tokens, train_batches, windows_of
from .corpus import DATA_FILES, SPLITS, even_share, load_corpus
from .model import LMModel, padded_layout
from .options import LMOptions, LossOptions
from .vocab import make_tokenizer

log = logging.getLogger(__name__)

SPLIT_NAMES = {"train": "training", "valid": "validation", "test": "test"}


@dataclass
class LMData:
    splits: dict[str, Tokens]
    vocab_size: int
    tokenizer: str
    source: str
    bytes: dict[str, int]  # text bytes per split (held-out: the evaluation budget)
    facts: dict[str, str] = field(default_factory=dict)
    bos: int = 256  # the document-start id (never a target)


class LMTask(Task):
    """Predict each next token of documents cut into windows (see :mod:`.batches`); validation
    and test score a fixed budget of held-out text (loss, perplexity, bits per byte)."""

    Options = LMOptions
    LossOptions = LossOptions
    # 2: held-out documents drawn across the corpus by a hash of their names, and the evaluation
    # budget taken evenly from each (1: the tail of the name order, scored from its start).
    version = 2

    options: LMOptions

    def check_metric(self, name: str) -> str | None:
        return evaluation.check(name)

    def metric_higher_is_better(self, name: str) -> bool:
        return False

    # -- files ---------------------------------------------------------------------------
    def data_files(self) -> dict[str, Path]:
        files = DATA_FILES[self.options.data.format](self.options.data, self.base_dir)
        tokenizer_path = getattr(self.options.tokenizer, "path", None)  # a tokenizer.json of the user's
        if tokenizer_path is not None:
            files["tokenizer"] = self.base_dir / Path(tokenizer_path).expanduser()
        return files

    def check_files(self) -> str | None:
        for path in self.data_files().values():
            problem = data_file_problem(path)
            if problem:
                return problem
        return None

    # -- data ----------------------------------------------------------------------------
    def load(self) -> LMData:
        opts = self.options
        corpus = load_corpus(opts.data, self.base_dir, opts.valid_fraction, opts.test_fraction)
        tokenizer = make_tokenizer(opts.tokenizer, corpus.splits["train"], self.base_dir)
        splits, sizes = {}, {}
        for name in SPLITS:
            docs = corpus.splits[name]
            if name != "train":
                docs = even_share(docs, opts.eval_bytes)  # the budget drawn from every held-out document
            total = sum(len(d.encode()) for d in docs)
            splits[name], sizes[name] = windows_of(tokenizer.encode(docs), opts.window), total
        train = splits["train"]
        if train.predictions < opts.window:
            raise DataError(
                f"{corpus.source}: the training text is {train.predictions + train.documents} tokens, "
                f"shorter than one window (task.window = {opts.window} predictions); lower task.window "
                f"or give more text"
            )
        for name in ("valid", "test"):
            if splits[name].predictions == 0:
                raise DataError(
                    f"{corpus.source}: the {SPLIT_NAMES[name]} split holds no text to score; raise "
                    f"task.{name}_fraction or give data.{name}_path"
                )
        data = LMData(
            splits, tokenizer.vocab_size, tokenizer.kind, corpus.source, sizes, corpus.facts, tokenizer.bos
        )
        log.info("lm data: %s", self.data_summary(data))
        return data

    def data_summary(self, data: LMData) -> dict[str, int | float | str]:
        summary: dict[str, int | float | str] = {"source": data.source, **data.facts}
        summary.update({"tokenizer": data.tokenizer, "vocabulary": data.vocab_size})
        for name, tokens in data.splits.items():
            summary[f"{name} documents"] = tokens.documents
            summary[f"{name} bytes"] = data.bytes[name]
            summary[f"{name} tokens"] = tokens.predictions
            summary[f"{name} windows"] = tokens.windows
        per_token = data.bytes["train"] / max(data.splits["train"].predictions, 1)
        summary["bytes per token (train)"] = round(per_token, 3)
        return summary

    def baselines(self, data: LMData, metrics: list[str]) -> list[Baseline]:
        return baselines.trivial(
            data.splits["train"], data.splits["test"], data.vocab_size, data.bos, metrics
        )

    def protocol(self, metrics: list[str]) -> str:
        return (
            "Validation and test text are drawn across the documents (the tail of their order by a hash of "
            f"their names: {self.options.valid_fraction:.0%} and {self.options.test_fraction:.0%} of the "
            f"bytes), each scored on at most {self.options.eval_bytes:,} bytes taken evenly from all its "
            f"documents. A test unit is a window of at most {self.options.window} predicted tokens, read "
            "with no context before it; loss is the mean cross-entropy per token (nats), perplexity its "
            "exponential, bits per byte the summed cross-entropy over the bytes the tokens cover, in bits."
        )

    def max_len(self, data: LMData) -> int:
        return self.options.window

    def train_batches(self, data: LMData, batch_size: int, generator: torch.Generator) -> Iterable[Batch]:
        return train_batches(data.splits["train"], batch_size, generator, self.options.windows_per_epoch)

    def batch_tokens(self, batch: Batch) -> int:
        return int(batch.valid.sum())

    # -- model ---------------------------------------------------------------------------
    def build_model(self, backbone: nn.Module, ctx: BuildContext, data: LMData) -> LMModel:
        layout = Jagged.from_valid if self.options.jagged else padded_layout
        return LMModel(backbone, data.vocab_size, ctx.dim, layout, self.options.tie_embeddings)

    def loss(self, model: LMModel, batch: Batch, loss: LossOptions, generator: torch.Generator) -> Tensor:
        hidden = model(batch)[batch.valid]
        return F.cross_entropy(evaluation.at_least_fp32(model.logits(hidden)), batch.targets[batch.valid])

    @torch.no_grad()
    def evaluate(
        self,
        model: LMModel,
        data: LMData,
        split: str,
        metrics: list[str],
        device: torch.device,
        batch_size: int,
    ) -> Evaluation:
        return evaluation.evaluate(model, data.splits[split], metrics, device, batch_size)

"""Side by side with the authors' trainers: their training step and ablate's, interleaved in one run.

    python benchmarks/reference.py PATH [--reps 4] [--threads 2] [--steps N] [--micro-batches 1 4]
                                        [--precision fp32 bf16] [--models hstu sasrec] [--anomaly on|off]
                                        [--note "..."] [--no-write]

PATH is a copy, outside this repository, of one of the reference code bases; their modules are
imported from PATH at run time and nothing of theirs is copied here:

* **pmixer/SASRec.pytorch** (its ``python/`` folder, or the repository root holding it): its own
  training loop as its ``main.py`` runs it (defaults: d = 50, 2 blocks, 1 head, max length 200,
  dropout 0.2, batch 128) — its ``WarpSampler`` (3 sampling processes), its ``SASRec`` model with
  main.py's Xavier initialisation, BCE on the positive and 1 sampled negative per position, Adam
  lr 1e-3 betas (0.9, 0.98) — on ML-1M in SASRec's format (the file ``studies/sasrec_ml1m.yaml``
  trains on, handed to its ``data_partition`` as ``data/<name>.txt`` in a temporary folder), against
  ``studies/sasrec_ml1m.yaml`` (plain batches and ``micro_batches: 4``; fp32 and, with
  ``--precision fp32 bf16``, bf16 autocast). One epoch = 48 steps of 128.
* **meta-recsys/generative-recommenders** (HSTU and SASRec, the research path) and
  **USTC-StarTeam/FuXi-alpha** (FuXi-α): the model, sampled-softmax loss (128 local negatives,
  temperature 0.05, L2-normalised embeddings) and AdamW their ``train_fn`` builds from
  ``configs/ml-1m/*-sampled-softmax-n128-final.gin`` (the encoder's settings through gin itself,
  ``train_fn``'s read from the same file), stepped as its loop steps them (features from the batch,
  the target scattered into the ids, forward, loss, backward, step; ``torch.autograd.set_detect_anomaly``
  on as ``train_fn`` sets it, ``--anomaly off`` to leave it off) without DDP, on ML-1M users
  1–2999, against the ``base`` (SASRec) / ``hstu`` / ``fuxi-alpha`` variants of
  ``studies/hstu_fuxi_ml1m.yaml``. Their batches come from their ``DatasetV2`` through an
  in-process DataLoader whose per-user cache is filled before timing (the gin file's 8 loader
  processes would compete for the same cores); their code imports ``gin`` (``pip install
  gin-config``), FuXi-α's also ``einops``. One epoch = 24 steps of 128.

Each repetition times one block of ``--steps`` training steps (default: one epoch) of the reference,
then of each ablate setting, with the same torch thread count (``--threads``); ablate's steps are
timed by benchmarks/seqrec.py's ``epoch`` (its batches, model, loss parts and Adam step). Reported:
seconds per epoch (per step × steps per epoch) per repetition, the median, its ratio to the
reference's, and peak memory (resident-set growth during the block). Written to
benchmarks/RESULTS.md when whole epochs were timed (unless ``--no-write``); with ``--steps`` it only
prints. A PATH that is absent, or holds none of these, gets one line and exit status 2.
"""

from __future__ import annotations

import argparse
import ast
import contextlib
import importlib
import importlib.util
import inspect
import os
import random
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import date
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pandas as pd
import torch
from results_file import cpu, write_section  # benchmarks/ is on sys.path when run as a script
from seqrec import HSTU_FUXI, SASREC
from seqrec import epoch as ablate_epoch
from seqrec import load as load_ablate

from ablate.training.memory import PeakMemory

SASREC_PYTORCH, GENERATIVE_RECOMMENDERS, FUXI_ALPHA = "SASRec.pytorch", "generative-recommenders", "FuXi-α"
# What marks each code base, relative to PATH.
MARKERS = {
    GENERATIVE_RECOMMENDERS: "generative_recommenders/research/modeling/sequential/hstu.py",
    FUXI_ALPHA: "generative_recommenders/modeling/sequential/fuxi.py",
}
WANTED = (
    "give the path of a copy of pmixer/SASRec.pytorch (its python/ folder), "
    "meta-recsys/generative-recommenders or USTC-StarTeam/FuXi-alpha"
)
# The authors' gin files per model, and the variant of studies/hstu_fuxi_ml1m.yaml it is compared with.
GIN = {
    "hstu": ("hstu-sampled-softmax-n128-final.gin", "hstu"),
    "sasrec": ("sasrec-sampled-softmax-n128-final.gin", "base"),
    "fuxi": ("fuxi-sampled-softmax-n128-final.gin", "fuxi-alpha"),
}
GR_OUTPUT_LENGTH = 10  # train_fn's gr_output_length default: the model's output length is this + 1


class Refused(Exception):
    """One line for the user; exit status 2."""


def locate(path: Path) -> tuple[str, Path]:
    """Which reference PATH holds, and the folder its modules are imported from."""
    if not path.exists():
        raise Refused(f"{path} does not exist: {WANTED}")
    for root in (path, path / "python"):
        if (root / "model.py").is_file() and (root / "utils.py").is_file():
            return SASREC_PYTORCH, root
    for name, marker in MARKERS.items():
        if (path / marker).is_file():
            return name, path
    raise Refused(
        f"{path} holds no model.py (SASRec.pytorch's python/ folder), nor {', '.join(MARKERS.values())}"
    )


def import_file(name: str, path: Path):
    """A reference's module, imported from its file under a name of its own."""
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


# -- the references' training steps -------------------------------------------------------------


class SasrecPytorch:
    """SASRec.pytorch's main.py training loop on a SASRec-format file."""

    def __init__(self, root: Path, data_file: Path, seed: int = 0):
        utils = import_file("sasrec_pytorch_utils", root / "utils.py")
        model = import_file("sasrec_pytorch_model", root / "model.py")
        with tempfile.TemporaryDirectory() as folder:  # it reads data/<name>.txt from the working folder
            (Path(folder) / "data").mkdir()
            (Path(folder) / "data" / "ml1m.txt").symlink_to(data_file.resolve())
            with contextlib.chdir(folder):
                user_train, _, _, users, items = utils.data_partition("ml1m")
        args = SimpleNamespace(  # main.py's defaults
            batch_size=128,
            lr=1e-3,
            maxlen=200,
            hidden_units=50,
            num_blocks=2,
            num_heads=1,
            dropout_rate=0.2,
            l2_emb=0.0,
            device="cpu",
            norm_first=False,
        )
        np.random.seed(seed)
        torch.manual_seed(seed)
        self.args = args
        self.steps_per_epoch = (len(user_train) - 1) // args.batch_size + 1
        self.sampler = utils.WarpSampler(
            user_train, users, items, batch_size=args.batch_size, maxlen=args.maxlen, n_workers=3
        )
        self.model = model.SASRec(users, items, args)
        for _, param in self.model.named_parameters():  # main.py's initialisation
            with contextlib.suppress(ValueError):  # 1-d parameters have no fan
                torch.nn.init.xavier_normal_(param.data)
        self.model.pos_emb.weight.data[0, :] = 0
        self.model.item_emb.weight.data[0, :] = 0
        self.model.train()
        self.bce = torch.nn.BCEWithLogitsLoss()
        self.optimizer = torch.optim.Adam(self.model.parameters(), lr=args.lr, betas=(0.9, 0.98))

    def step(self) -> float:
        u, seq, pos, neg = (np.array(x) for x in self.sampler.next_batch())
        pos_logits, neg_logits = self.model(u, seq, pos, neg)
        ones, zeros = torch.ones(pos_logits.shape), torch.zeros(neg_logits.shape)
        self.optimizer.zero_grad()
        real = np.where(pos != 0)
        loss = self.bce(pos_logits[real], ones[real]) + self.bce(neg_logits[real], zeros[real])
        for param in self.model.item_emb.parameters():
            loss += self.args.l2_emb * torch.sum(param**2)
        loss.backward()
        self.optimizer.step()
        return loss.item()

    def close(self) -> None:
        self.sampler.close()


def train_fn_settings(gin_file: Path) -> dict:
    """``train_fn.name = value`` lines of an authors' gin file (their values are Python literals)."""
    settings = {}
    for line in gin_file.read_text().splitlines():
        name, equals, value = line.partition("=")
        if equals and name.strip().startswith("train_fn."):
            settings[name.strip().removeprefix("train_fn.")] = ast.literal_eval(value.strip())
    return settings


def sequence_table(ratings: Path, folder: Path) -> Path:
    """The ratings as one row per user in the authors' ``sasrec_format.csv`` columns
    (chronological; ties in time kept in file order, as ablate's loader keeps them)."""
    frame = pd.read_csv(ratings, sep="::", engine="python", names=["user_id", "item", "rating", "time"])
    frame = frame.sort_values(["user_id", "time"], kind="stable")
    joined = frame.groupby("user_id", sort=True).agg(lambda column: ",".join(map(str, column)))
    table = pd.DataFrame(
        {
            "user_id": joined.index,
            "sequence_item_ids": joined["item"].to_numpy(),
            "sequence_ratings": joined["rating"].to_numpy(),
            "sequence_timestamps": joined["time"].to_numpy(),
        }
    )
    path = folder / "sasrec_format.csv"
    table.to_csv(path, index=False)
    return path


@dataclass
class AuthorsModules:
    """Where a generative-recommenders code base keeps what ``train_fn`` builds."""

    root: Path
    package: str  # generative_recommenders.research, or generative_recommenders (FuXi-α's fork)

    def get(self, module: str, name: str):
        return getattr(importlib.import_module(f"{self.package}.{module}"), name)

    def sampled_softmax(self):
        for module in (
            "modeling.sequential.losses.sampled_softmax",
            "modeling.sequential.autoregressive_losses",
        ):
            with contextlib.suppress(ModuleNotFoundError, AttributeError):
                return self.get(module, "SampledSoftmaxLoss")
        raise Refused(f"{self.root}: no SampledSoftmaxLoss found")


class AuthorsTrainer:
    """One model of generative-recommenders or FuXi-α as its ``train_fn`` builds and steps it."""

    def __init__(
        self, modules: AuthorsModules, model_name: str, table: Path, items: list[int], anomaly: bool
    ):
        import gin

        config = modules.root / "configs" / "ml-1m" / GIN[model_name][0]
        settings = train_fn_settings(config)
        encoders = importlib.import_module(f"{modules.package}.modeling.sequential.encoder_utils")
        gin.clear_config()
        gin.parse_config_file(
            str(config), skip_unknown=True
        )  # the encoder's bindings; train_fn is not imported
        max_len, dim = settings["max_sequence_length"], settings["item_embedding_dim"]
        dataset = modules.get("data.dataset", "DatasetV2")(
            ratings_file=str(table), padding_length=max_len + 1, ignore_last_n=1, chronological=True
        )
        for i in range(len(dataset)):  # fill its per-user cache: parsing is not the step
            dataset[i]
        sampler = torch.utils.data.distributed.DistributedSampler(
            dataset, num_replicas=1, rank=0, shuffle=True, seed=0
        )
        self.loader = torch.utils.data.DataLoader(
            dataset, batch_size=settings["local_batch_size"], sampler=sampler
        )
        self.steps_per_epoch = len(self.loader)
        num_items = max(items)
        random.seed(settings.get("random_seed", 42))
        torch.manual_seed(0)
        embedding = modules.get("modeling.sequential.embedding_modules", "LocalEmbeddingModule")(
            num_items=num_items, item_embedding_dim=dim
        )
        interaction, _ = modules.get("modeling.similarity_utils", "get_similarity_function")(
            module_type=settings["interaction_module_type"], query_embedding_dim=dim, item_embedding_dim=dim
        )
        self.model = encoders.get_sequential_encoder(
            module_type=settings["main_module"],
            max_sequence_length=max_len,
            max_output_length=GR_OUTPUT_LENGTH + 1,
            embedding_module=embedding,
            interaction_module=interaction,
            input_preproc_module=modules.get(
                "modeling.sequential.input_features_preprocessors",
                "LearnablePositionalEmbeddingInputFeaturesPreprocessor",
            )(
                max_sequence_len=max_len + GR_OUTPUT_LENGTH + 1,
                embedding_dim=dim,
                dropout_rate=settings["dropout_rate"],
            ),
            output_postproc_module=modules.get(
                "modeling.sequential.output_postprocessors", "L2NormEmbeddingPostprocessor"
            )(embedding_dim=dim, eps=1e-6),
            verbose=False,
        )
        self.loss = modules.sampled_softmax()(
            num_to_sample=settings["num_negatives"],
            softmax_temperature=settings["temperature"],
            model=self.model,
        )
        self.negatives = modules.get("modeling.sequential.autoregressive_losses", "LocalNegativesSampler")(
            num_items=num_items,
            item_emb=self.model._embedding_module._item_emb,
            all_item_ids=items,
            l2_norm=settings["item_l2_norm"],
            l2_norm_eps=settings["l2_norm_eps"],
        )
        self.optimizer = torch.optim.AdamW(
            self.model.parameters(),
            lr=settings["learning_rate"],
            betas=(0.9, 0.98),
            weight_decay=settings["weight_decay"],
        )
        self.features = modules.get("modeling.sequential.features", "movielens_seq_features_from_row")
        # generative-recommenders' loss takes the payloads (and returns auxiliary losses); FuXi-α's does not.
        self.takes_payloads = any(
            p.kind is p.VAR_KEYWORD for p in inspect.signature(self.loss.forward).parameters.values()
        )
        self.anomaly = anomaly
        self.rows = self._rows()
        self.model.train()

    def _rows(self) -> Iterator[dict]:
        while True:
            yield from self.loader

    def step(self) -> float:
        torch.autograd.set_detect_anomaly(self.anomaly)
        features, target_ids, _ = self.features(
            next(self.rows), device="cpu", max_output_length=GR_OUTPUT_LENGTH + 1
        )
        features.past_ids.scatter_(dim=1, index=features.past_lengths.view(-1, 1), src=target_ids.view(-1, 1))
        self.optimizer.zero_grad()
        inputs = self.model.get_item_embeddings(features.past_ids)
        outputs = self.model(
            past_lengths=features.past_lengths,
            past_ids=features.past_ids,
            past_embeddings=inputs,
            past_payloads=features.past_payloads,
        )
        supervision = features.past_ids
        self.negatives._item_emb = self.model._embedding_module._item_emb
        loss = self.loss(
            lengths=features.past_lengths,
            output_embeddings=outputs[:, :-1, :],
            supervision_ids=supervision[:, 1:],
            supervision_embeddings=inputs[:, 1:, :],
            supervision_weights=(supervision[:, 1:] != 0).float(),
            negatives_sampler=self.negatives,
            **(features.past_payloads if self.takes_payloads else {}),
        )
        loss = loss[0] if isinstance(loss, tuple) else loss
        loss.backward()
        self.optimizer.step()
        torch.autograd.set_detect_anomaly(False)
        return loss.item()

    def close(self) -> None:
        pass


# -- timing, side by side ---------------------------------------------------------------------


def timed_block(step: Callable[[], float], steps: int, steps_per_epoch: int) -> dict:
    """``steps`` calls of ``step``: seconds per step and per epoch, peak resident-set growth."""
    with PeakMemory(torch.device("cpu")) as memory:
        start = time.perf_counter()
        for _ in range(steps):
            step()
        seconds = time.perf_counter() - start
    return {"step_s": seconds / steps, "epoch_s": seconds / steps * steps_per_epoch, "peak_mb": memory.mb}


@dataclass
class Contender:
    """One trainer and setting: a label, and a function timing one block."""

    trainer: str
    setting: str
    block: Callable[[], dict]
    reference: bool = False


def ablate_contenders(study_path: Path, variant: str, micro: list[int], precisions: list[str], steps: int):
    contenders = []
    for m in micro:
        study = load_ablate(study_path, micro_batches=m)
        data = study.task.load()
        for precision in precisions:

            def block(study=study, data=data, precision=precision) -> dict:
                row = ablate_epoch(study, variant, data, 1, steps, precision)
                return {"step_s": row["step_s"], "epoch_s": row["epoch_s"], "peak_mb": row["peak_mb"]}

            setting = f"{variant}, {'plain batches' if m == 1 else f'micro_batches: {m}'}, {precision}"
            contenders.append(Contender("ablate", setting, block))
    return contenders


def interleaved(contenders: list[Contender], reps: int) -> dict[int, list[dict]]:
    """Every contender's block, in turn, ``reps`` times; rows per contender."""
    rows: dict[int, list[dict]] = {i: [] for i in range(len(contenders))}
    for rep in range(1, reps + 1):
        for i, contender in enumerate(contenders):
            rows[i].append(contender.block())
            r = rows[i][-1]
            print(
                f"rep {rep}: {contender.trainer} ({contender.setting}): {r['epoch_s']:.2f} s/epoch "
                f"({r['step_s']:.3f} s/step), peak {r['peak_mb']:.0f} MB",
                flush=True,
            )
    return rows


def section(title: str, header: str, groups: list[tuple[list[Contender], dict[int, list[dict]]]]) -> str:
    out = [title, "", header, ""]
    out += [
        "| trainer | setting | s/epoch, by repetition | median s/epoch | × reference "
        "| peak MB (median) | × reference |",
        "|---|---|---|---:|---:|---:|---:|",
    ]
    for contenders, rows in groups:
        reference = next(i for i, c in enumerate(contenders) if c.reference)
        ref_s = statistics.median(r["epoch_s"] for r in rows[reference])
        ref_mb = statistics.median(r["peak_mb"] for r in rows[reference])
        for i, c in enumerate(contenders):
            seconds = statistics.median(r["epoch_s"] for r in rows[i])
            mb = statistics.median(r["peak_mb"] for r in rows[i])
            speed = "—" if c.reference else f"{ref_s / seconds:.2f}×"
            memory = "—" if c.reference or ref_mb <= 0 else f"{mb / ref_mb:.2f}×"
            by_rep = " / ".join(f"{r['epoch_s']:.2f}" for r in rows[i])
            out.append(
                f"| {c.trainer} | {c.setting} | {by_rep} | {seconds:.2f} | {speed} | {mb:.0f} | {memory} |"
            )
    return "\n".join([*out, ""])


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("path", type=Path, help="a copy of SASRec.pytorch, generative-recommenders or FuXi-alpha")
    p.add_argument("--reps", type=int, default=4, help="repetitions of the interleaved blocks")
    p.add_argument("--threads", type=int, choices=[1, 2], default=2, help="torch threads (both trainers)")
    p.add_argument("--steps", type=int, help="training steps per block (default: one epoch); prints only")
    p.add_argument("--micro-batches", type=int, nargs="+", help="ablate's micro_batches (default: 1 4)")
    p.add_argument(
        "--precision", nargs="+", choices=["fp32", "bf16"], default=["fp32"], help="ablate's precision"
    )
    p.add_argument(
        "--models", nargs="+", choices=list(GIN), help="generative-recommenders: hstu sasrec; FuXi: fuxi"
    )
    p.add_argument(
        "--anomaly", choices=["on", "off"], default="on", help="autograd anomaly mode, as train_fn sets it"
    )
    p.add_argument("--note", default="", help="what else was running, for the record")
    p.add_argument("--no-write", action="store_true")
    return p


def header(args, steps_note: str, loads: tuple[float, float]) -> str:
    return (
        f"`python benchmarks/reference.py PATH --threads {args.threads} --reps {args.reps}` — "
        f"{date.today()}, torch {torch.__version__}, {args.threads} thread(s) "
        f"({cpu()}); interleaved in one run, {steps_note}; "
        f"peak = resident-set growth during the block. Load average (1 min) {loads[0]:.1f} before, "
        f"{loads[1]:.1f} after.{(' ' + args.note) if args.note else ''}"
    )


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    try:
        which, root = locate(args.path)
    except Refused as exc:
        print(f"benchmarks/reference.py: {exc}")
        return 2
    torch.set_num_threads(args.threads)
    before = os.getloadavg()[0]
    print(f"reference: {which} at {root}", flush=True)
    if which == SASREC_PYTORCH:
        title, groups, closers, steps_note = run_sasrec(root, args)
    else:
        try:
            import gin  # noqa: F401
        except ImportError:
            print(f"benchmarks/reference.py: {which}'s modules import gin: pip install gin-config")
            return 2
        try:
            title, groups, closers, steps_note = run_authors(which, root, args)
        except Refused as exc:
            print(f"benchmarks/reference.py: {exc}")
            return 2
    for close in closers:
        close()
    text = section(title, header(args, steps_note, (before, os.getloadavg()[0])), groups)
    print(text)
    if args.steps is None and not args.no_write:
        write_section(title, text)
    return 0


def run_sasrec(root: Path, args):
    study = load_ablate(SASREC)
    reference = SasrecPytorch(root, study.task.data_path())
    steps = args.steps or reference.steps_per_epoch
    reference.step()  # untimed: its sampling processes start up
    contenders = [
        Contender(
            SASREC_PYTORCH,
            "main.py: BCE 1 negative, Adam, its WarpSampler",
            lambda: timed_block(reference.step, steps, reference.steps_per_epoch),
            reference=True,
        ),
        *ablate_contenders(SASREC, "base", args.micro_batches or [1, 4], args.precision, steps),
    ]
    rows = interleaved(contenders, args.reps)
    title = f"## Side by side: SASRec.pytorch, {args.threads} thread(s)"
    note = f"one epoch = {reference.steps_per_epoch} steps of 128" + (
        f", {steps} steps timed per block" if args.steps else ""
    )
    return title, [(contenders, rows)], [reference.close], note


def run_authors(which: str, root: Path, args):
    sys.path.insert(0, str(root))
    try:
        import fbgemm_gpu  # noqa: F401  (registers torch.ops.fbgemm.*, as their main.py does)
    except ImportError as exc:
        raise Refused(
            f"{which}'s models call fbgemm's jagged ops: pip install fbgemm-gpu-cpu ({exc})"
        ) from exc
    package = (
        "generative_recommenders.research" if which == GENERATIVE_RECOMMENDERS else "generative_recommenders"
    )
    modules = AuthorsModules(root, package)
    study = load_ablate(HSTU_FUXI)
    ratings = study.task.data_path()
    movies = ratings.parent / "movies.dat"
    items = sorted(
        int(line.split("::")[0]) for line in movies.read_text(encoding="latin-1").splitlines() if line
    )
    folder = tempfile.TemporaryDirectory(prefix="reference-")
    table = sequence_table(ratings, Path(folder.name))
    models = args.models or (["fuxi"] if which == FUXI_ALPHA else ["hstu", "sasrec"])
    groups, steps_per_epoch = [], 0
    for name in models:
        trainer = AuthorsTrainer(modules, name, table, items, args.anomaly == "on")
        trainer.step()  # untimed: first-call costs
        steps_per_epoch = trainer.steps_per_epoch
        steps = args.steps or steps_per_epoch
        anomaly = "anomaly detection on, as train_fn" if args.anomaly == "on" else "anomaly detection off"
        contenders = [
            Contender(
                which,
                f"{name}: {GIN[name][0]}, {anomaly}",
                lambda trainer=trainer, steps=steps: timed_block(
                    trainer.step, steps, trainer.steps_per_epoch
                ),
                reference=True,
            ),
            *ablate_contenders(HSTU_FUXI, GIN[name][1], args.micro_batches or [4, 1], args.precision, steps),
        ]
        groups.append((contenders, interleaved(contenders, args.reps)))
    # A title of its own without anomaly detection, so both runs keep their sections.
    off = "" if args.anomaly == "on" else ", authors' anomaly detection off"
    title = f"## Side by side{off}: {which}, {args.threads} thread(s)"
    note = f"ML-1M users 1–2999, one epoch = {steps_per_epoch} steps of 128" + (
        f", {args.steps} steps timed per block" if args.steps else ""
    )
    return title, groups, [folder.cleanup], note


if __name__ == "__main__":
    sys.exit(main())

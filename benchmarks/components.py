"""Forward + backward time and peak memory of every registered component kind.

    python benchmarks/components.py [--batch 128] [--tokens 200] [--dims 64 256] [--reps 5]

Each kind is built through the registry with its default options (heads=2 where a kind has
heads) at ``[b, n, d]``, and timed on one forward + backward (median of ``--reps`` after a
warm-up). Ordered kinds get a causal right-padded batch with timestamps; unordered kinds a
token set with raw values and a readout token. Where a kind has a naive form (explicit einsum
+ masked softmax, as the seed write-ups write it), the naive form is timed beside it and the
ratio reported; the naive form lives here and in the tests, never in the product.

Results are printed and written to benchmarks/RESULTS.md (section "Components").
Absolute times on a shared machine are noisy: compare the ratios within one run.
"""

from __future__ import annotations

import argparse
import math
import statistics
import time
from datetime import date

import torch
import torch.nn.functional as F
from results_file import cpu, write_section  # benchmarks/ is on sys.path when run as a script
from torch import nn

from ablate import registry
from ablate.components import BuildContext, TokenContext, total_auxiliary_loss
from ablate.training.memory import PeakMemory

SECTION = "## Components"
WINDOW = 96  # raw values per token for unordered kinds (a channel's lookback window)


def tokens_for(b: int, n: int, ordered: bool) -> TokenContext:
    g = torch.Generator().manual_seed(0)
    lengths = torch.randint(n // 2, n + 1, (b,), generator=g)
    lengths[0] = n
    valid = torch.arange(n)[None, :] < lengths[:, None]
    times = torch.cumsum(torch.rand(b, n, generator=g) * 86_400, dim=1)
    readout = torch.zeros(b, n, dtype=torch.bool)
    readout[:, 0] = True
    return TokenContext(
        valid=valid,
        causal=ordered,
        positions=torch.arange(n).expand(b, n),
        timestamps=times - times[:, :1] if ordered else None,
        values=None if ordered else torch.randn(b, n, WINDOW, generator=g),
        readout=None if ordered else readout,
    )


def options(cls) -> object:
    fields = cls.Options.model_fields
    return cls.Options(**({"heads": 2} if "heads" in fields else {}))


class NaiveSoftmaxAttention(nn.Module):
    """The seeds' form: explicit q kᵀ, masked softmax, weighted sum (test reference)."""

    def __init__(self, fast: nn.Module):
        super().__init__()
        self.fast = fast

    def forward(self, x: torch.Tensor, tokens: TokenContext) -> torch.Tensor:
        f = self.fast
        b, n, d = x.shape
        q, k, v = (t.view(b, n, f.heads, -1).transpose(1, 2) for t in f.qkv(x).chunk(3, dim=-1))
        logits = torch.einsum("bhie,bhje->bhij", q, k) / math.sqrt(q.shape[-1])
        logits = logits.masked_fill(~tokens.key_mask(), float("-inf"))
        a = F.dropout(logits.softmax(-1), f.dropout_p, f.training)
        return f.out(torch.einsum("bhij,bhje->bhie", a, v).transpose(1, 2).reshape(b, n, d))


def _bias(module, stem, x, tokens):
    """All three bias hooks: embeddings, logits, rotation of per-head q, k."""
    q = k = x.view(*x.shape[:2], 2, -1).transpose(1, 2)
    q, k = module.rotate(q, k, tokens)
    out = module.embed(x, tokens) + (q * k).sum(-1).transpose(1, 2).mean(-1, keepdim=True)
    logits = module.logits(tokens)
    return out if logits is None else out + logits.sum(-1).mean(1, keepdim=True).transpose(1, 2)


# How each slot's kinds are called (the block's calling conventions).
CALLS = {
    "attention": lambda module, stem, x, tokens: module(x, tokens),
    "ffn": lambda module, stem, x, tokens: module(x, tokens.valid),
    "norm": lambda module, stem, x, tokens: module(x),
    "connection": lambda module, stem, x, tokens: stem.reduce(module(stem.expand(x), torch.tanh)),
    "bias": _bias,
}


def step(slot: str, module: nn.Module, stem, x: torch.Tensor, tokens: TokenContext) -> torch.Tensor:
    """One forward of a kind in its slot's calling convention; a scalar to backprop."""
    out = CALLS[slot](module, stem, x, tokens)
    auxiliary = total_auxiliary_loss(module)
    return out.float().pow(2).mean() + (auxiliary if auxiliary is not None else 0.0)


def fwd_bwd(slot, module, stem, x, tokens) -> None:
    loss = step(slot, module, stem, x, tokens)
    if loss.requires_grad:  # `none` kinds return constants
        loss.backward()


def measure(slot, module, stem, b, n, d, tokens, reps) -> tuple[float, float]:
    x = torch.randn(b, n, d, requires_grad=True)
    module.train()
    fwd_bwd(slot, module, stem, x, tokens)  # warm-up
    times = []
    with PeakMemory(torch.device("cpu")) as memory:
        for _ in range(reps):
            x.grad = None
            module.zero_grad(set_to_none=True)
            t0 = time.perf_counter()
            fwd_bwd(slot, module, stem, x, tokens)
            times.append(time.perf_counter() - t0)
    return statistics.median(times) * 1e3, memory.mb


def run(batch: int, n: int, dims: list[int], reps: int) -> list[dict]:
    rows = []
    for d in dims:
        for slot in registry.COMPONENT_SLOTS:
            for kind in registry.kinds(slot):
                cls = registry.get(slot, kind)
                opts = options(cls)
                ordered = not cls.unordered_only
                features = frozenset({"timestamps"} if ordered else {"values", "readout"})
                ctx = BuildContext(
                    dim=d, dropout=0.1, max_len=n, ordered=ordered, features=features, values_width=WINDOW
                )
                tokens = tokens_for(batch, n, ordered)
                torch.manual_seed(0)
                module = cls(opts, ctx)
                stem = cls.stem(opts, ctx) if slot == "connection" else None
                ms, mb = measure(slot, module, stem, batch, n, d, tokens, reps)
                row = {"d": d, "slot": slot, "kind": cls.describe(opts), "ms": ms, "mb": mb, "naive": None}
                if slot == "attention" and kind == "softmax":
                    naive_ms, naive_mb = measure(
                        slot, NaiveSoftmaxAttention(module), None, batch, n, d, tokens, reps
                    )
                    row["naive"] = (naive_ms, naive_mb)
                rows.append(row)
                print(f"d={d:<4} {slot:<10} {row['kind']:<34} {ms:8.1f} ms {mb:8.1f} MB", flush=True)
    return rows


def table(rows: list[dict], batch: int, n: int, reps: int) -> str:
    head = (
        f"{SECTION}\n\n"
        f"`python benchmarks/components.py` — {date.today()}, torch {torch.__version__}, "
        f"{torch.get_num_threads()} CPU threads ({cpu()}); "
        f"B={batch}, N={n}, forward + backward, median of {reps}; peak memory = resident-set growth "
        f"during the timed steps. Ordered kinds: causal, right-padded (lengths N/2..N), with timestamps; "
        f"unordered kinds: token sets with {WINDOW}-wide raw values.\n\n"
        "| d | slot | kind (heads=2 where applicable) | fwd+bwd ms | peak MB "
        "| naive form: ms (×slower) | naive peak MB |\n"
        "|---:|---|---|---:|---:|---:|---:|\n"
    )
    lines = []
    for r in rows:
        naive = ("—", "—")
        if r["naive"]:
            naive = (f"{r['naive'][0]:.1f} (×{r['naive'][0] / r['ms']:.2f})", f"{r['naive'][1]:.0f}")
        lines.append(
            f"| {r['d']} | {r['slot']} | {r['kind']} | {r['ms']:.1f} | {r['mb']:.0f} "
            f"| {naive[0]} | {naive[1]} |"
        )
    return head + "\n".join(lines) + "\n"


def write(section: str) -> None:
    write_section(SECTION, section)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=128)
    parser.add_argument("--tokens", type=int, default=200)
    parser.add_argument("--dims", type=int, nargs="+", default=[64, 256])
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--no-write", action="store_true")
    args = parser.parse_args()
    rows = run(args.batch, args.tokens, args.dims, args.reps)
    section = table(rows, args.batch, args.tokens, args.reps)
    print(section)
    if not args.no_write:
        write(section)


if __name__ == "__main__":
    main()

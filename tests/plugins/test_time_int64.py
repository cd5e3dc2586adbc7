"""Timestamps reach the time buckets exactly (issue 37): the seqrec batches keep whole seconds in
float64 from the data to the bucket function, so a gap right beside a bucket edge falls on the side
the data put it, as in the authors' int64 code. Expected buckets come from exact decimal arithmetic,
not from the function under test."""

from __future__ import annotations

import math
from decimal import Decimal, localcontext

import numpy as np
import pytest
import torch

from ablate.components import BuildContext
from ablate_plugins import attention_parts
from ablate_plugins.attention import AMSAttention, TimeIntervalAttention
from ablate_plugins.bias import LogTimeGap, RelativeTime
from ablate_plugins.seqrec import Interactions
from ablate_plugins.seqrec.batches import collate, eval_batches

STEP = 0.301  # HSTU's / FuXi-α's bucket width in ln seconds
ORIGIN = 978_300_760  # ML-1M's first rating (2000-12-31): float32 spaces numbers here 64 s apart


def exact_bucket(gap: int, buckets: int = 128) -> int:
    """The largest k ≤ buckets with exp(k · 0.301) ≤ max(gap, 1), in 60-digit decimals."""
    with localcontext() as ctx:
        ctx.prec = 60
        step, x = Decimal(STEP), Decimal(max(gap, 1))
        k = 0
        while k < buckets and (step * (k + 1)).exp() <= x:
            k += 1
        return k


def edge_gaps(top: int = 62) -> list[int]:
    """Whole-second gaps on both sides of every bucket edge exp(k · 0.301) up to k = ``top``
    (1.3e8 s, four years): ⌊e⌋ − 1, ⌊e⌋, ⌈e⌉, ⌈e⌉ + 1."""
    gaps = set()
    for k in range(1, top + 1):
        with localcontext() as ctx:
            ctx.prec = 60
            edge = (Decimal(STEP) * k).exp()
        low = int(edge)  # ⌊e⌋: e is never a whole number
        gaps.update(g for g in (low - 1, low, low + 1, low + 2) if g >= 1)
    return sorted(gaps)


def window_batch(gaps: list[int]):
    """One user per gap: items at ORIGIN and ORIGIN + gap (absolute epoch seconds, as the files
    hold them), the request time of the last position 1 s later."""
    times = [np.array([ORIGIN, ORIGIN + g], dtype=np.float64) for g in gaps]
    items = [np.array([1, 2]) for _ in gaps]
    next_times = np.array([ORIGIN + g + 1 for g in gaps], dtype=np.float64)
    return collate(items, items, times, np.arange(len(gaps)), next_times)


def test_batch_times_are_float64_whole_seconds_from_the_data():
    data = Interactions(
        users=np.array([1, 2]),
        sequences=[np.array([1, 2, 3, 4, 5]), np.array([3, 1, 2, 4])],
        timestamps=[
            np.array([ORIGIN, ORIGIN + 1, ORIGIN + 94_608_001, ORIGIN + 94_608_002, ORIGIN + 94_608_063.0]),
            np.array([ORIGIN + 7, ORIGIN + 8, ORIGIN + 9, ORIGIN + 10.0]),
        ],
        num_items=5,
        item_ids=np.r_[-1, 1:6],
        source="two users",
    )
    ((batch, _, rows),) = eval_batches(data, "test", max_len=50, batch_size=8)
    assert batch.timestamps.dtype == torch.float64 and batch.request_times.dtype == torch.float64
    user = rows.tolist().index(0)
    # Three years then one second: float32 seconds since the window's start would read 94,608,000
    # and 94,608,000 (a zero gap); float64 keeps both.
    assert batch.timestamps[user].tolist() == [0, 1, 94_608_001, 94_608_002]
    assert batch.request_times[user].tolist() == [1, 94_608_001, 94_608_002, 94_608_063]


@pytest.mark.parametrize("kind", ["rel_time", "ams"])
def test_the_bucket_function_receives_the_exact_float64_gaps(monkeypatch, kind):
    gaps = edge_gaps()
    batch = window_batch(gaps)
    seen = []

    def spy(dt, buckets, log_base_step=STEP):
        seen.append(dt)
        return buckets_of(dt, buckets, log_base_step)

    buckets_of = attention_parts.time_buckets
    monkeypatch.setattr(attention_parts, "time_buckets", spy)
    ctx = BuildContext(dim=4, max_len=4, features=frozenset({"timestamps"}))
    tokens = batch.token_context()
    if kind == "rel_time":
        RelativeTime(RelativeTime.Options(time_reference="request"), ctx).logits(tokens)
    else:
        attention = AMSAttention(AMSAttention.Options(time_reference="request"), ctx)
        attention(torch.randn(len(gaps), 2, 4), tokens)
    (dt,) = seen
    assert dt.dtype == torch.float64
    # Query 0's request time is the second item's: τ_0 − t_0 is the gap itself.
    assert dt[:, 0, 0].tolist() == [float(g) for g in gaps]
    assert torch.equal(dt, dt.round())


def test_buckets_beside_their_edges_match_exact_arithmetic():
    gaps = edge_gaps()
    batch = window_batch(gaps)
    expected = [exact_bucket(g) for g in gaps]
    assert len(set(expected)) > 50  # the gaps cover the buckets up to four years
    request, times = batch.request_times, batch.timestamps
    got = attention_parts.time_buckets(request[:, :, None] - times[:, None, :], 128)[:, 0, 0]
    assert got.tolist() == expected
    # The same windows in float32 seconds from the window's start (the earlier batches) put some
    # of these gaps in the neighbouring bucket: the check above can fail.
    old = attention_parts.time_buckets(request.float()[:, :, None] - times.float()[:, None, :], 128)
    assert (old[:, 0, 0] != torch.tensor(expected)).any()


def test_intervals_and_log_gaps_read_the_float64_times():
    far = 2**25 + 1  # a year and a month: float32 holds only every 4th second here
    times = [np.array([ORIGIN, ORIGIN + far, ORIGIN + far + 1], dtype=np.float64)]
    items = [np.array([1, 2, 3])]
    tokens = collate(items, items, times, np.arange(1)).token_context()
    ctx = BuildContext(dim=4, max_len=4, features=frozenset({"timestamps"}))
    # TiSASRec's interval: the gap over the user's smallest gap (1 s, float32 would make it 4 s or
    # lose it), clipped to k = 256.
    attention = TimeIntervalAttention(TimeIntervalAttention.Options(max_interval=256), ctx)
    assert attention.intervals(tokens)[0, 2].tolist() == [256, 1, 0]
    # log_time_gap in a float32 module: float32 logits from the float64 gaps.
    channel = LogTimeGap(LogTimeGap.Options(max_gap=1e12), ctx)
    logits = channel.logits(tokens)
    assert logits.dtype == torch.float32
    expected = [math.log1p(g) / math.log1p(1e12) for g in (far + 1, 1, 0)]
    assert logits[0, 0, 2].tolist() == pytest.approx(expected, rel=1e-6)

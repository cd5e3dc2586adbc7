"""A kind from a separate, out-of-tree distribution is discovered through its entry points."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pandas as pd
import pytest

PLUGIN = textwrap.dedent('''
    """An out-of-tree plugin: causal mean-pooling token mixer, and a bias that needs time."""
    import torch
    from torch import nn
    from ablate.components import Attention, BiasChannel, Options


    class MeanOptions(Options):
        scale: float = 1.0


    class CausalMean(Attention):
        Options = MeanOptions

        def __init__(self, options, ctx):
            super().__init__(options, ctx)
            self.proj = nn.Linear(ctx.dim, ctx.dim)

        def forward(self, x, tokens):  # x: [b, n, d]
            weights = tokens.key_mask()[:, 0].to(x.dtype)  # [b, n, n]
            weights = weights / weights.sum(-1, keepdim=True)
            return self.proj(self.options.scale * weights @ x)


    class NeedsTime(BiasChannel):
        requires = frozenset({"timestamps"})
''')


@pytest.fixture
def out_of_tree(tmp_path):
    """A real installed-distribution layout (module + *.dist-info) on a new sys.path entry."""
    site = tmp_path / "site"
    dist = site / "tiny_mixer-0.1.dist-info"
    dist.mkdir(parents=True)
    (site / "tiny_mixer.py").write_text(PLUGIN)
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: tiny-mixer\nVersion: 0.1\n")
    (dist / "entry_points.txt").write_text(
        "[ablate.attention]\ncausal_mean = tiny_mixer:CausalMean\n\n"
        "[ablate.bias]\nneeds_time = tiny_mixer:NeedsTime\n"
    )
    (dist / "RECORD").write_text("")
    return site


def _ablate(site, *args, cwd):
    env = {**__import__("os").environ, "PYTHONPATH": str(site)}
    return subprocess.run(
        [sys.executable, "-m", "ablate.commands.cli", *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )


@pytest.mark.heavy
def test_out_of_tree_attention_runs_a_study(out_of_tree, write_study, tmp_path):
    listed = _ablate(out_of_tree, "components", "attention", cwd=tmp_path)
    assert listed.returncode == 0, listed.stderr
    assert "causal_mean" in listed.stdout and "tiny-mixer 0.1" in listed.stdout and "scale" in listed.stdout

    study = write_study(
        {"variants": {"mean": {"attention": {"kind": "causal_mean", "scale": 0.5}}}, "seeds": [0]}
    )
    ran = _ablate(out_of_tree, "run", study, "--quiet", cwd=tmp_path)
    assert ran.returncode == 0, ran.stderr
    results = pd.read_csv(tmp_path / "runs" / "tiny" / "report" / "results.csv")
    row = results.set_index("variant").loc["mean"]
    assert row["component.attention"] == "causal_mean(scale=0.5)"
    assert 0 <= row["test.ndcg@10"] <= 1


def test_incompatible_kind_fails_validation_naming_both_parts(out_of_tree, write_study, tmp_path):
    study = write_study(
        {
            "task": {"data": {"timestamps": False}},
            "variants": {"t": {"bias": [{"kind": "abs_pos"}, {"kind": "needs_time"}]}},
        }
    )
    checked = _ablate(out_of_tree, "validate", study, cwd=tmp_path)
    assert checked.returncode == 2
    line = checked.stderr.strip()
    assert len(line.splitlines()) == 1
    assert (
        "variants.t.bias.1.kind" in line
        and "needs_time" in line
        and "timestamps" in line
        and "seqrec" in line
    )


def test_unknown_kind_without_the_plugin(write_study, cli):
    code, _, err = cli(
        "validate", write_study({"variants": {"mean": {"attention": {"kind": "causal_mean"}}}})
    )
    assert code == 2 and "unknown attention kind 'causal_mean'" in err

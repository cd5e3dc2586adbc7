"""The bad-input corpus, part 1: study files and overrides. Every case stops before any training
with exit status 2 and one line naming the study file's line and the key at fault (or the
override), from ``ablate validate`` as from ``ablate run``: wrong types (a bool for a number),
repeated keys, YAML and TOML syntax, encodings, hostile documents (alias bombs, recursive aliases,
Python tags, huge files), sizes that are zero or negative, shapes a component refuses (``dim``
not divisible by ``heads``) in the base, a variant, a grid point or a search choice, absurd sizes
(refused with an estimate), unknown keys in every section, and bad overrides."""

from __future__ import annotations

import textwrap

import pytest
from corpus import Case, check, study_text

FILE = "study.yaml"


def at(text: str, needle: str, nth: int = 1) -> str:
    """``study.yaml:N`` for the line holding the ``nth`` occurrence of ``needle``."""
    start = -1
    for _ in range(nth):
        start = text.index(needle, start + 1)
    return f"{FILE}:{text.count(chr(10), 0, start) + 1}"


def yaml_case(id: str, text: str, *expect: str, **more) -> Case:
    return Case(id, {FILE: text}, tuple(expect), **more)


def patched(id: str, needle: str, *expect: str, patch=None, replace=None, drop=(), nth: int = 1) -> Case:
    """The tiny study with ``patch`` / ``replace`` / ``drop``; the line holding ``needle`` expected."""
    text = study_text(patch, replace, drop)
    return yaml_case(id, text, at(text, needle, nth), *expect)


def edited(id: str, old: str, new: str, needle: str, *expect: str) -> Case:
    """The tiny study's text with ``old`` replaced by ``new`` (what a YAML dump cannot write)."""
    text = study_text()
    assert old in text, old
    text = text.replace(old, new, 1)
    return yaml_case(id, text, at(text, needle), *expect)


def overridden(id: str, *overrides: str, expect: tuple[str, ...], text: str | None = None) -> Case:
    args = ("{command}", "{dir}/study.yaml", *overrides)
    return Case(id, {FILE: text or study_text()}, expect, args=args)


HEADS_3 = {"model": {"attention": {"heads": 3}}}  # the tiny study's dim is 16
TOML = textwrap.dedent("""\
    name = "t"
    seeds = [0]
    [task]
    kind = "seqrec"
    data = {format = "synthetic", users = 60, items = 40, min_len = 5, max_len = 10}
    max_len = 10
    [model]
    dim = 16
    [train]
    epochs = 1
    [metrics]
    primary = "ndcg@10"
""")
BOMB = "\n".join(
    ['a: &a ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]']
    + [f"{b}: &{b} [{','.join(['*' + a] * 9)}]" for a, b in zip("abcdefgh", "bcdefghi", strict=True)]
)
# Each level repeats the one before ten times: 111,111 values from 100 characters.
OVERRIDE_BOMB = (
    "seeds=[&a [1,1,1,1,1,1,1,1,1,1], "
    + ", ".join(
        f"{'&' + b + ' ' if b else ''}[{','.join(['*' + a] * 10)}]"
        for a, b in zip("abcd", ["b", "c", "d", ""], strict=True)
    )
    + "]"
)

CASES = [
    # -- a bool or a string where a number goes ------------------------------------------
    patched("bool-epochs", "epochs:", "train.epochs", "integer", "True", patch={"train": {"epochs": True}}),
    patched("bool-lr", "lr:", "train.lr", "number", patch={"train": {"lr": False}}),
    patched("bool-dim", "dim:", "model.dim", "integer", patch={"model": {"dim": True}}),
    patched("bool-heads", "heads:", "model.attention.heads", patch={"model": {"attention": {"heads": True}}}),
    patched("bool-task-max-len", "max_len:", "task.max_len", patch={"task": {"max_len": True}}, nth=2),
    patched("bool-users", "users:", "task.data.users", patch={"task": {"data": {"users": True}}}),
    patched("bool-seed", "- true", "seeds.0", "integer", replace={"seeds": [True]}),
    patched(
        "bool-negatives",
        "negatives:",
        "train.loss.negatives",
        "integer",
        patch={"train": {"loss": {"negatives": True}}},
    ),
    patched("bool-alpha", "alpha:", "report.alpha", "number", patch={"report": {"alpha": True}}),
    patched("bool-beta", "- true", "train.betas.1", "number", patch={"train": {"betas": [0.9, True]}}),
    patched(
        "bool-variant-dim", "dim: false", "variants.wide.dim", patch={"variants": {"wide": {"dim": False}}}
    ),
    patched(
        "bool-search-bound",
        "model.blocks:",
        "search.space.model.blocks",
        "integer",
        patch={"search": {"trials": 2, "space": {"model.blocks": {"type": "int", "low": True, "high": 2}}}},
    ),
    patched("string-dim", "dim:", "model.dim", "'big'", patch={"model": {"dim": "big"}}),
    # -- a key given twice: the later one would silently win ---------------------------------
    edited(
        "duplicate-variant",
        "variants:\n  mlp:\n",
        "variants:\n  mlp:\n    dropout: 0.2\n  mlp:\n",
        "  mlp:\n    ffn",
        "variants.mlp: duplicate key",
        "first at line 29",
    ),
    edited(
        "duplicate-section", "seeds:\n", "train: {epochs: 1}\nseeds:\n", "train: {", "train: duplicate key"
    ),
    edited(
        "duplicate-model-key",
        "  dropout: 0.1\n",
        "  dropout: 0.1\n  dim: 32\n",
        "  dim: 32",
        "model.dim: duplicate key (first at line 13)",
    ),
    edited(
        "duplicate-flow-key",
        "  - kind: abs_pos\n",
        "  - {kind: abs_pos, kind: rope}\n",
        "  - {kind",
        "model.bias.0.kind: duplicate key (earlier on this line)",
    ),
    Case(
        "duplicate-toml-key",
        {"study.toml": TOML.replace("dim = 16\n", "dim = 16\ndim = 32\n")},
        ("study.toml:9", "model.dim: duplicate key (first at line 8)"),
        args=("{command}", "{dir}/study.toml"),
    ),
    # -- YAML syntax: the parser's own words, at the line to look at -------------------------
    edited("yaml-tab", "  dim: 16\n", "\tdim: 16\n", "\tdim", "found character '\\t'", "tabs"),
    edited(
        "yaml-unclosed-brace",
        "  dim: 16\n",
        "  dim: {x: 1, y: 2\n",
        "  dim: {",
        "expected ',' or '}'",
        "not closed",
    ),
    edited("yaml-unclosed-list", "seeds:\n- 0\n- 1\n", "seeds: [0, 1\n", "seeds: [", "expected ',' or ']'"),
    edited("yaml-bad-indent", "  blocks: 1\n", " blocks: 1\n", " blocks: 1", "expected <block end>"),
    edited("yaml-unclosed-quote", "name: tiny\n", "name: 'tiny\n", "name:", "quoted scalar", "not closed"),
    edited("yaml-two-documents", "output:", "---\noutput:", "---", "single document"),
    edited("yaml-undefined-alias", "  dim: 16\n", "  dim: *width\n", "*width", "undefined alias 'width'"),
    # -- TOML: its errors have lines too ---------------------------------------------------
    Case(
        "toml-syntax",
        {"study.toml": TOML.replace("epochs = 1", "epochs = ")},
        ("study.toml:10", "not valid TOML", "Invalid value"),
        args=("{command}", "{dir}/study.toml"),
    ),
    Case(
        "toml-unknown-key",
        {"study.toml": TOML.replace("dim = 16", "dimm = 16")},
        ("study.toml:8", "model.dimm: unknown key"),
        args=("{command}", "{dir}/study.toml"),
    ),
    Case(
        "toml-bool-epochs",
        {"study.toml": TOML.replace("epochs = 1", "epochs = true")},
        ("study.toml:10", "train.epochs", "integer"),
        args=("{command}", "{dir}/study.toml"),
    ),
    # -- what the file is: encoding, size, hostile documents ------------------------------
    Case(
        "latin1-byte",
        {FILE: study_text().replace("name: tiny", "name: tiny\ndescription: caf\xe9").encode("latin-1")},
        (f"{FILE}:2", "not UTF-8", "0xe9"),
    ),
    yaml_case("recursive-alias", study_text() + "extra: &loop [1, *loop]\n", "recursive alias", f"{FILE}:47"),
    yaml_case("alias-bomb", BOMB + "\n", "holds over 100,000 values", f"{FILE}:6"),
    yaml_case(
        "deep-nesting", study_text() + "extra: " + "[" * 5000 + "]" * 5000 + "\n", f"{FILE}:47", "nested"
    ),
    Case(
        "toml-deep-nesting",
        {"study.toml": TOML + "extra = " + "[" * 5000 + "]" * 5000 + "\n"},
        ("study.toml:13", "nested over 64 levels"),
        args=("{command}", "{dir}/study.toml"),
    ),
    yaml_case("empty-file", "", FILE, "must be a mapping"),
    yaml_case("huge-document", study_text() + "# " + "x" * (5 * 2**20) + "\n", FILE, "over 4 MB"),
    edited(
        "python-tag",
        "name: tiny",
        "name: !!python/object/apply:os.system ['true']",
        "name:",
        "could not determine a constructor",
        "python/object/apply:os.system",
    ),
    edited("python-name-tag", "  dim: 16", "  dim: !!python/name:os.getcwd ''", "  dim:", "python/name"),
    yaml_case("not-a-mapping", "- name: tiny\n", FILE, "must be a mapping"),
    # -- sizes that are zero or negative ------------------------------------------------
    patched("zero-dim", "dim:", "model.dim", "greater than 0", patch={"model": {"dim": 0}}),
    patched("negative-blocks", "blocks:", "model.blocks", patch={"model": {"blocks": -1}}),
    patched("zero-heads", "heads:", "model.attention.heads", patch={"model": {"attention": {"heads": 0}}}),
    patched("zero-batch", "batch_size:", "train.batch_size", patch={"train": {"batch_size": 0}}),
    patched("zero-users", "users:", "task.data.users", patch={"task": {"data": {"users": 0}}}),
    patched("dropout-one", "dropout:", "model.dropout", patch={"model": {"dropout": 1.0}}),
    # -- shapes a component refuses, wherever they are set ------------------------------
    patched("heads-base", "attention:", "model.attention", "not divisible by heads=3", patch=HEADS_3),
    patched(
        "heads-variant",
        "attention:",
        "variants.three.attention",
        "not divisible by heads=3",
        patch={"variants": {"three": {"attention": {"heads": 3}}}},
        nth=2,
    ),
    patched(
        "dim-variant",
        "narrow:",
        "variants.narrow.attention",
        "dim=18 is not divisible by heads=4",
        patch={"model": {"attention": {"heads": 4}}, "variants": {"narrow": {"dim": 18}}},
    ),
    patched(
        "heads-grid",
        "attention.heads:",
        "grid.attention.heads",
        "grid point 'attention.heads=3'",
        patch={"grid": {"attention.heads": [1, 3]}},
    ),
    patched(
        "dim-grid",
        "dim:",
        "grid.dim",
        "grid point 'dim=18'",
        patch={"model": {"attention": {"heads": 4}}, "grid": {"dim": [16, 18]}},
        nth=2,
    ),
    patched(
        "heads-search-choice",
        "model.attention.heads:",
        "search.space.model.attention.heads",
        "3 does not fit variant",
        patch={
            "search": {
                "trials": 2,
                "space": {"model.attention.heads": {"type": "categorical", "choices": [1, 3]}},
            }
        },
    ),
    patched(
        "heads-search-range",
        "model.attention.heads:",
        "search.space.model.attention.heads",
        "3 does not fit",
        patch={
            "search": {"trials": 2, "space": {"model.attention.heads": {"type": "int", "low": 1, "high": 4}}}
        },
    ),
    patched(
        "rope-odd-head-width",
        "odd:",
        "variants.odd: a training step fails: rope",
        "head width is 5 (odd)",
        patch={"variants": {"odd": {"dim": 15, "attention": {"heads": 3}, "bias": [{"kind": "rope"}]}}},
    ),
    # -- absurd sizes: refused with the estimate -------------------------------------------
    edited(
        "dim-1e9", "  dim: 16", "  dim: 1e9", "  dim:", "model.dim: 1000000000 gives", "parameters", "limit"
    ),
    edited("dim-1.0e+9", "  dim: 16", "  dim: 1.0e+9", "  dim:", "model.dim: 1000000000 gives", "parameters"),
    edited("blocks-1e9", "  blocks: 1", "  blocks: 1e9", "  blocks:", "model.blocks: 1000000000 gives"),
    edited("batch-1e9", "  batch_size: 64", "  batch_size: 1e9", "batch_size:", "train.batch_size", "TB"),
    edited("users-1e12", "    users: 120", "    users: 1e12", "users:", "task.data.users"),
    edited(
        "task-max-len-1e9",
        "  max_len: 16\nmodel",
        "  max_len: 1e9\nmodel",
        "  max_len: 1e9",
        "task.max_len: variant 'base': 1000000000 tokens per row give",
    ),
    patched(
        "ffn-mult-huge",
        "ffn:",
        "variants.wide.ffn",
        "parameters",
        patch={"variants": {"wide": {"ffn": {"kind": "mlp", "mult": 1e11}}}},
        nth=3,
    ),
    # -- unknown keys, in every section -------------------------------------------------
    patched("unknown-top", "modle:", "modle: unknown key", patch={"modle": {"dim": 3}}),
    patched("unknown-task", "maxlen:", "task.maxlen: unknown key", patch={"task": {"maxlen": 3}}),
    patched("unknown-data", "userz:", "task.data.userz: unknown key", patch={"task": {"data": {"userz": 3}}}),
    patched("unknown-model", "dimm:", "model.dimm: unknown key", patch={"model": {"dimm": 3}}),
    patched(
        "unknown-option",
        "head:",
        "model.attention.head: unknown key",
        patch={"model": {"attention": {"head": 2}}},
    ),
    patched("unknown-train", "epoch:", "train.epoch: unknown key", patch={"train": {"epoch": 3}}),
    patched("unknown-loss", "negative:", "train.loss", patch={"train": {"loss": {"negative": 3}}}),
    patched(
        "unknown-vary", "seeds_of:", "train.vary.seeds_of", patch={"train": {"vary": {"seeds_of": True}}}
    ),
    patched(
        "unknown-metrics",
        "secondary:",
        "metrics.secondary: unknown key",
        patch={"metrics": {"secondary": []}},
    ),
    patched("unknown-report", "alfa:", "report.alfa: unknown key", patch={"report": {"alfa": 0.1}}),
    patched(
        "param-group-matches-nothing",
        "params: tpology",
        "train.param_groups.0.params",
        "matches no parameter of any variant",
        patch={"train": {"param_groups": [{"params": "tpology", "lr": 0.01}]}},
    ),
    patched("unknown-search", "trails:", "search.trails: unknown key", patch={"search": {"trails": 3}}),
    patched(
        "unknown-variant-key",
        "ffm:",
        "variants.mlp.ffm: unknown key",
        patch={"variants": {"mlp": {"ffm": {"kind": "mlp"}}}},
    ),
    patched(
        "unknown-grid-key",
        "attention.head:",
        "grid.attention.head: grid point 'attention.head=1': unknown key",
        patch={"grid": {"attention.head": [1, 2]}},
    ),
    patched(
        "unknown-seeds-key",
        "stepp:",
        "seeds.stepp",
        replace={"seeds": {"initial": 3, "max": 5, "stepp": 2}},
    ),
    # -- overrides: the override is named, not a line of the file -----------------------
    overridden("override-bool", "train.epochs=true", expect=("override train.epochs=true", "integer")),
    overridden(
        "override-unknown-key", "model.dimm=3", expect=("override model.dimm=3", "model.dimm: unknown key")
    ),
    overridden(
        "override-shape", "model.attention.heads=3", expect=("override model.attention.heads=3", "heads=3")
    ),
    overridden("override-dim-1e9", "model.dim=1e9", expect=("override model.dim=1e9", "parameters")),
    overridden("override-no-equals", "train.lr", expect=("override train.lr", "expected key=value")),
    overridden("override-crossing", "train.lr.x=1", expect=("override train.lr.x=1", "not a mapping")),
    overridden("override-bad-yaml", "seeds=[0,1", expect=("override seeds=[0,1", "not valid YAML")),
    overridden("override-alias-bomb", OVERRIDE_BOMB, expect=("override seeds=", "holds over 100,000 values")),
    overridden(
        "override-python-tag",
        "train.lr=!!python/name:os.getcwd ''",
        expect=("override train.lr=", "could not determine a constructor"),
    ),
    overridden(
        "override-with-file-heads",
        "model.dim=18",
        expect=(f"{FILE}:16", "model.attention", "dim=18", "with override model.dim=18"),
        text=study_text({"model": {"attention": {"heads": 4}}}),
    ),
]


def test_the_corpus_is_large_enough():
    assert len(CASES) >= 40 and len({c.id for c in CASES}) == len(CASES)


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.id)
def test_bad_input(case, tmp_path, cli, monkeypatch):
    check(case, tmp_path, cli, monkeypatch)

"""Study-file validation: good files resolve, bad ones fail with one line and status 2."""

from __future__ import annotations

import os
import textwrap

import pytest
import torch

from ablate.errors import DataError, StudyError
from ablate.registry import COMPONENT_SLOTS
from ablate.study.load import load_study
from ablate.study.spec import BASE


def test_variants_patch_the_base(write_study):
    study = load_study(
        write_study(
            {
                "variants": {
                    "two-heads": {"attention": {"heads": 2}},
                    "gelu": {"ffn": {"kind": "mlp", "activation": "gelu"}},
                }
            }
        )
    )
    assert list(study.variants) == [BASE, "mlp", "two-heads", "gelu"]
    two = study.variants["two-heads"]
    assert two.attention.options.heads == 2
    assert two.ffn.cls.kind_name() == "pointwise"  # untouched slots keep the base's choice
    assert two.differs_from(study.variants[BASE]) == "attention.heads: 1→2"  # the option, base first
    assert study.variants["gelu"].ffn.options.activation == "gelu"
    assert study.metrics == ["ndcg@10", "hr@10"]


def test_kind_change_replaces_component_options(write_study):
    # The base's softmax 'heads' option must not leak into a kind that lacks it.
    study = load_study(
        write_study(
            {
                "model": {"ffn": {"kind": "mlp", "mult": 3}},
                "variants": {"back": {"ffn": {"kind": "pointwise"}}},
            }
        )
    )
    assert study.variants["back"].ffn.cls.kind_name() == "pointwise"
    assert study.variants[BASE].ffn.options.mult == 3


def test_grid_is_factorial(write_study):
    study = load_study(
        write_study(
            {"grid": {"attention.heads": [1, 2], "ffn.kind": ["pointwise", "mlp"]}}, replace={"variants": {}}
        )
    )
    grid = [v for v in study.variants if v != BASE]
    assert len(grid) == 4
    assert study.variants["attention.heads=2,ffn.kind=mlp"].attention.options.heads == 2
    assert study.variants["attention.heads=2,ffn.kind=mlp"].ffn.cls.kind_name() == "mlp"


def test_toml_is_accepted(write_study):
    text = textwrap.dedent("""
        name = "t"
        seeds = [0]
        [task]
        kind = "seqrec"
        data = {format = "synthetic", users = 50}
        [metrics]
        primary = "hr@10"
    """)
    study = load_study(write_study(text=text, name="s.toml"))
    assert study.task.options.data.users == 50


BAD = [
    # (patch or raw text, expected fragments of the one-line message)
    ({"modle": {"dim": 3}}, [":", "modle: unknown key"]),
    ({"model": {"dim": "big"}}, ["model.dim", "integer", "'big'"]),
    (
        {"model": {"attention": {"kind": "sofmax"}}},
        [
            "model.attention.kind",
            "unknown attention kind 'sofmax'",
            "did you mean 'softmax'",
            "known: ",
            "softmax, ",
        ],
    ),
    ({"model": {"attention": {"kind": "softmax", "head": 2}}}, ["model.attention.head: unknown key"]),
    ({"variants": {"x": {"ffn": {"kind": "nope"}}}}, ["variants.x.ffn.kind", "unknown ffn kind 'nope'"]),
    ({"train": {"epochs": 0}}, ["train.epochs", "greater than 0"]),
    ({"metrics": {"primary": "auc"}}, ["metrics.primary"]),
    ({"report": {"baseline": "nope"}}, ["report.baseline", "not a variant"]),
    ({"seeds": [1, 1]}, ["seeds", "distinct"]),
    ({"train": {"loss": {"kind": "hinge"}}}, ["train.loss"]),
    (
        {
            "model": {
                "norm": {"kind": "layernorm", "placement": "pre_skip_kv"},
                "attention": {"kind": "pointwise"},
            }
        },
        ["model.norm.placement", "'pre_skip_kv'", "attention kind 'pointwise' does not support"],
    ),
    (
        {
            "variants": {"hc": {"connection": {"kind": "hyper"}}},
            "model": {"norm": {"kind": "layernorm", "placement": "pre_skip_kv"}},
        },
        ["norm.placement: 'pre_skip_kv' needs a single-stream connection", "connection kind 'hyper'"],
    ),
    # Closed vocabularies: the key, the name given, the closest known one, all known ones.
    (
        {"model": {"norm": {"kind": "layernorm", "placement": "pree"}}},
        [
            "model.norm.placement: unknown norm placement 'pree'; did you mean 'pre'?",
            "known: 'pre', 'post', ",
        ],
    ),
    (
        {"variants": {"x": {"norm": {"placement": "post_skip"}}}},
        ["variants.x.norm.placement: unknown norm placement 'post_skip'; did you mean 'pre_skip'?"],
    ),
    (
        {"model": {"init": "xavier"}},
        ["model.init: unknown initialiser 'xavier'; did you mean 'xavier_normal'?"],
    ),
    (
        {"train": {"optimizer": "adamm"}},
        ["train.optimizer: unknown optimizer 'adamm'; did you mean 'adam'?", "(known: 'adam', 'adamw')"],
    ),
    # What every trial would fail on is refused before training (issue 40, item 5).
    ({"train": {"weight_decay": float("inf")}}, ["train.weight_decay", "finite number"]),
    ({"train": {"lr": float("nan")}}, ["train.lr", "finite number"]),
    ({"train": {"betas": [1.5, 0.9]}}, ["train.betas.0", "less than 1"]),
    ({"seeds": [0, 2**64]}, ["seeds.1", "from 0 to 2**64 - 1"]),
    ({"seeds": [-1]}, ["seeds.0", "from 0 to 2**64 - 1"]),
    ({"train": {"loss": {"negatives": 10**9}}}, ["train.loss.negatives", "only 60 items to draw them from"]),
    # Names become file names: no control characters, none past a file system's limit.
    ({"variants": {"a\0b": {}}}, ["variants: variant name 'a\\x00b' is empty or holds a control character"]),
    ({"variants": {"v" * 150: {}}}, ["variants: variant name 'vvvvvvvvvvvvvvvvvvvv'… has 150 characters"]),
    ({"name": "x" * 260}, ["name: String should have at most 100 characters"]),
    # micro-batching is the training step's: an old study file is told where it went.
    ({"task": {"micro_batches": 4}}, ["task.micro_batches: moved to train.micro_batches"]),
    ({"train": {"compile": "fast"}}, ["train.compile", "'off', 'default' or 'reduce-overhead'"]),
]


@pytest.mark.parametrize("patch,fragments", BAD, ids=[f[1][0] for f in BAD])
def test_bad_study_one_line_exit_2(write_study, cli, patch, fragments):
    path = write_study(patch)
    code, out, err = cli("validate", path)
    assert code == 2
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert "Traceback" not in err
    assert lines[0].startswith(f"error: {path}")
    for fragment in fragments:
        assert fragment in lines[0], (fragment, lines[0])


def test_reduce_overhead_without_cuda_is_a_warning(write_study, cli, monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    code, _, err = cli("validate", write_study({"train": {"compile": "reduce-overhead"}}))
    assert code == 0, err
    assert "train.compile: reduce-overhead replays the compiled step as CUDA graphs" in err
    assert "on cpu it compiles as default" in err
    code, _, err = cli("validate", write_study({"train": {"compile": "default"}}, name="default.yaml"))
    assert code == 0 and "train.compile" not in err


@pytest.mark.parametrize("device", ["cuda", "cuda:1", "mps"])
def test_a_device_this_machine_lacks_is_refused_before_training(write_study, cli, monkeypatch, device):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(torch.backends.mps, "is_available", lambda: False)
    code, _, err = cli("validate", write_study({"train": {"device": device}}))
    assert code == 2 and len(err.strip().splitlines()) == 1
    assert f"train.device: '{device}': " in err and "use 'auto' or 'cpu'" in err
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    if device == "cuda:1":  # one GPU visible: cuda:1 is still missing
        code, _, err = cli("validate", write_study({"train": {"device": device}}, name="one.yaml"))
        assert code == 2 and "1 CUDA device(s) visible here" in err


def test_a_task_that_cannot_cut_batches_refuses_micro_batches(write_study, cli):
    tabular = {
        "task": {"kind": "tabular", "data": {"format": "synthetic"}},
        "metrics": {"primary": "rmse"},
        "train.loss": {},
        "model.bias": [],
    }
    path = write_study({"train": {"micro_batches": 2}}, replace=tabular)
    code, _, err = cli("validate", path)
    assert code == 2 and len(err.strip().splitlines()) == 1
    assert "train.micro_batches: the tabular task trains whole batches only" in err
    assert cli("validate", write_study(replace=tabular, name="whole.yaml"))[0] == 0


def test_error_names_the_yaml_line(write_study):
    text = textwrap.dedent("""\
        name: t
        task: {kind: seqrec, data: {format: synthetic}}
        metrics: {primary: ndcg@10}
        model:
          dim: 16
          attention: {kind: softmax, heads: two}
    """)
    with pytest.raises(StudyError) as exc:
        load_study(write_study(text=text))
    assert ":6: model.attention.heads" in str(exc.value)


@pytest.mark.parametrize(
    "line, key",
    [
        (
            "  norm: {kind: layernorm, placement: postnorm}",
            ":6: model.norm.placement: unknown norm placement 'postnorm'",
        ),
        ("  init: kaiming_uniform", ":6: model.init: unknown initialiser 'kaiming_uniform'"),
    ],
)
def test_unknown_vocabulary_name_names_the_yaml_line(write_study, line, key):
    text = (
        textwrap.dedent("""\
        name: t
        task: {kind: seqrec, data: {format: synthetic}}
        metrics: {primary: ndcg@10}
        model:
          dim: 16
    """)
        + line
        + "\n"
    )
    with pytest.raises(StudyError) as exc:
        load_study(write_study(text=text))
    assert key in str(exc.value) and "did you mean" in str(exc.value)


WITH_PARAMS = [
    # (dotted keys applied to variant 'mlp', the same settings written in the study file)
    ({"model.ffn.mult": 3}, {"variants.mlp": {"ffn": {"kind": "mlp", "mult": 3}}}),
    (
        {"model.ffn.kind": "swiglu", "model.ffn.hidden": 24},
        {"variants.mlp": {"ffn": {"kind": "swiglu", "hidden": 24}}},
    ),
    (
        {"model.norm.placement": "post", "model.dim": 24},
        {"variants.mlp": {"ffn": {"kind": "mlp", "mult": 2}, "norm": {"placement": "post"}, "dim": 24}},
    ),
    (
        {"model.connection.kind": "hyper"},
        {"variants.mlp": {"ffn": {"kind": "mlp", "mult": 2}, "connection": {"kind": "hyper"}}},
    ),
    (
        {"model.bias": [{"kind": "rel_pos"}, {"kind": "rope"}]},
        {
            "variants.mlp": {
                "ffn": {"kind": "mlp", "mult": 2},
                "bias": [{"kind": "rel_pos"}, {"kind": "rope"}],
            }
        },
    ),
    ({"train.lr": 0.01, "train.optimizer": "adamw"}, {"train.lr": 0.01, "train.optimizer": "adamw"}),
    (
        {"train.loss.negatives": 3, "model.attention.heads": 2},
        {
            "train.loss": {"kind": "bce", "negatives": 3},
            "variants.mlp": {"ffn": {"kind": "mlp", "mult": 2}, "attention": {"heads": 2}},
        },
    ),
]


@pytest.mark.parametrize("params, written", WITH_PARAMS, ids=[",".join(p) for p, _ in WITH_PARAMS])
def test_with_params_equals_the_study_file_with_those_settings(write_study, tmp_path, params, written):
    """Only what the keys touch is resolved again; the result is what loading the settings gives."""
    study = load_study(write_study())
    changed, variant = study.with_params("mlp", params)
    expected = load_study(write_study(replace=written, name="expected.yaml"))
    want = expected.variants["mlp"]
    assert changed.variants["mlp"] is variant and changed.variants[BASE] is study.variants[BASE]
    assert variant.spec == want.spec and variant.components() == want.components()
    for slot in COMPONENT_SLOTS:
        got, wanted = variant.parts(slot), want.parts(slot)
        assert [(p.cls, p.options) for p in got] == [(p.cls, p.options) for p in wanted], slot
    assert (changed.spec.train, changed.loss) == (expected.spec.train, expected.loss)
    assert study.variants["mlp"].spec.dim == 16 and study.spec.train.lr == 0.003  # the original is untouched


@pytest.mark.parametrize(
    "params, message",
    [
        (
            {"model.norm.placement": "pre_skip_kv", "model.attention.kind": "pointwise"},
            "model.norm.placement: 'pre_skip_kv' takes the attention's keys and values from the "
            "un-normalised stream, which attention kind 'pointwise' does not support (softmax does); "
            "use placement 'pre_skip'",
        ),
        (
            {"model.norm.placement": "pre_skip_kv", "model.connection.kind": "hyper"},
            "model.norm.placement: 'pre_skip_kv' needs a single-stream connection (residual), "
            "but connection kind 'hyper' keeps several streams; use placement 'pre_skip'",
        ),
        (
            {"model.attention.kind": "sofmax"},
            "model.attention.kind: unknown attention kind 'sofmax'; did you mean",
        ),
        (
            {"model.attention.kind": "fr_graph"},
            "model.attention.kind: attention kind 'fr_graph' works on unordered token sets, "
            "but task 'seqrec' has ordered tokens used causally",
        ),
        ({"model.bias": [{"kind": "rel_time"}]}, "model.bias.0.kind: bias kind 'rel_time' needs timestamps"),
        ({"model.init": "xavier"}, "model.init: unknown initialiser 'xavier'; did you mean 'xavier_normal'?"),
        ({"train.loss.kind": "hinge"}, "train.loss: Input tag 'hinge' found using 'kind' does not match"),
        ({"train.lr": -1, "model.dim": 0}, "train.lr: Input should be greater than 0 (got -1)"),
        (
            {"model.dim": 0, "model.attention.kind": "sofmax"},
            "model.dim: Input should be greater than 0 (got 0)",
        ),
        ({"model.ffn.mult.x": 1}, "ffn.mult.x: 'mult' holds no keys"),
        ({"optimizer": "adam"}, "optimizer: not a model.* or train.* key"),
    ],
)
def test_with_params_errors_name_the_key(write_study, params, message):
    study = load_study(write_study({"task": {"data": {"timestamps": False}}}))
    with pytest.raises(StudyError) as exc:
        study.with_params("mlp", params)
    assert str(exc.value).startswith(message)


@pytest.mark.parametrize("special", ["fifo", "/dev/zero"])
def test_a_pipe_or_device_as_data_is_refused_before_it_is_read(write_study, cli, tmp_path, special):
    """Reading a FIFO blocks forever and /dev/zero never ends: refused in one line, unopened."""
    if special == "fifo":
        special = tmp_path / "ratings.dat"
        os.mkfifo(special)
    path = write_study(replace={"task.data": {"format": "movielens", "path": str(special)}})
    code, _, err = cli("validate", path)
    assert code == 2 and len(err.strip().splitlines()) == 1
    assert f"task.data: not a regular file or folder (a pipe, socket or device): {special}" in err


def test_a_symlink_loop_as_data_is_named_as_one_not_as_missing(write_study, cli, tmp_path):
    (tmp_path / "loop.dat").symlink_to(tmp_path / "loop.dat")
    path = write_study(replace={"task.data": {"format": "movielens", "path": str(tmp_path / "loop.dat")}})
    code, _, err = cli("validate", path)
    assert code == 2 and len(err.strip().splitlines()) == 1, err
    assert "task.data: a symbolic link loop (its links never reach a file)" in err and "not found" not in err


def test_missing_data_file(write_study, cli, tmp_path):
    path = write_study(replace={"task.data": {"format": "movielens", "path": "nowhere/u.data"}})
    with pytest.raises(DataError, match="nowhere/u.data"):
        load_study(path)
    code, _, err = cli("validate", path)
    assert code == 2 and len(err.strip().splitlines()) == 1 and "nowhere/u.data" in err


def test_missing_study_file_and_bad_yaml(cli, tmp_path, write_study):
    code, _, err = cli("validate", tmp_path / "absent.yaml")
    assert code == 2 and "study file not found" in err
    code, _, err = cli("validate", write_study(text="name: [unclosed\n"))
    assert code == 2 and "not valid YAML" in err and len(err.strip().splitlines()) == 1


@pytest.mark.parametrize(
    "args, names",
    [
        (("run",), ["ablate run", "Missing argument", "study_file"]),
        (("status", "x.yaml", "--bogus"), ["ablate status", "--bogus"]),
        (("worker", "x.yaml", "--heartbeat", "0"), ["ablate worker", "--heartbeat"]),
        (("run", "x.yaml", "--workers", "many"), ["ablate run", "--workers"]),
        (("frobnicate",), ["frobnicate"]),
    ],
)
def test_bad_cli_argument_is_one_line_exit_2(cli, args, names):
    code, out, err = cli(*args)
    assert code == 2 and out == ""
    assert len(err.strip().splitlines()) == 1 and err.startswith("error: "), err
    assert all(name in err for name in names), err
    assert "╭" not in err and "Traceback" not in err


def test_cli_help_and_no_arguments_show_help(cli):
    code, out, _ = cli("--help")
    assert code == 0 and "run" in out and "validate" in out
    code, out, err = cli()
    assert code == 2 and "validate" in out + err


def test_report_settings_reach_the_report(write_study):
    from ablate.commands.running import report_settings as _settings

    study = load_study(
        write_study({"report": {"alpha": 0.01, "correction": "fdr_bh", "ci": "percentile", "calibration": 0}})
    )
    settings = _settings(None, study)
    chosen = (settings.alpha, settings.correction, settings.ci, settings.calibration)
    assert chosen == (0.01, "fdr_bh", "percentile", 0)
    assert settings.primary == "ndcg@10" and settings.metrics[:2] == ["ndcg@10", "hr@10"]
    assert settings == type(settings).from_json(study.report_settings_json()).model_copy(
        update={"notes": settings.notes}
    )
    # what the study fills in is not the study file's to set: the same one line as a misspelt key
    for key, value in [("primary", "hr@10"), ("variants", ["base"]), ("seed", 3)]:
        with pytest.raises(StudyError, match=rf"study.yaml:\d+: report.{key}: unknown key$"):
            load_study(write_study({"report": {"alpha": 0.01, key: value}}))
    both = r"report.notes: unknown key\n.*report.alpha: .*less than 1 \(got 2\)$"
    with pytest.raises(StudyError, match=both):
        load_study(write_study({"report": {"notes": ["x"], "alpha": 2}}))  # both problems, one line each
    with pytest.raises(StudyError, match=r"report.ci: unknown CI method 'bca'"):
        load_study(write_study({"report": {"ci": "bca"}}))


# -- numbers, parsing, hostile files ------------------------------------------------------


@pytest.mark.parametrize(
    "model, raw, loc",
    [
        ("TrainSpec", {"epochs": True}, ("epochs",)),
        ("TrainSpec", {"lr": False}, ("lr",)),
        ("TrainSpec", {"betas": [0.9, True]}, ("betas", 1)),
        ("TrainSpec", {"eval_batch_size": True}, ("eval_batch_size",)),
        ("ModelSpec", {"dim": True}, ("dim",)),
        ("ModelSpec", {"dropout": True}, ("dropout",)),
        ("SearchSpec", {"trials": True}, ("trials",)),
    ],
)
def test_a_bool_is_no_number_anywhere_in_the_schema(model, raw, loc):
    from pydantic import ValidationError

    import ablate.study.search
    import ablate.study.spec

    cls = getattr(ablate.study.spec, model, None) or getattr(ablate.study.search, model)
    with pytest.raises(ValidationError) as exc:
        cls.model_validate(raw)
    assert exc.value.errors()[0]["loc"] == loc and exc.value.errors()[0]["type"] in ("int_type", "float_type")


def test_a_bool_is_no_number_in_component_and_task_options():
    from pydantic import ValidationError

    from ablate import registry

    for slot, kind, raw in [
        ("attention", "softmax", {"heads": True}),
        ("ffn", "mlp", {"mult": True}),
        ("task", "seqrec", {"max_len": True}),
        ("task", "seqrec", {"data": {"format": "synthetic", "users": False}}),
    ]:
        with pytest.raises(ValidationError):
            registry.get(slot, kind).Options.model_validate(raw)
    # a bool where a bool goes is still one
    assert registry.get("attention", "softmax").Options.model_validate({"bias": False}).bias is False


def test_exponent_strings_are_integers_where_an_integer_goes():
    """PyYAML reads ``1e3`` as a string; an integer field takes it as the number it writes."""
    from pydantic import ValidationError

    from ablate.model.spec import ModelSpec
    from ablate.study.spec import TrainSpec

    assert ModelSpec.model_validate({"dim": "1e3"}).dim == 1000
    assert ModelSpec.model_validate({"dim": "1.5E2"}).dim == 150
    assert TrainSpec.model_validate({"lr": "1e-3"}).lr == 0.001
    for given in ("1.5e0", "1e400", "1e-3"):
        with pytest.raises(ValidationError):
            ModelSpec.model_validate({"dim": given})


def _study_lines(write_study, text: str, name: str = "study.yaml"):
    from ablate.study.file import read_study

    return read_study(write_study(text=text, name=name))


def test_yaml_aliases_and_merge_keys_still_load(write_study):
    raw, lines = _study_lines(
        write_study,
        textwrap.dedent("""\
            shared: &shared {dim: 16, blocks: 1}
            model:
              <<: *shared
              dim: 32
            variants:
              a: *shared
              b: *shared
        """),
    )
    assert raw["model"] == {"dim": 32, "blocks": 1} and raw["variants"]["b"] == {"dim": 16, "blocks": 1}
    assert lines[("model", "dim")] == 4 and lines[("variants", "b")] == 7


def test_an_alias_bomb_is_refused_fast_and_small(write_study):
    import time
    import tracemalloc

    from ablate.study.file import read_study

    rows = ['a: &a ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]']
    rows += [f"{b}: &{b} [{','.join(['*' + a] * 9)}]" for a, b in zip("abcdefgh", "bcdefghi", strict=True)]
    path = write_study(text="\n".join(rows) + "\n")
    tracemalloc.start()
    start = time.perf_counter()
    with pytest.raises(StudyError, match=r"study.yaml:6: .*holds over 100,000 values, each alias counted"):
        read_study(path)
    elapsed, (_, peak) = time.perf_counter() - start, tracemalloc.get_traced_memory()
    tracemalloc.stop()
    assert elapsed < 2 and peak < 50 * 2**20


@pytest.mark.parametrize(
    "text, message",
    [
        ("a: &x [1, *x]\n", r"study.yaml:1: .*recursive alias"),
        ("a:\n  b: &x {c: *x}\n", r"study.yaml:2: .*recursive alias"),
        ("name: x\nname: y\n", r"study.yaml:2: name: duplicate key \(first at line 1\)"),
        ("model: {dim: 1, dim: 2}\n", r"study.yaml:1: model.dim: duplicate key \(earlier on this line\)"),
        ("a: !!python/object/new:os.system [ls]\n", r"study.yaml:1: not valid YAML: .*python/object/new"),
        (
            "a: {b: 1\nc: 2\n",
            r"study.yaml:1: not valid YAML: a flow mapping opened here .* expected ',' or '}'",
        ),
        ("a:\n\tb: 1\n", r"study.yaml:2: not valid YAML: found character '\\t' that cannot start any token"),
    ],
)
def test_yaml_problems_are_one_line_at_their_line(write_study, text, message):
    with pytest.raises(StudyError, match=message):
        _study_lines(write_study, text)


def test_a_study_file_is_utf8_and_small(tmp_path):
    from ablate.study.file import MAX_BYTES, read_study

    path = tmp_path / "study.yaml"
    path.write_bytes(b"name: x\n\ndescription: \xe9t\xe9\n")
    with pytest.raises(StudyError, match=r"study.yaml:3: not UTF-8: byte 0xe9 at column 14"):
        read_study(path)
    path.write_bytes(b"\xef\xbb\xbfname: x\n")  # a byte-order mark is UTF-8 too
    assert read_study(path)[0] == {"name": "x"}
    path.write_bytes(b"# " + b"x" * MAX_BYTES)
    with pytest.raises(StudyError, match="over 4 MB"):
        read_study(path)
    with pytest.raises(StudyError, match="is a folder; give the study file"):
        read_study(tmp_path)
    with pytest.raises(StudyError, match="study file not found"):
        read_study(tmp_path / "absent.yaml")


def test_toml_keys_have_lines(write_study):
    text = textwrap.dedent('''\
        name = "t"
        seeds = [
          0,
          1,
        ]
        description = """
        key = 3
        """
        [task]
        kind = "seqrec"
        data.format = "synthetic"
        [[model.bias]]
        kind = "abs_pos"
        [[model.bias]]
        kind = "rope"
        [model.attention]
        kind = "softmax"
    ''')
    raw, lines = _study_lines(write_study, text, "s.toml")
    assert raw["model"]["bias"][1] == {"kind": "rope"}
    assert lines[("seeds",)] == 2 and ("key",) not in lines and ("description", "key") not in lines
    assert lines[("task", "data", "format")] == 11 and lines[("task", "data")] == 11
    assert lines[("model", "bias", 0, "kind")] == 13 and lines[("model", "bias", 1)] == 14
    assert lines[("model", "attention", "kind")] == 17


@pytest.mark.parametrize(
    "text, message",
    [
        ('name = "t"\n[task]\nkind = \n', r"s.toml:3: not valid TOML: Invalid value \(column 8\)"),
        ('name = "t"\nname = "u"\n', r"s.toml:2: name: duplicate key \(first at line 1\)"),
        ('[task]\nkind = "a"\n[task]\n', r"s.toml:3: task: duplicate key \(first at line 1\)"),
    ],
)
def test_toml_problems_have_lines(write_study, text, message):
    with pytest.raises(StudyError, match=message):
        _study_lines(write_study, text, "s.toml")


def test_toml_schema_errors_name_the_line(write_study):
    text = textwrap.dedent("""\
        name = "t"
        [task]
        kind = "seqrec"
        data = {format = "synthetic", users = 50}
        [model]
        dim = 16
        blocks = true
        [metrics]
        primary = "hr@10"
    """)
    with pytest.raises(StudyError, match=r"s.toml:7: model.blocks: Input should be a valid integer"):
        load_study(write_study(text=text, name="s.toml"))


@pytest.mark.parametrize("native", [True, False])
def test_bf16_on_a_cpu_without_bf16_instructions_is_a_warning(write_study, cli, monkeypatch, native):
    monkeypatch.setattr(torch.cpu, "_is_avx512_bf16_supported", lambda: native)
    monkeypatch.setattr(torch.cpu, "_is_amx_tile_supported", lambda: False)
    code, _, err = cli("validate", write_study({"train": {"device": "cpu", "precision": "bf16"}}))
    assert code == 0, err
    assert ("bf16 on a CPU without bf16 instructions" in err) is not native, err
    fp32 = write_study({"train": {"device": "cpu", "precision": "fp32"}}, name="fp32.yaml")
    code, _, err = cli("validate", fp32)
    assert code == 0 and "bf16 instructions" not in err


def test_off_written_bare_is_the_word_off(write_study, cli):
    """YAML 1.1 reads a bare ``off`` as false: ``pack: off`` and ``compile: off``, as the README
    writes them, in a study file and as overrides, are the options' ``off``."""
    text = write_study().read_text().replace("train:\n", "train:\n  pack: off\n  compile: off\n", 1)
    path = write_study(text=text, name="bare.yaml")
    assert "  pack: off\n  compile: off\n" in path.read_text()
    train = load_study(path).spec.train
    assert (train.pack, train.compile) == ("off", "off")
    train = load_study(write_study(), overrides=["train.pack=off", "train.compile=off"]).spec.train
    assert (train.pack, train.compile) == ("off", "off")
    code, _, err = cli("validate", path, "train.pack=on")  # a bare on is true: no word of these options
    assert code == 2 and "train.pack" in err

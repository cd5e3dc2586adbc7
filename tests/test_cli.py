"""`ablate components` and `ablate validate` output; exit statuses and usage lines."""

from __future__ import annotations

from ablate import registry

BUILT_IN = {
    "attention": ["softmax", "pointwise", "ams", "time_interval", "fr_graph", "channel_masked", "none"],
    "ffn": ["pointwise", "mlp", "swiglu", "geglu", "reglu", "moe", "mffn", "none"],
    "norm": ["layernorm", "rmsnorm", "none"],
    "connection": ["residual", "hyper", "mhc"],
    "bias": ["abs_pos", "sinusoidal", "rope", "rel_pos", "rel_time", "log_time_gap"],
    "task": ["seqrec"],
}


def test_registry_finds_built_in_kinds_through_entry_points():
    for slot, kinds in BUILT_IN.items():
        assert set(kinds) <= set(registry.kinds(slot)), slot
        for kind in kinds:
            cls = registry.get(slot, kind)
            assert cls.__module__.startswith("ablate_plugins")
            assert registry.provider(slot, kind).startswith("ablate-studies ")


def test_components_lists_kinds_with_options_and_defaults(cli):
    code, out, _ = cli("components")
    assert code == 0
    for kinds in BUILT_IN.values():
        for kind in kinds:
            assert kind in out
    rows = {tuple(cell.strip() for cell in line.split("│")[2:7]) for line in out.splitlines() if "│" in line}
    assert ("heads", "int", "> 0", "1", "—") in rows  # softmax: no description written for it
    assert ("activation", "str", "relu, gelu", "'gelu'", "—") in rows  # mlp: a Literal's values
    assert ("eps", "float", "> 0.0", "1e-06", "—") in rows  # rmsnorm
    assert ("streams", "int", "≥ 1", "4", "s, the expansion rate") in rows  # hyper: its source comment
    assert ("top_k", "int", "≥ 1", "2", "experts per token, ≤ experts") in rows  # moe
    assert "ablate-studies " in out  # who provides each kind
    code, out, _ = cli("components", "norm")
    assert code == 0 and "rmsnorm" in out and "softmax" not in out
    code, _, err = cli("components", "nope")
    assert code == 2 and "unknown slot 'nope'" in err


def test_option_descriptions_types_and_allowed_values():
    from typing import Literal

    from pydantic import Field

    from ablate.commands.listing import describe_options
    from ablate.components import Options
    from ablate.model.blocks import PLACEMENTS

    class Demo(Options):
        width: int = Field(4, ge=1, description="How wide. Really.")
        mode: Literal["a", "b"] | None = None  # which mode
        # Where the norm goes, as in the study file's
        # model.norm.placement.
        placement: PLACEMENTS.field = "pre"
        plain: float = 1.0

    rows = {r.name: r for r in describe_options(Demo)}
    assert (rows["width"].type, rows["width"].allowed, rows["width"].default) == ("int", "≥ 1", "4")
    assert rows["width"].description == "How wide. Really."  # description= wins over comments
    assert (rows["mode"].type, rows["mode"].allowed, rows["mode"].description) == (
        "str | None",
        "a, b",
        "which mode",
    )
    assert rows["placement"].allowed == ", ".join(PLACEMENTS)  # a vocabulary's names
    assert (
        rows["placement"].description == "Where the norm goes, as in the study file's model.norm.placement."
    )
    assert (rows["plain"].allowed, rows["plain"].description) == ("—", "—")


def test_version(cli):
    import ablate

    code, out, _ = cli("--version")
    assert code == 0 and out.strip() == f"ablate {ablate.__version__}" and ablate.__version__ != "0+unknown"


def test_help_shows_defaults_rich_would_swallow(cli, monkeypatch):
    monkeypatch.setenv("COLUMNS", "250")  # no cell cut short
    code, out, _ = cli("run", "--help")
    flat = " ".join(out.replace("│", " ").split())
    assert code == 0
    for default in ("runs/<study>", "runs/<study>/optuna.journal", "<output>/report"):
        assert f"[default: ({default})]" in flat, default
    assert "overrides" in flat and "train.lr=1e-3" in flat


def test_validate_imports_no_driver_tracking_or_plotting(tmp_path):
    """`ablate validate` stays quick: the driver, MLflow, Optuna, matplotlib and scipy load only
    for the commands that need them."""
    import subprocess
    import sys
    from pathlib import Path

    study = Path(__file__).resolve().parents[1] / "studies" / "quickstart.yaml"
    script = (
        "import sys\n"
        "from ablate.commands.cli import main\n"
        f"sys.argv = ['ablate', 'validate', {str(study)!r}, 'seeds=[0,1]']\n"
        "try:\n    main()\nexcept SystemExit as exc:\n    assert not exc.code, exc.code\n"
        "heavy = ('mlflow', 'optuna', 'ablate.drive', 'ablate.tracking', 'matplotlib', 'scipy',"
        " 'fbgemm_gpu')\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] in heavy or m.startswith(heavy)))\n"
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip().splitlines()[-1] == "[]"


def test_validate_shows_the_variant_table(cli, write_study):
    code, out, _ = cli("validate", write_study())
    assert code == 0
    assert "2 variants × 2 seeds = 4 trials" in out
    assert "mlp(mult=2.0)" in out and "layernorm (pre)" in out and "valid" in out


def test_the_readme_states_each_exit_status_once():
    """The README's table of exit statuses is the contract (each path is tested where it
    arises: 1 in tests/test_drive.py (failed trials, nothing finished, a crashed worker), 2 in
    the bad-input corpus (tests/test_corpus_*.py), 130 in tests/test_stopping.py and
    tests/test_resume.py); the CLI's docstring says the same."""
    from pathlib import Path

    import ablate.commands.cli

    readme = (Path(__file__).resolve().parents[1] / "README.md").read_text()
    table = readme.split("**Exit statuses**", 1)[1].split("\n\n", 2)[1]
    statuses = [row.split("|")[1].strip() for row in table.splitlines()[2:]]
    assert statuses == ["0", "1", "2", "130"]
    for status in statuses:
        assert f" {status} " in ablate.commands.cli.__doc__.replace(";", " ").replace(",", " ")


def test_usage_errors_name_the_ablate_command_however_it_was_started(cli):
    code, _, err = cli("run", "--workers", "0", "x.yaml")
    assert code == 2 and err.startswith("error: ablate run: Invalid value for '--workers'")

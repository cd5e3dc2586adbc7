"""templates/component: the kind it holds is found through the entry point its pyproject.toml
declares (installed here as pip would lay it out: the module and a .dist-info on sys.path),
`ablate components` lists it, its study file validates, its own tests (the plugin test kit) pass,
and the README's "Writing a component" section names what the template holds."""

from __future__ import annotations

import importlib
import shutil
import sys
import tomllib
from pathlib import Path

import pytest

from ablate import registry, testkit

REPO = Path(__file__).resolve().parents[1]
TEMPLATE = REPO / "templates" / "component"


def _project() -> dict:
    return tomllib.loads((TEMPLATE / "pyproject.toml").read_text())["project"]


@pytest.fixture
def installed(tmp_path, monkeypatch):
    """The template's module and a dist-info with its entry points on a new sys.path entry."""
    project = _project()
    site = tmp_path / "site"
    dist = site / f"{project['name'].replace('-', '_')}-{project['version']}.dist-info"
    dist.mkdir(parents=True)
    shutil.copy(TEMPLATE / "my_attention.py", site)
    (dist / "METADATA").write_text(
        f"Metadata-Version: 2.1\nName: {project['name']}\nVersion: {project['version']}\n"
    )
    groups = project["entry-points"]
    (dist / "entry_points.txt").write_text(
        "".join(
            f"[{group}]\n" + "".join(f"{k} = {v}\n" for k, v in points.items()) + "\n"
            for group, points in groups.items()
        )
    )
    monkeypatch.syspath_prepend(str(site))
    monkeypatch.syspath_prepend(str(TEMPLATE))  # its test module
    monkeypatch.chdir(tmp_path)
    registry.refresh()
    yield groups
    monkeypatch.undo()
    for module in ("my_attention", "test_my_attention"):
        sys.modules.pop(module, None)
    registry.refresh()


def test_the_template_installs_lists_validates_and_passes_its_tests(installed, cli):
    assert installed == {"ablate.attention": {"my_attention": "my_attention:MyAttention"}}
    code, out, err = cli("components", "attention")
    assert code == 0 and "my_attention" in out and "ablate-my-attention 0.1.0" in out, err
    code, out, err = cli("validate", str(TEMPLATE / "study.yaml"))
    assert code == 0, err
    tests = importlib.import_module("test_my_attention")
    assert tests.MyAttention is registry.get("attention", "my_attention")
    for check in testkit.CHECKS:
        tests.test_my_attention_conforms(check)
    tests.test_with_four_heads()


def test_the_readme_section_names_the_template():
    readme = (REPO / "README.md").read_text()
    section = readme.split("### Writing a component", 1)[1].split("\n## ", 1)[0]
    assert 'my_attention = "my_attention:MyAttention"' in section
    for name in ("templates/component", "my_attention.py", "test_my_attention.py", "study.yaml"):
        assert name in section, name
        assert (REPO / name).exists() or (TEMPLATE / name).exists(), name
    for check in testkit.CHECKS:
        assert f"`{check}`" in section, check

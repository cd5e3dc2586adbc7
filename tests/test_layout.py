"""The core's map (ablate/README.md) holds: rooms import only from their own layer or the ones
above, the core never imports a plugin, plugins reach the core through its interface modules
only, no core module is over 450 lines, and nothing touches Optuna's private attributes."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
CORE = REPO / "ablate"

# ablate/README.md's table, top to bottom.
LAYERS = [
    {"errors", "faults", "stopping", "schema", "fastpaths", "jagged", "cache", "kernels", "provenance"},
    {"components", "tasks", "registry"},
    {"studyfile", "overrides", "blocks", "optimizers", "schedules", "datasets", "derived", "testkit"},
    {"stats"},
    {"search", "spec", "variants"},
    {"study", "sizes"},
    {"build", "match", "memory", "flops", "checkpoints", "train", "parts", "folders", "preflight"},
    {"track", "emptystore"},
    {"drive"},
    {"results", "report", "foreign"},
    {
        "console",
        "progress",
        "running",
        "gpus",
        "listing",
        "planning",
        "compare",
        "data",
        "across",
        "options",
        "slurm",
        "cli",
        "__init__",
    },
]
LAYER_OF = {room: i for i, rooms in enumerate(LAYERS) for room in rooms}
# What plugins may import from the core: the interface a kind or a task is written against.
PLUGIN_INTERFACE = {"components", "tasks", "fastpaths", "jagged", "errors", "stopping", "cache", "kernels"}


def _room(path: Path) -> str:
    """The top-level room of a core module: ``stats`` for ablate/stats/ranking.py."""
    return path.relative_to(CORE).parts[0].removesuffix(".py")


def _imports(path: Path) -> set[str]:
    """Absolute dotted names a module imports at run time (``TYPE_CHECKING`` blocks excluded)."""
    tree = ast.parse(path.read_text())
    type_only = {
        id(node)
        for block in ast.walk(tree)
        if isinstance(block, ast.If) and ast.unparse(block.test) in ("TYPE_CHECKING", "typing.TYPE_CHECKING")
        for node in ast.walk(block)
    }
    package = ".".join(path.relative_to(REPO).with_suffix("").parts[:-1])
    found = set()
    for node in ast.walk(tree):
        if id(node) in type_only:
            continue
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                module = ".".join(base + ([node.module] if node.module else []))
                names = [f"{module}.{a.name}" for a in node.names] if node.module is None else [module]
                found |= set(names)
            elif node.module:
                found.add(node.module)
    return found


CORE_FILES = sorted(CORE.rglob("*.py"))


def test_every_room_is_on_the_map():
    rooms = {_room(p) for p in CORE_FILES}
    assert rooms == set(LAYER_OF), "ablate/README.md and LAYERS must list exactly the core's rooms"
    readme = (CORE / "README.md").read_text()
    assert all(f"`{room}" in readme for room in rooms)


@pytest.mark.parametrize("path", CORE_FILES, ids=lambda p: str(p.relative_to(CORE)))
def test_rooms_import_only_upwards(path):
    mine = LAYER_OF[_room(path)]
    for name in _imports(path):
        assert not name.startswith("ablate_plugins"), f"{path.name} imports the plugin {name}"
        if name.split(".")[0] != "ablate" or name == "ablate":
            continue
        room = name.split(".")[1]
        assert LAYER_OF[room] <= mine, (
            f"{path.relative_to(REPO)} (layer {mine}) imports {name} (layer {LAYER_OF[room]})"
        )


def test_plugins_use_the_interface_only():
    for path in sorted((REPO / "plugins").rglob("*.py")):
        for name in _imports(path):
            parts = name.split(".")
            if parts[0] == "ablate" and len(parts) > 1:
                assert parts[1] in PLUGIN_INTERFACE, f"{path.relative_to(REPO)} imports {name}"


@pytest.mark.parametrize("path", CORE_FILES, ids=lambda p: str(p.relative_to(CORE)))
def test_no_core_module_is_over_450_lines(path):
    assert len(path.read_text().splitlines()) <= 450


def test_no_private_optuna_attributes():
    """``._storage`` / ``._trial_id`` are Optuna internals: the stores use its public storage API."""
    for path in CORE_FILES:
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Attribute):
                assert node.attr not in ("_storage", "_trial_id"), f"{path.relative_to(REPO)}:{node.lineno}"

"""A research loop folder end to end (issue 61): ``ablate gate init | try | status | history`` over
the example's NumPy training script (examples/gate_loop), its refusals and faults — no change, an
invalid candidate, a failed one, another loop's ledger, two ``try`` at once, kill -9 — and the MCP
server driven by the ``mcp`` SDK's own stdio client."""

from __future__ import annotations

import asyncio
import fcntl
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from ablate.drive.loop import Loop
from ablate.stats.gate import Outcome

REPO = Path(__file__).resolve().parents[1]
EXAMPLE = REPO / "examples" / "gate_loop"
SMALL = ["model.config.rows=200", "model.config.epochs=2"]  # a trial in well under a second of compute


@pytest.fixture(scope="module")
def started(tmp_path_factory) -> Path:
    """A loop whose incumbent has its first 3 seeds trained (by a first candidate); copied per test."""
    root = tmp_path_factory.mktemp("gate")
    shutil.copytree(EXAMPLE, root / "example")
    loop = Loop.init(root / "loop", root / "example" / "study.yaml", SMALL, margin=0.02, initial=3, max=3)
    [first] = loop.try_change("wider", ["model.config.width=32"])
    assert first.outcome is not Outcome.FAILED and first.seeds == [0, 1, 2]
    return root


@pytest.fixture
def loop(started, tmp_path) -> Path:
    shutil.copytree(started, tmp_path / "copy")
    return tmp_path / "copy" / "loop"


def _trials(loop: Path) -> dict[str, int]:
    """Finished trials per configuration, read from each store's queue."""
    import optuna

    found = {}
    for runs in sorted((loop / "runs").iterdir()):
        storage = optuna.storages.JournalStorage(
            optuna.storages.journal.JournalFileBackend(str(runs / "optuna.journal"))
        )
        for summary in optuna.get_all_study_summaries(storage):
            trials = optuna.load_study(study_name=summary.study_name, storage=storage).trials
            seeds = [t.user_attrs["seed"] for t in trials if t.state.name == "COMPLETE"]
            assert len(seeds) == len(set(seeds)), f"a seed trained twice in {runs.name}"
            found[runs.name] = len(seeds)
    return found


@pytest.mark.heavy
def test_cli_status_history_and_the_report(loop, cli):
    code, out, err = cli("gate", "status", loop, "--json")
    assert code == 0, err
    status = json.loads(out)
    assert status["candidates"] == 1 and status["next_level"] > 0
    code, out, _ = cli("gate", "history", loop)
    assert code == 0 and out.startswith("#1 ") and "tested at level" in out
    text = (loop / "report" / "history.md").read_text()
    assert "Candidates in order" in text and "| 1 | wider |" in text and "LORD++" in text
    assert (loop / "report" / "history.html").read_text().startswith("<!DOCTYPE html>")


def test_no_change_is_refused_untrained(loop, cli):
    before = _trials(loop)
    # the same code reformatted and commented, in a folder of its own (a file beside train.py would
    # change the driver's fingerprint of the incumbent's code, which covers its neighbours)
    refactor = loop.parent / "refactor" / "train.py"
    refactor.parent.mkdir()
    refactor.write_text("# a no-op refactor\n" + (EXAMPLE / "train.py").read_text().replace("    ", "  "))
    for change in (["seeds=[7,8,9]"], [f"task.callable={refactor}:train"]):
        code, out, err = cli("gate", "try", loop, *change, "--change", "noise")
        assert code == 0, err
        assert "no change: the same resolved configuration and code" in out
    assert _trials(loop) == before


def test_invalid_candidate_is_one_line_and_nothing_is_queued(loop, cli):
    code, out, err = cli("gate", "try", loop, "task.kind=nonexistent")
    assert code == 2 and len(err.strip().splitlines()) == 1 and "task.kind" in err
    assert Loop(loop).queued() == [] and len(Loop(loop).history()) == 1


def test_failed_training_is_recorded_and_the_incumbent_stays(loop, cli):
    incumbent = Loop(loop).gate().incumbent
    code, out, err = cli("gate", "try", loop, "model.config.rows=-5", "--change", "breaks")
    assert code == 0, err
    assert "failed: seed(s) 0, 1, 2 did not train" in out
    after = Loop(loop).gate()
    assert after.incumbent == incumbent and after.history[-1].outcome is Outcome.FAILED


def test_another_loops_ledger_and_a_folder_that_is_no_loop(loop, tmp_path, cli):
    other = Loop.init(tmp_path / "other", EXAMPLE / "study.yaml", SMALL, margin=0.02)
    shutil.copy(loop / "ledger.jsonl", other.folder / "ledger.jsonl")
    code, _, err = cli("gate", "status", other.folder)
    assert code == 2 and "belongs to loop" in err and len(err.strip().splitlines()) == 1
    code, _, err = cli("gate", "try", tmp_path, "model.config.width=4")
    assert code == 2 and "not a loop folder" in err
    code, _, err = cli("gate", "init", loop, EXAMPLE / "study.yaml", "--margin", "0.01")
    assert code == 2 and "already holds a loop" in err


def test_two_tries_at_once_the_second_is_refused(loop, cli):
    with open(loop / "lock", "a+") as held:
        fcntl.flock(held, fcntl.LOCK_EX | fcntl.LOCK_NB)
        code, _, err = cli("gate", "try", loop, "model.config.width=4")
    assert code == 2 and "another `ablate gate try`" in err
    assert Loop(loop).queued() == []


@pytest.mark.heavy
@pytest.mark.parametrize("point", ["tell@2", "decide@1"])
def test_kill_9_then_try_resumes_without_a_seed_lost_or_counted_twice(loop, point, cli):
    env = {**os.environ, "ABLATE_TEST_KILL_AT": point}
    command = [sys.executable, "-m", "ablate.commands.cli", "gate", "try", str(loop), "model.config.lr=0.2"]
    killed = subprocess.run(command, env=env, capture_output=True, text=True, timeout=120)
    assert killed.returncode == -9
    assert [q.description for q in Loop(loop).queued()] == ["model.config.lr=0.2"]
    code, _, err = cli("gate", "try", loop)  # the next try, in this process: it resumes the candidate
    assert code == 0, err
    history = Loop(loop).history()
    assert len(history) == 2 and history[-1].seeds == [0, 1, 2] and Loop(loop).queued() == []
    assert sorted(_trials(loop).values()) == [3, 3, 3]  # start, the first candidate, this one


def test_mcp_server_over_stdio_with_the_sdks_client(loop):
    from mcp.client.session import ClientSession
    from mcp.client.stdio import StdioServerParameters, stdio_client

    params = StdioServerParameters(
        command=sys.executable, args=["-m", "ablate.commands.cli", "gate", "serve", str(loop)]
    )

    async def session() -> tuple[dict, dict, dict]:
        async with stdio_client(params) as (read, write), ClientSession(read, write) as client:
            await client.initialize()
            tools = {t.name for t in (await client.list_tools()).tools}
            assert tools >= {"try_change", "status", "history"}
            tried = await client.call_tool(
                "try_change", {"description": "a seed", "overrides": ["seeds=[5]"]}
            )
            status = await client.call_tool("status", {})
            history = await client.call_tool("history", {})
            return tried.structured_content, status.structured_content, history.structured_content

    tried, status, history = asyncio.run(session())
    [decision] = tried["decisions"]
    assert decision["outcome"] == "no change" and decision["number"] == 2
    assert status["candidates"] == 2
    assert [d["description"] for d in history["decisions"]] == ["wider", "a seed"]


@pytest.mark.heavy
def test_the_readmes_gate_section_runs_as_written(tmp_path, cli):
    """README "A gate for your research loop": its commands, then its Python, from a clone's root
    (each line in this process: tests/readme_lines.py)."""
    import re

    from readme_lines import run_readme_line, run_readme_python

    readme = (REPO / "README.md").read_text()
    start = readme.index("\n## A gate for your research loop\n")
    section = readme[start : readme.find("\n## ", start + 1)]
    [bash] = re.findall(r"```bash\n(.*?)```", section, flags=re.S)
    [python] = re.findall(r"```python\n(.*?)```", section, flags=re.S)
    (tmp_path / "examples").symlink_to(REPO / "examples", target_is_directory=True)
    (tmp_path / ".venv").symlink_to(Path(sys.prefix), target_is_directory=True)
    for line in bash.strip().splitlines():
        code, _, err = run_readme_line(cli, line, tmp_path)
        assert code == 0, (line, err[-2000:])
    code, out, _ = run_readme_line(cli, ".venv/bin/ablate gate history runs/my_loop", tmp_path)
    assert code == 0 and "no change" in out
    run_readme_python(python, tmp_path)
    assert (tmp_path / "runs" / "my_loop" / "report" / "history.html").is_file()


@pytest.mark.heavy
def test_an_mcp_client_that_disconnects_mid_candidate_loses_no_seed(loop):
    """The client leaves while the candidate trains (its server is ended with it): the candidate
    stays taken up in the ledger, and the next try decides it from the seeds that finished."""
    import time

    from mcp.client.session import ClientSession
    from mcp.client.stdio import StdioServerParameters, stdio_client

    params = StdioServerParameters(
        command=sys.executable, args=["-m", "ablate.commands.cli", "gate", "serve", str(loop)]
    )

    def taken() -> bool:
        return '"event": "taken", "number": 2' in (loop / "ledger.jsonl").read_text()

    async def leave_mid_candidate() -> None:
        async with stdio_client(params) as (read, write), ClientSession(read, write) as client:
            await client.initialize()
            call = asyncio.ensure_future(
                client.call_tool("try_change", {"description": "lr", "overrides": ["model.config.lr=0.2"]})
            )
            for _ in range(600):
                if taken() or call.done():
                    break
                await asyncio.sleep(0.1)
            call.cancel()

    asyncio.run(leave_mid_candidate())
    assert taken()
    for _ in range(300):  # the server's process ends after its client
        try:
            decisions = Loop(loop).try_change()
            break
        except Exception as exc:  # noqa: BLE001 - the lock is still held by the ending server
            assert "another `ablate gate try`" in str(exc)
            time.sleep(0.1)
    history = Loop(loop).history()
    assert [d.description for d in history] == ["wider", "lr"] and history[-1].seeds == [0, 1, 2]
    assert len(decisions) <= 1 and Loop(loop).queued() == []
    assert sorted(_trials(loop).values()) == [3, 3, 3]

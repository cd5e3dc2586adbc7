"""``ablate gate init | try | status | history | serve``: a research loop's gate over a loop folder
(the work is :mod:`ablate.drive.loop`'s; the decisions :mod:`ablate.stats.gate`'s)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer

from ablate import stopping
from ablate.commands.console import STOPPED, err, out

app = typer.Typer(
    no_args_is_help=True, help="A gate for a research loop: keep a change only when the seeds say so."
)
LoopArg = Annotated[Path, typer.Argument(help="The loop folder.", show_default=False)]
ChangeArgs = Annotated[
    list[str] | None,
    typer.Argument(
        help="The change: key=value overrides over the incumbent's configuration.", show_default=False
    ),
]


def _say(line: str) -> None:
    out.print(line, markup=False, highlight=False, soft_wrap=True)


@app.command()
def init(
    loop: LoopArg,
    study_file: Annotated[Path, typer.Argument(help="The study file each configuration overrides.")],
    margin: Annotated[float, typer.Option(help="Practical margin, in the metric's units.")],
    overrides: ChangeArgs = None,
    alpha: Annotated[float, typer.Option(help="False discovery rate of the loop's keeps.")] = 0.1,
    initial: Annotated[int, typer.Option(help="Seeds per candidate at the first look.")] = 3,
    max_seeds: Annotated[int, typer.Option("--max", help="Seeds per candidate at most.")] = 12,
    step: Annotated[int, typer.Option(help="Seeds added per look.")] = 3,
    horizon: Annotated[int | None, typer.Option(help="The most candidates the loop will test.")] = None,
) -> None:
    """Make a loop folder: the study file (with its overrides) is the first incumbent."""
    from ablate.drive.loop import Loop

    rules = {"margin": margin, "alpha": alpha, "initial": initial, "max": max_seeds, "step": step}
    made = Loop.init(loop, study_file, overrides or (), **rules, horizon=horizon)
    _say(
        f"loop {made.spec.id} in {loop}: incumbent {made.gate().incumbent[:12]}; "
        f"{made.spec.gate.design.describe()}"
    )


@app.command("try")
def try_(
    loop: LoopArg,
    overrides: ChangeArgs = None,
    change: Annotated[str, typer.Option(help="What the change is, in a few words.")] = "",
    simpler: Annotated[bool, typer.Option(help="Keep it when equivalent (it simplifies the model).")] = False,
) -> None:
    """Queue a change and decide the queue (no change given: resume it, after a kill)."""
    from ablate.drive.loop import Loop

    opened = Loop(loop)
    try:
        with stopping.stop_signals():
            decisions = opened.try_change(change, overrides or (), simpler)
    except KeyboardInterrupt:
        err.print(
            f"interrupted: `ablate gate try {loop}` resumes the candidate", markup=False, highlight=False
        )
        raise typer.Exit(STOPPED) from None
    for decision in decisions:
        _say(decision.line())
    if not decisions:
        _say("nothing queued")


@app.command()
def status(loop: LoopArg, as_json: Annotated[bool, typer.Option("--json", help="As JSON.")] = False) -> None:
    """The incumbent, the changes kept, the next candidate's level, what is queued."""
    from ablate.drive.loop import Loop

    standing = Loop(loop).status()
    if as_json:
        return _say(json.dumps(standing))
    overrides = " ".join(standing["incumbent_overrides"]) or "the study file"
    _say(f"incumbent {standing['incumbent'][:12]} ({overrides})")
    kept = "; ".join(standing["kept"]) or "—"
    _say(f"{standing['candidates']} candidate(s), {len(standing['kept'])} kept: {kept}")
    _say(f"next candidate tested at level {standing['next_level']:.3g}; queued: {len(standing['queued'])}")


@app.command()
def history(
    loop: LoopArg,
    reports: Annotated[
        Path | None, typer.Option(help="Folder for history.md / .html (default LOOP/report).")
    ] = None,
) -> None:
    """Every candidate in order, and the history report (Markdown and HTML)."""
    from ablate.drive.loop import Loop
    from ablate.report.gate import write_history

    opened = Loop(loop)
    gate = opened.gate()
    for decision in gate.history:
        _say(decision.line())
    title = f"Research loop {opened.folder.resolve().name}"
    paths = write_history(gate.history, opened.spec.gate, reports or loop / "report", title, gate.start)
    _say(f"report: {paths['md']} and {paths['html']}")


@app.command()
def serve(loop: LoopArg) -> None:
    """An MCP server on stdio over this loop: tools try_change, status, history (needs the `mcp` extra)."""
    from ablate.commands.gate_mcp import serve_loop

    serve_loop(loop)

"""``ablate compare``: its options, and what it prints. The work (:mod:`.foreign`) loads pandas,
scipy and MLflow, so it is imported when the command runs, not with the command line."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from ablate.commands.console import err, out

SourceArg = Annotated[
    list[str],
    typer.Argument(
        metavar="SOURCE...",
        help="The runs: a CSV file (one row per run, e.g. a Weights & Biases export), a folder of "
        "JSON / YAML result files (one per run), or an MLflow tracking URI (sqlite:///mlflow.db, "
        "http://host:5000) with --experiment. With --items: per-unit scores, one or more of a long "
        "table (CSV, Parquet, JSON lines), lm-eval --log_samples output, inspect-ai logs; "
        "NAME=PATH names a log's model.",
        show_default=False,
    ),
]
ExperimentOpt = Annotated[str | None, typer.Option(help="The MLflow experiment's name.", show_default=False)]
MetricOpt = Annotated[
    list[str],
    typer.Option(
        "--metric", "-m", help="A metric column; repeatable, the first is primary.", show_default=False
    ),
]
BaselineOpt = Annotated[
    str,
    typer.Option(
        help="The baseline group: its name (lr=0.1) or key=value pairs selecting it.", show_default=False
    ),
]
OutOpt = Annotated[
    Path, typer.Option("--out", metavar="DIR", help="Folder for the report.", show_default=False)
]
GroupByOpt = Annotated[
    list[str] | None,
    typer.Option(
        metavar="KEY",
        help="A parameter that tells the groups apart; repeatable.",
        show_default="every parameter but the seed",
    ),
]
SeedKeyOpt = Annotated[str, typer.Option(metavar="KEY", help="The column holding each run's seed.")]
DirectionOpt = Annotated[
    bool | None,
    typer.Option(
        "--higher-is-better/--lower-is-better",
        help="The metrics' direction.",
        show_default="known names (accuracy, ndcg, loss, mae, …)",
    ),
]
MarginOpt = Annotated[
    str | None,
    typer.Option(
        help="Practical margin of equivalence: in the metric's units or '2%' of the baseline's mean.",
        show_default="2%",
    ),
]
UnpairedOpt = Annotated[
    bool, typer.Option("--unpaired", help="Compare unpaired (Welch) even where seeds pair.")
]
ItemsOpt = Annotated[
    bool,
    typer.Option("--items", help="The sources hold per-unit scores: paired tests over the units."),
]
PartialOpt = Annotated[
    bool,
    typer.Option("--partial", help="With --items: compare the units every model has, saying which."),
]


def compare_command(
    sources: list[str],
    metrics: list[str],
    baseline: str,
    out_dir: Path,
    experiment: str | None,
    group_by: list[str] | None,
    seed_key: str,
    higher: bool | None,
    margin: str | None,
    unpaired: bool,
    items: bool = False,
    partial: bool = False,
) -> None:
    from ablate.errors import AblateError

    runs_only = {"--experiment": experiment, "--group-by": group_by, "--unpaired": unpaired}
    runs_only["--seed-key"] = seed_key if seed_key != "seed" else None
    if items and (given := [name for name, value in runs_only.items() if value]):
        raise AblateError(f"{', '.join(given)}: for runs, not with --items (per-unit scores)")
    if partial and not items:
        raise AblateError("--partial: only with --items (per-unit scores)")
    if items:
        from ablate.report.items import compare_items

        if not metrics:
            raise AblateError("--metric names the per-unit score to compare")
        compared = compare_items(sources, metrics[0], baseline, out_dir, higher, margin, partial)
    else:
        from ablate.report.foreign import compare_runs

        if len(sources) > 1:
            raise AblateError(f"{len(sources)} sources: runs come from one (several only with --items)")
        compared = compare_runs(
            sources[0], metrics, baseline, out_dir, experiment, group_by, seed_key, higher, margin, unpaired
        )
    err.print(compared.grouping, markup=False, highlight=False, soft_wrap=True)
    out.print(compared.table, markup=False, highlight=False, soft_wrap=True)
    out.print(f"report: {compared.paths['html'].resolve()}", markup=False, highlight=False, soft_wrap=True)

"""The options and arguments several ``ablate`` commands share (typer's ``Annotated`` types),
kept out of :mod:`.cli` so that it has room for the commands themselves."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

StudyArg = Annotated[Path, typer.Argument(help="Study file (YAML or TOML).", show_default=False)]
OverridesArg = Annotated[
    list[str] | None,
    typer.Argument(
        help="key=value overrides of the study file: dotted keys, YAML values "
        "(train.lr=1e-3 model.attention.heads=2 seeds=[0,1,2,3]); +key=value adds a key, ~key "
        "deletes one (~variants.two-heads), key=a,b sweeps (a study per value).",
        show_default=False,
    ),
]
OutputOpt = Annotated[
    Path | None,
    typer.Option(
        "--output", "-o", help="Folder for the Optuna and MLflow stores.", show_default="runs/<study>"
    ),
]
ReportsOpt = Annotated[
    Path | None,
    typer.Option(help="Write the report to DIR/<study>/.", metavar="DIR", show_default="<output>/report"),
]
StorageOpt = Annotated[
    str | None,
    typer.Option(
        "--storage",
        help="Optuna storage URL shared by workers, e.g. postgresql://user:pw@host/db.",
        show_default="runs/<study>/optuna.journal",
    ),
]
ReuseOpt = Annotated[
    list[str] | None,
    typer.Option(
        "--reuse",
        metavar="DIR",
        help="Copy finished trials with the same fingerprint and seed from another study's output "
        "folder, a tracking URI or a folder of trial files (report --trials) instead of training them; "
        "repeatable.",
        show_default=False,
    ),
]
ReuseOlderOpt = Annotated[
    bool,
    typer.Option(
        "--reuse-older-kinds",
        help="With --reuse: also copy trials trained under an earlier version of a kind they use (a report "
        "written again with today's statistics, nothing retrained; Methods names them), and train none.",
    ),
]
TrackingOpt = Annotated[
    str | None,
    typer.Option(
        "--tracking-uri",
        help="MLflow tracking URI, e.g. http://host:5000.",
        show_default="sqlite runs/<study>/mlflow.db",
    ),
]
OnlyOpt = Annotated[
    str | None,
    typer.Option(
        "--only", metavar="VARIANT,...", help="Only these variants (and the baseline).", show_default=False
    ),
]

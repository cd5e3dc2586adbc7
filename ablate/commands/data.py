"""``ablate data``: the named data sets (``list``), a download into the cache (``fetch``, licence
printed), where a data set's files are here (``path``). The work is :mod:`ablate.data.catalog`'."""

from __future__ import annotations

from typing import Annotated

import typer
from rich.table import Table

from ablate.commands.console import err, out
from ablate.errors import AblateError

app = typer.Typer(no_args_is_help=True, help="Named data sets: list, fetch, path.")
NameArg = Annotated[str, typer.Argument(help="A data set's name (`ablate data list`).", show_default=False)]


def _lookup(name: str):
    from ablate.data.catalog import lookup

    try:
        return lookup(name)
    except ValueError as exc:
        raise AblateError(str(exc)) from None


def _size(size: int) -> str:
    return f"{size / 1e6:.1f} MB" if size else "?"


@app.command("list")
def list_() -> None:
    """Every named data set: its task and loader, size, whether its files are hashed, where it
    comes from and whether it is here (mirror or cache)."""
    from ablate.data.catalog import mirror, present, registry, root

    table = Table(title=f"data sets (read from {root()}{' — the mirror' if mirror() else ''})")
    for column in ("name", "task", "format", "size", "SHA-256", "source", "here", "title"):
        table.add_column(column, overflow="fold" if column == "title" else "ellipsis")
    for d in registry().values():
        source = (
            "derived"  # made here from another entry's download
            if d.derive
            else "publisher"
            if d.url and not d.redistribute
            else "download"
            if d.url
            else "mirror only"
        )
        table.add_row(
            d.name,
            d.task,
            str(d.data.get("format", "")),
            _size(d.size),
            "recorded" if d.verified else "not recorded",
            source,
            "yes" if present(d) else "no",
            d.title,
        )
    out.print(table)


@app.command()
def fetch(name: NameArg) -> None:
    """Download a data set into the cache (each file checked against its SHA-256; an interrupted
    download resumes), printing its licence and citation; a derived one is made from its source's
    download. With ABLATE_DATA_MIRROR set, check the mirror holds it instead."""
    from ablate.data.catalog import MIRROR_ENV, data_dir, mirror, present
    from ablate.data.download import download, locate

    dataset = _lookup(name)

    def say(line: str) -> None:
        err.print(line, markup=False, soft_wrap=True)

    checked = "checked against its SHA-256" if dataset.verified else "no SHA-256 recorded to check"
    if mirror() is not None:  # the mirror stands in for the network: nothing is downloaded
        path = locate(dataset, fetch=True)
        say(f"{name}: in the data mirror {mirror()} ({MIRROR_ENV} is set; {checked}): nothing downloaded")
    elif present(dataset):
        path = locate(dataset, fetch=False)
        say(f"{name}: already in the cache {data_dir()} ({checked}): nothing downloaded")
    else:
        if dataset.url and not dataset.redistribute:
            say(f"{name}: its licence forbids copies: downloaded from its publisher")
        path = download(dataset, say=say)
    out.print(str(path), markup=False, highlight=False, soft_wrap=True)


@app.command()
def path(name: NameArg) -> None:
    """Where a data set's file (or folder) is here: the mirror, else the cache. Not there yet:
    one line saying how to get it (status 2)."""
    from ablate.data.catalog import how_to_get, present
    from ablate.data.download import locate

    dataset = _lookup(name)
    if not present(dataset):
        raise AblateError(
            f"data set '{name}' is not here ({locate(dataset, fetch=False)}): {how_to_get(dataset)}"
        )
    out.print(str(locate(dataset, fetch=False)), markup=False, highlight=False, soft_wrap=True)

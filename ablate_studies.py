"""The ``ablate`` command's entry point, outside the ``ablate`` package: it checks for the unrelated
PyPI ``ablate`` (:mod:`ablate_namesake`) before importing anything of the package, whose files that
project may have replaced."""

from __future__ import annotations

from ablate_namesake import stop_if_clashing


def main() -> None:
    """The ``ablate`` command: the clash check, then :func:`ablate.commands.cli.main`."""
    stop_if_clashing()
    from ablate.commands.cli import main as cli_main

    cli_main()

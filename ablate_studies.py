"""The ``ablate`` command's entry point, outside the ``ablate`` package: it checks for the unrelated
PyPI ``ablate`` (:mod:`ablate_namesake`) before importing anything of the package, whose files that
project may have replaced."""

from __future__ import annotations

import signal
import sys

from ablate_namesake import stop_if_clashing

# ablate.commands.console.STOPPED, which cannot be imported before the clash check: both tested as 130
STOPPED = 130


def main() -> None:
    """The ``ablate`` command: the clash check, then :func:`ablate.commands.cli.main`. SIGTERM is
    a stop from the first moment, as Ctrl-C: while the package imports (seconds: torch) it ends
    the command with one line and exit status 130, not silently with 143."""
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    try:
        stop_if_clashing()
        from ablate.commands.cli import main as cli_main
    except KeyboardInterrupt:
        sys.stderr.write("interrupted: `ablate` stopped while it started; it had done nothing\n")
        sys.exit(STOPPED)
    cli_main()

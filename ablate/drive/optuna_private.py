"""The one place ablate reads Optuna's private modules; nothing else may (``tests/test_layout.py``).

Optuna names a journal's operations and its lock file's suffix only in private modules, and the
journal check (:mod:`.journal`) needs both: the operations to tell a record a crash cut off from
one Optuna would replay, the suffix to find a lock a killed writer left behind. Should Optuna move
them, the import fails here, by name, and ``tests/test_layout.py`` fails with it.
"""

from __future__ import annotations

from optuna.storages.journal._file import LOCK_FILE_SUFFIX
from optuna.storages.journal._storage import JournalOperation

# What a record's op_code may be: Optuna's own operations.
JOURNAL_OPERATIONS = frozenset(int(op) for op in JournalOperation)

__all__ = ["JOURNAL_OPERATIONS", "LOCK_FILE_SUFFIX"]

"""The bad-input corpus, part 3: command-line arguments, study paths, output and report folders,
and the stores a run opens. Every case stops before any training with exit status 2 and one
line naming the option, file (and line) or key at fault."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from corpus import Case, check, study_text

from ablate.drive import folder_problem

STUDY = study_text()
# The tiny study with no `output:` key: its stores go to runs/<name> in the working folder.
STUDY_DEFAULT_OUTPUT = "\n".join(line for line in STUDY.splitlines() if not line.startswith("output:")) + "\n"
# An Optuna journal whose first and third records are whole and whose second is not JSON.
JOURNAL_HEAD = b'{"op_code":0,"worker_id":"w-1","study_name":"tiny","directions":[2]}\n'
JOURNAL_TAIL = b'{"op_code":0,"worker_id":"w-1","study_name":"other","directions":[2]}\n'
JOURNAL = "runs/tiny/optuna.journal"
NOT_SQLITE = b"this is not an SQLite database, whatever its name says\n" * 40
SYS_REFUSES = Path("/sys").is_dir() and folder_problem(Path("/sys/ablate-reports")) is not None


def run(*args: str) -> tuple[str, ...]:
    return ("run", "{dir}/study.yaml", *args)


CASES = [
    # -- arguments ------------------------------------------------------------------------
    Case("unknown-option", {"study.yaml": STUDY}, ("--nope",), run("--nope")),
    Case("option-near-miss", {"study.yaml": STUDY}, ("--output-dir", "--output"), run("--output-dir", "x")),
    Case("unknown-command", {"study.yaml": STUDY}, ("'runn'",), ("runn", "{dir}/study.yaml")),
    Case("study-argument-missing", {}, ("study_file",), ("run",)),
    Case(
        "workers-zero",
        {"study.yaml": STUDY},
        ("ablate run:", "'--workers'", "greater than or equal to 1"),
        run("--workers", "0"),
    ),
    Case(
        "workers-negative",
        {"study.yaml": STUDY},
        ("'--workers'", "greater than or equal to 1"),
        run("-w", "-3"),
    ),
    Case("workers-not-a-number", {"study.yaml": STUDY}, ("--workers", "integer"), run("--workers", "two")),
    Case("workers-fractional", {"study.yaml": STUDY}, ("--workers", "integer"), run("--workers", "2.5")),
    Case(
        "workers-absurd",
        {"study.yaml": STUDY},
        ("'--workers'", "less than or equal to 1024"),
        run("--workers", "100000"),
    ),
    Case(
        "heartbeat-absurd",
        {"study.yaml": STUDY},
        ("'--heartbeat'", "less than or equal to 3600"),
        ("worker", "{dir}/study.yaml", "--heartbeat", "99999999999999999999"),
    ),
    Case(
        "grace-too-short", {"study.yaml": STUDY}, ("--grace",), ("worker", "{dir}/study.yaml", "--grace", "1")
    ),
    Case(
        "override-without-equals", {"study.yaml": STUDY}, ("override train.lr:", "key=value"), run("train.lr")
    ),
    Case("override-empty-key-part", {"study.yaml": STUDY}, ("override train..lr=1",), run("train..lr=1")),
    Case("override-value-not-yaml", {"study.yaml": STUDY}, ("override seeds=[0,1:",), run("seeds=[0,1")),
    Case(
        "override-crosses-a-value",
        {"study.yaml": STUDY},
        ("override train.lr.x=1", "train.lr holds the value 0.003"),
        run("train.lr.x=1"),
    ),
    Case("components-unknown-slot", {}, ("unknown slot 'nope'",), ("components", "nope")),
    Case(
        "checkpoint-interval-not-a-number",
        {"study.yaml": STUDY},
        ("ABLATE_CHECKPOINT_S='soon'",),
        run(),
        env={"ABLATE_CHECKPOINT_S": "soon"},
    ),
    # -- the study file's path ----------------------------------------------------------------
    Case("study-file-missing", {}, ("nope.yaml", "not found"), ("{command}", "{dir}/nope.yaml")),
    Case(
        "study-name-too-long",
        {},
        ("aaaa", "File name too long"),
        ("{command}", "{dir}/" + "a" * 300 + ".yaml"),
    ),
    Case(
        "study-file-is-a-folder",
        {"folder.yaml/x": ""},
        ("folder.yaml", "is a folder"),
        ("{command}", "{dir}/folder.yaml"),
    ),
    Case(
        "study-path-climbs-out",
        {"study.yaml": STUDY},
        ("nowhere/study.yaml", "not found"),
        ("{command}", "{dir}/sub/../../nowhere/study.yaml"),
    ),
    Case("study-file-is-dev-zero", {}, ("/dev/zero",), ("{command}", "/dev/zero")),  # a bounded read: no hang
    Case("study-symlink-loop", {}, ("loop.yaml",), ("{command}", "{dir}/loop.yaml")),
    Case("study-symlink-dangling", {}, ("gone.yaml",), ("{command}", "{dir}/gone.yaml")),
    Case("status-study-missing", {}, ("nope.yaml", "not found"), ("status", "{dir}/nope.yaml")),
    # -- output and report folders, checked before any training -----------------------------
    Case(
        "output-key-under-a-file",
        {"study.yaml": study_text(replace={"output": "afile/runs"}), "afile": "a file\n"},
        ("study.yaml:", ": output: ", "afile is a file, not a folder"),  # validate and run
    ),
    Case(
        "output-option-under-a-file",
        {"study.yaml": STUDY, "afile": "a file\n"},
        ("--output afile/runs:", "afile is a file, not a folder"),
        run("--output", "afile/runs"),
    ),
    Case(
        "output-option-is-a-file",
        {"study.yaml": STUDY, "afile": "a file\n"},
        ("--output afile:", "afile is a file, not a folder"),
        run("--output", "afile"),
    ),
    Case(
        "output-override-under-a-file",
        {"study.yaml": STUDY, "afile": "a file\n"},
        ("override output=afile/runs:", "output:", "afile is a file"),
        ("{command}", "{dir}/study.yaml", "output=afile/runs"),
    ),
    Case(
        "default-output-under-a-file",
        {"study.yaml": STUDY_DEFAULT_OUTPUT, "runs": "a file\n"},
        ("runs is a file, not a folder", "output:", "--output"),
    ),
    Case(
        "output-name-too-long",
        {"study.yaml": STUDY},
        ("--output", "file name too long"),
        run("--output", "b" * 300),
    ),
    Case(
        "output-symlink-loop",
        {"study.yaml": STUDY},
        ("--output loop/runs:", "not a usable folder", "loop"),
        run("--output", "loop/runs"),
    ),
    Case(
        "output-nul-byte",
        {"study.yaml": study_text(replace={"output": "runs/a\0b"})},
        ("study.yaml: output: not a usable folder", "null byte"),
        run(),
    ),
    Case(
        "output-holds-a-file-named-workers",
        {"study.yaml": STUDY, "runs/tiny/workers": "a file\n"},
        ("study.yaml:", ": output: ", "runs/tiny/workers is a file, not a folder"),
        run(),
    ),
    Case(
        "reports-under-a-file",
        {"study.yaml": STUDY, "afile": "a file\n"},
        ("--reports afile/reports:", "afile is a file, not a folder"),
        run("--reports", "afile/reports"),
    ),
    Case(
        "worker-output-under-a-file",
        {"study.yaml": STUDY, "afile": "a file\n"},
        ("--output afile/runs:", "afile is a file"),
        ("worker", "{dir}/study.yaml", "--output", "afile/runs"),
    ),
    Case(
        "report-reports-under-a-file",
        {"study.yaml": STUDY, "afile": "a file\n"},
        ("--reports afile/r:", "afile is a file"),
        ("report", "{dir}/study.yaml", "--reports", "afile/r"),
    ),
    Case(
        "report-folder-under-a-file",
        {"study.yaml": study_text(replace={"output": "afile/runs"}), "afile": "a file\n"},
        ("study.yaml:", ": output: ", "afile is a file"),
        ("report", "{dir}/study.yaml"),
    ),
    # -- storage and tracking arguments -----------------------------------------------------
    Case(
        "storage-not-a-url",
        {"study.yaml": STUDY},
        ("--storage notaurl:", "not a storage URL or journal file"),
        run("--storage", "notaurl"),
    ),
    Case(
        "storage-unknown-database-kind",
        {"study.yaml": STUDY},
        ("--storage postgres://u:***@host/db:", "unknown database kind 'postgres'"),
        run("--storage", "postgres://u:secret@host/db"),
    ),
    Case(
        "storage-in-memory",
        {"study.yaml": STUDY},
        ("--storage sqlite://:", "in-memory"),
        run("--storage", "sqlite://"),
    ),
    Case(
        "storage-journal-under-a-file",
        {"study.yaml": STUDY, "afile": "a file\n"},
        ("--storage afile/q.journal:", "afile is a file"),
        run("--storage", "afile/q.journal"),
    ),
    Case(
        "storage-journal-is-a-folder",
        {"study.yaml": STUDY, "shared.journal/x": ""},
        ("shared.journal: the Optuna journal is not a file",),
        run("--storage", "shared.journal"),
    ),
    Case(
        "status-storage-not-a-url",
        {"study.yaml": STUDY},
        ("--storage notaurl:",),
        ("status", "{dir}/study.yaml", "--storage", "notaurl"),
    ),
    Case(
        "worker-storage-not-a-url",
        {"study.yaml": STUDY},
        ("--storage notaurl:",),
        ("worker", "{dir}/study.yaml", "--storage", "notaurl"),
    ),
    Case(
        "tracking-uri-not-a-uri",
        {"study.yaml": STUDY},
        ("--tracking-uri notaurl:", "not a tracking URI"),
        run("--tracking-uri", "notaurl"),
    ),
    Case(
        "report-tracking-uri-not-a-uri",
        {},
        ("--tracking-uri notaurl:",),
        ("report", "--experiment", "tiny", "--tracking-uri", "notaurl"),
    ),
    # -- stores on disk -----------------------------------------------------------------------
    Case(
        "journal-corrupt-mid-file",
        {"study.yaml": STUDY, JOURNAL: JOURNAL_HEAD + b'{"op_code":4,"trial\n' + JOURNAL_TAIL},
        ("runs/tiny/optuna.journal:2:", "corrupt record"),
        run(),
    ),
    Case(
        "status-journal-corrupt-mid-file",
        {"study.yaml": STUDY, JOURNAL: JOURNAL_HEAD + b"}{\n" + JOURNAL_TAIL},
        ("runs/tiny/optuna.journal:2:", "corrupt record"),
        ("status", "{dir}/study.yaml"),
    ),
    Case(
        "journal-not-utf8",
        {"study.yaml": STUDY, JOURNAL: JOURNAL_HEAD + b'{"op\xff\xfe":1}\n' + JOURNAL_TAIL},
        ("runs/tiny/optuna.journal:2:", "corrupt record"),
        run(),
    ),
    Case(
        "journal-unknown-op-code",
        {"study.yaml": STUDY, JOURNAL: JOURNAL_HEAD + b'{"op_code": 99, "worker_id": "w"}\n' + JOURNAL_TAIL},
        ("runs/tiny/optuna.journal:2:", "corrupt record", "no known op_code: 99"),
        run(),
    ),
    Case(
        "journal-is-a-folder",
        {"study.yaml": STUDY, "runs/tiny/optuna.journal/x": ""},
        ("optuna.journal:", "not a file"),
        run(),
    ),
    Case(
        "legacy-optuna-db-not-a-database",
        {"study.yaml": STUDY, "runs/tiny/optuna.db": NOT_SQLITE},
        ("optuna.db:", "cannot open the Optuna store"),
        run(),
    ),
    Case(
        "mlflow-db-not-a-database",
        {"study.yaml": STUDY, "runs/tiny/mlflow.db": NOT_SQLITE},
        ("mlflow.db", "not a database"),
        run(),
    ),
    Case(
        "report-nothing-run",
        {"study.yaml": STUDY},
        ("runs/tiny/mlflow.db", "has the study been run?"),
        ("report", "{dir}/study.yaml"),
    ),
    Case("report-no-study-no-experiment", {}, ("--experiment", "--tracking-uri"), ("report",)),
    Case(
        "report-experiment-in-no-store",
        {},
        ("none.db", "has the study been run?"),
        ("report", "--experiment", "tiny", "--tracking-uri", "sqlite:///{dir}/none.db"),
    ),
    # -- N workers: bad data is found once, before any worker starts ------------------------
    Case(
        "workers-bad-data-file",
        {
            "study.yaml": study_text(replace={"task.data": {"format": "user_item", "path": "bad.tsv"}}),
            "bad.tsv": "1\t2\n3\n",
        },
        ("bad.tsv:2:",),
        run("--workers", "2"),
    ),
]
if SYS_REFUSES:  # a folder even root cannot write in: permission bits alone do not stop root
    CASES.append(
        Case(
            "reports-not-writable",
            {"study.yaml": STUDY},
            ("--reports /sys/ablate-reports:", "cannot write in /sys"),
            run("--reports", "/sys/ablate-reports"),
        )
    )

# Symbolic links a case needs (the harness writes files only): link → target, in the case's folder.
LINKS = {
    "study-symlink-loop": {"loop.yaml": "loop.yaml"},
    "study-symlink-dangling": {"gone.yaml": "missing/study.yaml"},
    "output-symlink-loop": {"loop": "loop"},
}


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.id)
def test_bad_input(case, tmp_path, cli, monkeypatch):
    for link, target in LINKS.get(case.id, {}).items():
        os.symlink(target, tmp_path / link)
    check(case, tmp_path, cli, monkeypatch)
    if case.args[0] in ("run", "worker"):
        assert not (tmp_path / "runs" / "tiny" / "checkpoints").exists()  # nothing trained


def test_the_corpus_is_large_enough():
    assert len(CASES) >= 30 and len({c.id for c in CASES}) == len(CASES)

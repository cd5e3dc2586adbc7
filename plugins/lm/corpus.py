"""Documents of text: read from files, the interpreter's standard library or generated, and split
into training and held-out text.

A document is one text file, one JSON line or one parquet row, named by where it came from
(``dir/file.txt``, ``a.jsonl:12``, ``b.parquet#3``). The held-out splits are drawn across the corpus:
the documents are put in the order of a hash of their names (a fixed shuffle that no file order,
date or size decides) and validation and test are that order's tail by bytes (test last); a
document the cut falls inside is cut in two, so a single long file splits too. Or they are files of
their own. Each held-out split is then scored on a budget of bytes drawn evenly from all its
documents (:func:`even_share`), not on its first document or two.
"""

from __future__ import annotations

import hashlib
import json
import sys
import sysconfig
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from ablate import stopping
from ablate.errors import DataError, parse_json, warn
from ablate_plugins.text_files import EmptyFile, read_bytes, read_text

from .options import FileData, StdlibData, SyntheticData

SPLITS = ("train", "valid", "test")


@dataclass
class Corpus:
    """Each split's documents, and where they came from (for the data summary)."""

    splits: dict[str, list[str]]  # the documents' text; the held-out ones in their drawn order
    source: str
    facts: dict[str, str] = field(default_factory=dict)  # e.g. the Python version of stdlib text


# -- reading ----------------------------------------------------------------------------------


def files_of(path: Path, pattern: str) -> list[Path]:
    """``path`` itself, or a folder's files matching ``pattern`` in name order (none: one line)."""
    if not path.is_dir():
        return [path]
    found = sorted(p for p in path.glob(pattern) if p.is_file())
    if not found:
        raise DataError(f"{path}: no files match {pattern!r} in this folder; set data.pattern")
    return found


Named = list[tuple[str, str]]  # (document name, text)


def read_jsonl(path: Path, key: str, encoding: str | None) -> Named:
    docs = []
    # Lines end at "\n" only: JSON text may hold U+2028 and other characters str.splitlines cuts at.
    for line_no, line in enumerate(read_text(path, encoding).split("\n"), 1):
        if not line.strip():
            continue
        try:
            record = parse_json(line)
        except json.JSONDecodeError as exc:
            raise DataError(f"{path}:{line_no}: not a JSON object ({exc.msg})") from None
        text = record.get(key) if isinstance(record, dict) else None
        if not isinstance(text, str):
            what = "has no" if not isinstance(record, dict) or key not in record else "has a non-text"
            raise DataError(f"{path}:{line_no}: the record {what} {key!r} field; set data.text_field")
        docs.append((f"{path.name}:{line_no}", text))
    return docs


def read_parquet(path: Path, column: str) -> Named:
    import pyarrow.parquet as pq  # pandas' parquet engine; imported when a parquet file is read

    read_bytes(path)  # missing / empty / a folder: the shared one-line messages
    try:
        table = pq.read_table(path)
    except Exception as exc:  # pyarrow's errors for a file that is not parquet vary by version
        raise DataError(f"{path}: not a readable parquet file ({str(exc).splitlines()[0]})") from None
    if column not in table.column_names:
        names = ", ".join(table.column_names[:8])
        raise DataError(f"{path}: no column {column!r} (columns: {names}); set data.text_field")
    values = table.column(column).to_pylist()
    for row, text in enumerate(values):
        if not isinstance(text, str):
            raise DataError(f"{path}: row {row} of column {column!r} is not text ({type(text).__name__})")
    return [(f"{path.name}#{row}", text) for row, text in enumerate(values)]


def read_documents(path: Path, pattern: str, key: str, encoding: str | None) -> Named:
    """Every document of a file or folder, named: ``.jsonl`` lines, ``.parquet`` rows, other files
    whole (a folder's files by their path inside it)."""
    docs: Named = []
    empty = 0
    for file in files_of(path, pattern):
        stopping.check()
        prefix = file.relative_to(path).parent.as_posix() + "/" if path.is_dir() else ""
        try:
            if file.suffix == ".jsonl":
                found = read_jsonl(file, key, encoding)
            elif file.suffix == ".parquet":
                found = read_parquet(file, key)
            else:
                found = [(file.name, read_text(file, encoding))]
        except EmptyFile:
            if not path.is_dir():
                raise
            empty += 1  # a folder's empty files (a package's __init__.py) are empty documents: none
            continue
        docs += [(f"{prefix}{name}".removeprefix("./"), text) for name, text in found]
    docs = [d for d in docs if d[1]]
    if not docs:
        raise DataError(f"{path}: holds no text (every document is empty)")
    if empty:
        warn(f"{path}: {empty} empty file(s) skipped")
    return docs


def stdlib_files(data: StdlibData) -> list[Path]:
    """The standard-library files ``data`` reads: ``pattern`` in name order, up to ``max_bytes``."""
    folder = Path(sysconfig.get_paths()["stdlib"])
    chosen, total = [], 0
    for file in files_of(folder, data.pattern):
        if data.max_bytes is not None and total >= data.max_bytes:
            break
        chosen.append(file)
        total += file.stat().st_size
    return chosen


def stdlib_version() -> str:
    return f"{sys.version.split()[0]} ({sys.implementation.name})"


WORDS = "zero one two three four five six seven eight nine".split()
PHRASES = ["the cat sat on the mat", "a stitch in time saves nine", "to be or not to be"]


def synthetic_documents(data: SyntheticData) -> list[str]:
    """Documents of counting runs (``three four five …``) and repeated phrases: the next word is
    mostly determined by the last, so a model that learns the runs beats a unigram model."""
    rng = np.random.default_rng(data.seed)
    docs = []
    for _ in range(data.documents):
        words: list[str] = []
        while len(words) < data.words:
            if rng.random() < 0.3:
                words += PHRASES[rng.integers(len(PHRASES))].split()
            else:
                start, run = int(rng.integers(10)), int(rng.integers(3, 8))
                words += [WORDS[(start + i) % 10] for i in range(run)]
            words[-1] += "." if rng.random() < 0.5 else ","
        docs.append(" ".join(words[: data.words]) + "\n")
    return docs


# -- splitting --------------------------------------------------------------------------------


def cut_tail(docs: list[str], fraction: float) -> tuple[list[str], list[str]]:
    """``docs`` split by bytes into the head and its last ``fraction`` (at least one character),
    a document straddling the cut cut in two at a character boundary."""
    sizes = np.array([len(d.encode()) for d in docs], dtype=np.int64)
    keep = int(sizes.sum()) - max(1, round(fraction * int(sizes.sum())))  # head bytes
    ends = np.cumsum(sizes)
    i = int(np.searchsorted(ends, keep, side="right"))  # the document the cut falls in
    if i >= len(docs):
        return docs, []
    before = keep - (int(ends[i - 1]) if i else 0)  # bytes of document i that stay in the head
    raw = docs[i].encode()
    head_part = raw[:before].decode(errors="ignore")  # a cut inside a character moves before it
    tail_part = docs[i][len(head_part) :]
    head = docs[:i] + ([head_part] if head_part else [])
    tail = ([tail_part] if tail_part else []) + docs[i + 1 :]
    return head, tail


def drawn(docs: Named) -> list[str]:
    """The documents' text in the order of a hash of their names: a shuffle fixed by the names
    alone, so the held-out tail of it is drawn across the whole corpus."""
    key = {name: hashlib.blake2b(name.encode(), digest_size=8).digest() for name, _ in docs}
    return [text for name, text in sorted(docs, key=lambda d: key[d[0]])]


def even_share(docs: list[str], budget: int) -> list[str]:
    """At most ``budget`` bytes of ``docs`` drawn evenly from every document: each gives the same
    fraction of its bytes, one passage starting at a point a hash of its text picks (characters
    kept whole). ``docs`` within the budget come back as they are."""
    sizes = [len(d.encode()) for d in docs]
    if sum(sizes) <= budget:
        return docs
    fraction, passages = budget / sum(sizes), []
    for doc, size in zip(docs, sizes, strict=True):
        take = int(fraction * size)
        if take == 0:
            continue
        point = int.from_bytes(hashlib.blake2b(doc.encode(), digest_size=8).digest(), "big")
        start = point % (size - take + 1)
        passage = doc.encode()[start : start + take].decode(errors="ignore")  # cut characters dropped
        if passage:
            passages.append(passage)
    return passages


def split(docs: Named, valid: float | list[str], test: float | list[str]) -> dict[str, list[str]]:
    """Training, validation and test documents: a fraction is cut from the tail of the documents
    in their drawn order (:func:`drawn`; test last), a list of documents is that split's own text."""
    rest = drawn(docs)
    if isinstance(test, float):
        rest, test = cut_tail(rest, test)
    if isinstance(valid, float):
        total = sum(len(d.encode()) for d in rest)
        whole = sum(len(d.encode()) for _, d in docs)
        rest, valid = cut_tail(rest, valid * whole / max(total, 1))
    return {"train": rest, "valid": valid, "test": test}


def synthetic_corpus(data: SyntheticData, base: Path, valid: float, test: float) -> Corpus:
    docs = [(f"synthetic/{i}", d) for i, d in enumerate(synthetic_documents(data))]
    return Corpus(split(docs, valid, test), f"synthetic(seed={data.seed})")


def stdlib_corpus(data: StdlibData, base: Path, valid: float, test: float) -> Corpus:
    files = stdlib_files(data)
    root = Path(sysconfig.get_paths()["stdlib"])
    docs = [(f.relative_to(root).as_posix(), d) for f, d in ((f, read_text(f)) for f in files) if d]
    total = sum(len(d.encode()) for _, d in docs)
    if data.max_bytes is not None and total > data.max_bytes:
        kept = cut_tail([d for _, d in docs], 1.0 - data.max_bytes / total)[0]
        docs = [(name, text) for (name, _), text in zip(docs, kept, strict=False)]
    facts = {"python": stdlib_version(), "stdlib files": str(len(files))}
    return Corpus(split(docs, valid, test), f"the standard library's {data.pattern}", facts)


def file_corpus(data: FileData, base: Path, valid: float, test: float) -> Corpus:
    path = base / Path(data.path).expanduser()
    docs = read_documents(path, data.pattern, data.text_field, data.encoding)
    own = {}
    for name in ("valid", "test"):
        given = getattr(data, f"{name}_path")
        if given is not None:
            found = read_documents(
                base / Path(given).expanduser(), data.pattern, data.text_field, data.encoding
            )
            own[name] = [text for _, text in found]
    return Corpus(split(docs, own.get("valid", valid), own.get("test", test)), str(path))


# ``data.format`` → how its documents are read.
CORPORA = {"files": file_corpus, "stdlib": stdlib_corpus, "synthetic": synthetic_corpus}


def given_files(data: FileData, base: Path) -> dict[str, Path]:
    keys = ("path", "valid_path", "test_path")
    return {k: base / Path(getattr(data, k)).expanduser() for k in keys if getattr(data, k) is not None}


def library_files(data: StdlibData, base: Path) -> dict[str, Path]:
    root = Path(sysconfig.get_paths()["stdlib"])
    return {f"stdlib/{p.relative_to(root).as_posix()}": p for p in stdlib_files(data)}


# ``data.format`` → the files its documents come from (option or file name → path), whose content
# names what a trial trained on.
DATA_FILES = {"files": given_files, "stdlib": library_files, "synthetic": lambda data, base: {}}


def load_corpus(data: FileData | StdlibData | SyntheticData, base: Path, valid: float, test: float) -> Corpus:
    """Read the documents ``data`` names and split them (see :func:`split`)."""
    return CORPORA[data.format](data, base, valid, test)

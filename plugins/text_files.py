"""Reading a task's text data files: every problem one line naming the file (and line).

* :func:`read_text` — a file's text: a folder, an empty or binary file, bytes that are not in the
  declared encoding (UTF-8 unless ``encoding`` says otherwise) each stop with one line, the last
  naming the ``encoding`` option; ``.gz`` files are decompressed, and a zip archive holding one
  data file is read from the archive (no unpacking by hand).
* :func:`read_records` — delimited records (CSV / TSV / any separator) with the file line each one
  starts on, blank lines skipped, every record checked to have as many fields as the header.
* :data:`Encoding`, :data:`Separator` — the option types the loaders share, checked when the study
  is validated.
* :func:`memory_problem` — an option validator's check of a size estimate against this machine.

Loaders call :func:`ablate.stopping.check` between chunks of records, so a stop request (SIGTERM,
Ctrl-C) interrupts a long load.
"""

from __future__ import annotations

import codecs
import csv
import gzip
import io
import os
import re
import zipfile
import zlib
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated

import numpy as np
from pydantic import AfterValidator, Field

from ablate import stopping
from ablate.errors import DataError

CHECK_EVERY = 1 << 14  # records between stop-request checks
BINARY_PROBE = 1 << 16  # bytes looked at for NUL bytes
GZIP_MAGIC = b"\x1f\x8b"
ZIP_MAGIC = b"PK\x03\x04"
COMMENT_MARKS = "|#%"  # what starts a comment line in UCI (|), shell-style (#) and ARFF (%) files


def _known_encoding(name: str | None) -> str | None:
    if name is not None:
        try:
            codecs.lookup(name)
        except LookupError:
            raise ValueError(f"unknown encoding {name!r} (e.g. utf-8, latin-1, cp1252, utf-16)") from None
    return name


def _usable_separator(sep: str) -> str:
    if len(sep) == 1:
        if sep in '"\r\n':
            raise ValueError(f"{sep!r} cannot separate fields (it quotes or ends records); use ',' or '\\t'")
        return sep
    try:
        re.compile(sep)
    except re.error as exc:
        raise ValueError(f"a separator longer than one character is a regular expression: {exc}") from None
    return sep


# The file's text encoding; None: UTF-8 (a byte-order mark is skipped).
Encoding = Annotated[str | None, AfterValidator(_known_encoding)]
# One character (quoted fields allowed, as CSV), or a regular expression (e.g. "::", "\\s+").
Separator = Annotated[str, Field(min_length=1), AfterValidator(_usable_separator)]


class EmptyFile(DataError):
    """A data file with nothing but white space in it (a folder's reader may skip it)."""


def read_bytes(path: Path) -> bytes:
    """The file's bytes (decompressed for ``.gz``; for a zip archive, its one data file's); a
    missing, unreadable or empty file, or a folder, raises one line naming it."""
    if path.is_dir():
        raise DataError(f"{path}: is a folder, not a data file")
    try:
        raw = path.read_bytes()
        if path.suffix == ".gz":
            raw = _gunzip(path, raw, physical_memory() // 4)
        elif raw.startswith(ZIP_MAGIC) or path.suffix == ".zip":
            raw = _unzip(path, raw, physical_memory() // 4)
    except FileNotFoundError:
        raise DataError(f"{path}: file not found") from None
    except (OSError, EOFError, zlib.error) as exc:
        raise DataError(f"{path}: cannot read: {exc}") from None
    except MemoryError:
        raise DataError(f"{path}: does not fit in this machine's memory") from None
    if not raw.strip():
        raise EmptyFile(f"{path}: the file is empty")
    return raw


def _gunzip(path: Path, raw: bytes, limit: int) -> bytes:
    """``raw`` decompressed, refused once it grows past ``limit`` bytes: a small file that inflates
    past a quarter of this machine's memory (a "gzip bomb") would end the process, not the load,
    and the parsed data take several times the text."""
    text = gzip.GzipFile(fileobj=io.BytesIO(raw)).read(limit + 1)
    if len(text) > limit:
        raise DataError(
            f"{path}: decompresses to more than {size(limit)} (a quarter of this machine's memory); not read"
        )
    return text


def _unzip(path: Path, raw: bytes, limit: int) -> bytes:
    """The one data file of a zip archive (folders, ``__MACOSX/`` and hidden files aside), refused
    past ``limit`` bytes as :func:`_gunzip` refuses; an archive of several files names them."""
    try:
        archive = zipfile.ZipFile(io.BytesIO(raw))
    except zipfile.BadZipFile as exc:
        raise DataError(f"{path}: not a readable zip archive ({exc})") from None
    members = [
        info
        for info in archive.infolist()
        if not info.is_dir()
        and not info.filename.startswith("__MACOSX/")
        and not Path(info.filename).name.startswith(".")
    ]
    if len(members) != 1:
        names = [m.filename for m in members]
        held = f"{len(names)} files ({_listed(names)})" if names else "no data file"
        raise DataError(
            f"{path}: a zip archive holding {held}; a loader reads a zip that holds one data file: "
            f"unzip the one you want and give its path"
        )
    info = members[0]
    try:
        with archive.open(info) as member:
            text = member.read(limit + 1)
    except RuntimeError as exc:  # an encrypted member
        raise DataError(f"{path}: cannot read {info.filename} from the archive: {exc}") from None
    except (zipfile.BadZipFile, NotImplementedError) as exc:  # a bad CRC; a compression zipfile lacks
        raise DataError(f"{path}: cannot read {info.filename} from the archive: {exc}") from None
    if len(text) > limit:
        raise DataError(
            f"{path}: {info.filename} decompresses to more than {size(limit)} (a quarter of this "
            f"machine's memory); not read"
        )
    return text


def read_text(path: Path, encoding: str | None = None) -> str:
    """The file's text in ``encoding`` (default UTF-8, with or without a byte-order mark)."""
    raw = read_bytes(path)
    if encoding is None:
        if raw.startswith(GZIP_MAGIC):
            raise DataError(f"{path}: a gzip-compressed file; name it with a .gz suffix to read it")
        nul = raw.find(b"\x00", 0, BINARY_PROBE)
        if nul >= 0:
            raise DataError(
                f"{path}: a binary file, not text (a NUL byte at byte {nul}); if it is UTF-16 text, "
                f"set data.encoding: utf-16"
            )
    try:
        text = raw.decode(encoding or "utf-8-sig")
    except UnicodeDecodeError as exc:
        line = raw.count(b"\n", 0, exc.start) + 1
        column = exc.start - (raw.rfind(b"\n", 0, exc.start) + 1) + 1
        byte = raw[exc.start : exc.start + 1].hex()
        raise DataError(
            f"{path}:{line}: byte 0x{byte} at column {column} is not {encoding or 'UTF-8'}; set "
            f"data.encoding to the file's encoding (e.g. latin-1, cp1252)"
        ) from None
    if encoding is not None and "\x00" in text[:BINARY_PROBE]:
        raise DataError(f"{path}: not {encoding} text (it decodes to NUL characters); check data.encoding")
    return text


@dataclass
class Records:
    """A delimited file's records: ``header`` (the file's first record, on line ``header_line``;
    or the names the options gave, line 0), ``rows[i]`` the i-th data record's fields (stripped),
    ``lines[i]`` the file line it starts on."""

    path: Path
    header: list[str | int]
    rows: list[list[str]]
    lines: np.ndarray  # [r] int64
    header_line: int = 0

    def column(self, name: str | int) -> np.ndarray:
        """``[r]`` object array of the column's fields."""
        j = self.header.index(name)
        out = np.empty(len(self.rows), dtype=object)
        out[:] = [row[j] for row in self.rows]
        return out

    def where(self, i: int) -> str:
        return f"{self.path}:{self.lines[i]}"


def _split_lines(text: str, sep: str):
    """(fields, start line, end line) of each line split at the regular expression ``sep``."""
    pattern = re.compile(sep)
    for number, line in enumerate(io.StringIO(text, newline=""), start=1):
        yield (pattern.split(line.rstrip("\r\n")) if line.strip() else []), number, number


def _csv_records(path: Path, text: str, sep: str):
    """(fields, start line, end line) of each CSV record (quoted fields may span lines)."""
    reader = csv.reader(io.StringIO(text, newline=""), delimiter=sep, skipinitialspace=True)
    end = 0
    while True:
        try:
            fields = next(reader)
        except StopIteration:
            return
        except csv.Error as exc:
            raise DataError(f"{path}:{end + 1}: cannot split into fields: {exc}") from None
        start, end = end + 1, reader.line_num
        yield fields, start, end


def read_records(
    path: Path,
    text: str,
    sep: str = ",",
    header: bool = True,
    names: Sequence[str] | None = None,
    comment: str | None = None,
    comment_option: bool = False,
    json_hint: str = "",
) -> Records:
    """Split ``text`` into records. With ``header`` the first non-blank record names the columns;
    without, ``names`` does (or, without names, the first record's field numbers 0, 1, …). Every
    record must have as many fields as there are columns. A record whose first field starts with
    ``comment`` is skipped; where the caller has a ``data.comment`` option (``comment_option``), a
    record of too few fields that starts with a comment mark says to set it. A first record that is
    a JSON object stops the read, with ``json_hint`` (the caller's format that reads one)."""
    split = _csv_records(path, text, sep) if len(sep) == 1 else _split_lines(text, sep)
    columns = list(names) if names is not None else None
    rows, lines, header_line = [], [], 0
    for count, (fields, start, _) in enumerate(split):
        if not count % CHECK_EVERY:
            stopping.check()  # a stop request interrupts a long file here
        if not fields or (len(fields) == 1 and not fields[0].strip()):
            continue  # a blank line
        fields = [f.strip() for f in fields]
        if comment is not None and fields[0].startswith(comment):
            continue
        if not rows and columns is None and fields[0].startswith("{"):
            raise DataError(f"{path}:{start}: a JSON object, not {sep!r}-separated fields{json_hint}")
        if columns is None and not header:
            columns = list(range(len(fields)))  # no header, no names: 0-based column numbers
        elif columns is None:
            columns, header_line = fields, start
            _check_header(path, start, columns, sep)
            continue
        if len(fields) != len(columns):
            hint = _comment_hint(fields, columns, sep) if comment_option else ""
            raise DataError(
                f"{path}:{start}: expected {len(columns)} fields ({_listed(columns)}); "
                f"got {len(fields)}{hint or _separator_hint(fields, sep)}"
            )
        rows.append(fields)
        lines.append(start)
    if columns is None:
        raise DataError(f"{path}: the file is empty")
    if not rows:
        raise DataError(f"{path}: no data rows{' after the header' if header else ''}")
    return Records(path, columns, rows, np.asarray(lines, dtype=np.int64), header_line)


def _check_header(path: Path, line: int, columns: list[str], sep: str) -> None:
    if len(columns) == 1 and len(sep) == 1:
        other = next((s for s in ",;\t|" if s != sep and s in columns[0]), None)
        if other is not None:
            raise DataError(
                f"{path}:{line}: the header is one column {columns[0][:60]!r} split at {sep!r}; "
                f"set data.sep: {other!r} if the file separates fields with it"
            )
    seen = set()
    for name in columns:
        if name in seen:
            hint = (
                "; if the first line is data, not a header, set data.header: false" if _numeric(name) else ""
            )
            raise DataError(f"{path}:{line}: the header names column {name!r} twice{hint}")
        seen.add(name)


def header_hint(columns: Sequence[str | int]) -> str:
    """A hint for a header that names none of the declared columns: where some of its fields are
    numbers, the first line is likely data."""
    numbers = [str(c) for c in columns if _numeric(str(c))]
    if not numbers:
        return ""
    return f"; its first line holds numbers ({', '.join(numbers[:3])}): if it is data, set data.header: false"


def _numeric(name: str) -> bool:
    try:
        float(name)
    except ValueError:
        return False
    return True


def _comment_hint(fields: list[str], columns: list, sep: str) -> str:
    """A short record opening with a comment mark (UCI's ``|``, ``#``, ``%``) other than the
    separator: a comment line, most likely."""
    mark = fields[0][:1]
    if mark in COMMENT_MARKS and mark != sep and len(fields) < len(columns):
        return f" (a comment line? set data.comment: {mark!r} to skip lines that start with it)"
    return ""


def _separator_hint(fields: list[str], sep: str) -> str:
    if len(fields) == 1 and len(sep) == 1:
        other = next((s for s in ",;\t|" if s != sep and s in fields[0]), None)
        if other is not None:
            return f" (is the separator {other!r}? set data.sep)"
    return ""


def _listed(names: Sequence[str], limit: int = 8) -> str:
    shown = ", ".join(map(str, names[:limit]))
    return shown + (f", … ({len(names)} in all)" if len(names) > limit else "")


def found(values: Sequence, limit: int = 10) -> str:
    """``"4: a, b, c, d"`` — how many values there are, and the first ``limit`` of them."""
    return f"{len(values)}: {_listed([str(v) for v in values], limit)}"


# ---------------------------------------------------------------------------------------
# Sizes


def physical_memory() -> int:
    """This machine's memory in bytes (1 TiB where the system does not say)."""
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return 1 << 40


def size(n: float) -> str:
    """``1.5 GiB``: bytes in binary units."""
    for unit in ("B", "KiB", "MiB", "GiB", "TiB", "PiB"):
        if n < 1024 or unit == "PiB":
            return f"{n:.3g} {unit}" if unit != "B" else f"{int(n)} B"
        n /= 1024
    raise AssertionError  # pragma: no cover


def memory_problem(estimate: float, what: str) -> str | None:
    """None when ``estimate`` bytes fit in half this machine's memory, else a reason naming both."""
    memory = physical_memory()
    if estimate <= memory / 2:
        return None
    return f"{what} need about {size(estimate)} of memory to generate; this machine has {size(memory)}"

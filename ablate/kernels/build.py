"""Compiling, checking and loading the kernels' shared library, failing safe: whatever goes
wrong (no compiler, a ``CC`` that does not run, a compile error or timeout, a folder others can
write to, a library that does not load) gives None and one warning line, and the callers run
torch's ops instead.

The library lives in a folder of the current user's (``kernels-<uid>`` under
:func:`ablate.cache.cache_dir`), created with mode 0o700 and refused unless it is a real
directory (not a symlink) owned by this user and writable by no one else: a library someone
else can plant there would run its constructor in this process. Its name is a hash of the
sources, the flags, the compiler's identity (its resolved path and ``--version``) and the CPU's
feature flags; beside it a ``.sha256`` file, written after a successful build, holds the hash
of its bytes, checked before every load (a truncated or corrupt library is rebuilt).

The ctypes signatures are read from the C sources' exported functions (:func:`signatures`).
"""

from __future__ import annotations

import ctypes
import hashlib
import logging
import os
import re
import shlex
import shutil
import stat
import subprocess
import tempfile
from pathlib import Path

log = logging.getLogger("ablate.kernels")

# Without -ffast-math: its -ffinite-math-only makes comparisons with the -INFINITY the kernels
# start their maxima from (and the -inf logits a padding mask puts in) undefined. These keep
# what it bought: vectorised sums (reassociation) and expf (glibc's vector maths, declared in
# vector_math.h; the maxima's reductions are `omp simd` loops).
FLAGS = [
    "-O3",
    "-march=native",
    "-fno-math-errno",
    "-fno-trapping-math",
    "-fassociative-math",
    "-fno-signed-zeros",
    "-freciprocal-math",
    "-fopenmp-simd",
    "-fPIC",
    "-shared",
]
# Seconds a compile may take before the torch forms run instead (ABLATE_KERNEL_BUILD_TIMEOUT).
BUILD_TIMEOUT = 300.0

_C_TYPES = {
    "int64_t": ctypes.c_int64,
    "uint64_t": ctypes.c_uint64,
    "int32_t": ctypes.c_int32,
    "int": ctypes.c_int,
    "float": ctypes.c_float,
    "double": ctypes.c_double,
}


class Unavailable(Exception):
    """Why the library cannot be used, in one line."""


def load(sources: list[Path], headers: list[Path], folder: Path) -> ctypes.CDLL | None:
    """The library of ``sources`` (C files, ``headers`` included by them) built in ``folder``
    (a private folder: see the module's note) with ``$CC`` (a command line, e.g. ``ccache gcc``)
    or else ``cc``/``gcc``, its exported functions' signatures set; None, with one warning line,
    where that fails."""
    try:
        return _load(sources, headers, folder)
    except (Unavailable, OSError, ValueError) as error:  # OSError: a file the build wrote, e.g.
        reason = error if isinstance(error, Unavailable) else f"{type(error).__name__}: {error}"
        log.warning("fused kernels unavailable (%s): torch's ops run in their place", reason)
        return None


def _load(sources: list[Path], headers: list[Path], folder: Path) -> ctypes.CDLL:
    compiler = compiler_command()
    source = b"".join(path.read_bytes() for path in sources + headers)
    identity = " ".join([*FLAGS, compiler_identity(compiler), _cpu_flags()]).encode()
    path = folder / f"ablate-kernels-{hashlib.sha256(source + identity).hexdigest()[:16]}.so"
    private_folder(folder)
    library = _open_verified(path) or _build(compiler, sources, path)
    for name, (argtypes, restype) in signatures(sources).items():
        try:
            function = getattr(library, name)
        except AttributeError:
            raise Unavailable(f"{path} has no function {name}") from None
        function.argtypes, function.restype = argtypes, restype
    return library


def compiler_command() -> list[str]:
    """``$CC`` split as a shell would (``ccache gcc``, ``gcc -m64``), else ``cc`` or ``gcc``."""
    try:
        command = shlex.split(os.environ.get("CC", ""))
    except ValueError as error:
        raise Unavailable(f"CC={os.environ['CC']!r} is not a command line: {error}") from None
    found = shutil.which("cc") or shutil.which("gcc")
    if not command and found is None:
        raise Unavailable("no C compiler found: set CC, or install cc or gcc")
    return command or [found]


def compiler_identity(compiler: list[str]) -> str:
    """The compiler's resolved path and ``--version`` output: a new compiler behind the same
    name builds a new library."""
    done = _run([*compiler, "--version"], 60.0, "asking the compiler its version")
    return " ".join([shutil.which(compiler[0]) or compiler[0], *compiler[1:], done.stdout, done.stderr])


def _run(command: list[str], timeout: float, doing: str) -> subprocess.CompletedProcess:
    try:
        return subprocess.run(command, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        raise Unavailable(f"{doing} took over {timeout:g} s ({shlex.join(command[:2])} …)") from None
    except OSError as error:  # not found, not executable
        raise Unavailable(f"{doing}: {shlex.join(command[:1])}: {error.strerror or error}") from None


def _cpu_flags() -> str:
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return os.uname().machine
    return next((line for line in text.splitlines() if line.startswith(("flags", "Features"))), "")


def private_folder(folder: Path) -> None:
    """Create ``folder`` (mode 0o700) where missing; raise :class:`Unavailable` unless it is a
    directory, not a symlink, owned by this user and writable by no one else, in folders where
    no one else can rename it (each above it owned by this user or root, and writable by others
    only with the sticky bit, as /tmp is)."""
    try:
        folder.mkdir(mode=0o700, parents=True, exist_ok=True)
        info = os.lstat(folder)
    except OSError as error:
        raise Unavailable(f"cannot create {folder}: {error.strerror or error}") from None
    if stat.S_ISLNK(info.st_mode) or not stat.S_ISDIR(info.st_mode):
        raise Unavailable(f"{folder} is not a directory of its own (a symlink?): refused")
    if info.st_uid != os.getuid():
        raise Unavailable(
            f"{folder} belongs to user {info.st_uid}, not to this user ({os.getuid()}): refused"
        )
    if info.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        raise Unavailable(f"{folder} is writable by others (mode {info.st_mode & 0o777:o}): refused")
    for above in {*folder.absolute().parents, *folder.resolve().parents}:
        info = os.stat(above)
        if info.st_uid not in (0, os.getuid()) or (
            info.st_mode & (stat.S_IWGRP | stat.S_IWOTH) and not info.st_mode & stat.S_ISVTX
        ):
            raise Unavailable(
                f"{above}, above {folder.name}, is writable by others without the sticky bit "
                f"(mode {info.st_mode & 0o7777:o}, user {info.st_uid}): refused"
            )


def _digest_path(path: Path) -> Path:
    return path.with_name(path.name + ".sha256")


def _open_verified(path: Path) -> ctypes.CDLL | None:
    """The library at ``path`` if its bytes hash to what its ``.sha256`` file says; None where
    either is missing or they differ (a build cut short, a corrupt copy: rebuild it). No one
    else can replace the file between the check and the load: the folder is private."""
    try:
        expected = _digest_path(path).read_text().strip()
        digest = hashlib.sha256(path.read_bytes()).hexdigest()
    except OSError:
        return None
    return _dlopen(path) if digest == expected else None


def _dlopen(path: Path) -> ctypes.CDLL:
    try:
        return ctypes.CDLL(str(path))
    except OSError as error:
        raise Unavailable(f"loading {path} failed: {str(error).splitlines()[0]}") from None


def _build(compiler: list[str], sources: list[Path], path: Path) -> ctypes.CDLL:
    """Compile into a fresh folder beside ``path``, then move the library and its hash into
    place (atomically: workers may build the same library at the same time) and load it."""
    timeout = float(os.environ.get("ABLATE_KERNEL_BUILD_TIMEOUT") or BUILD_TIMEOUT)
    with tempfile.TemporaryDirectory(dir=path.parent) as tmp:
        built = Path(tmp) / path.name
        command = [*compiler, *FLAGS, *map(str, sources), "-o", str(built), "-lm"]
        done = _run(command, timeout, "compiling the kernels")
        if done.returncode != 0:
            message = " ".join(done.stderr.split())[:300]
            raise Unavailable(f"{shlex.join(compiler)} failed compiling the kernels: {message}")
        if not built.is_file():
            raise Unavailable(f"{shlex.join(compiler)} reported success but wrote no library")
        _digest_path(built).write_text(hashlib.sha256(built.read_bytes()).hexdigest() + "\n")
        os.replace(built, path)
        os.replace(_digest_path(built), _digest_path(path))
    return _dlopen(path)


# Comments, then `#define NAME(T) body` (continued lines joined), then instantiations `NAME(float)`.
_COMMENT = re.compile(r"/\*.*?\*/|//[^\n]*", re.S)
_MACRO = re.compile(r"^[ \t]*#[ \t]*define[ \t]+(\w+)\(([^)]*)\)(.*)$", re.M)
_DIRECTIVE = re.compile(r"^[ \t]*#[^\n]*$", re.M)
_HEADER = re.compile(r"\s*(?P<prefix>[A-Za-z_][\w\s*]*?)\s*\b(?P<name>\w+)\s*\((?P<parameters>[^()]*)\)\s*")


def signatures(sources: list[Path]) -> dict[str, tuple[list, type | None]]:
    """``{name: (argument types, result type)}`` in ctypes of every function the C ``sources``
    export (defined at file scope, not ``static``), those of macros of the form ``#define
    NAME(T) ...`` instantiated as ``NAME(float)`` included. Pointers are ``c_void_p``; void is
    None."""
    found = {}
    for path in sources:
        for result, name, parameters in _exported(path.read_text()):
            arguments = [_c_type(parameter, name, path) for parameter in parameters]
            found[name] = arguments, None if result == "void" else _c_type(f"{result} result", name, path)
    return found


def _exported(text: str) -> list[tuple[str, str, list[str]]]:
    """``(result type, name, parameters)`` of each function ``text`` defines, not ``static``."""
    text = _COMMENT.sub(" ", text).replace("\\\n", " ")
    macros = {
        name: ([p.strip() for p in params.split(",")], body) for name, params, body in _MACRO.findall(text)
    }
    text = _DIRECTIVE.sub(" ", text)
    for name, (params, body) in macros.items():

        def expand(match: re.Match, params=params, body=body) -> str:
            values = [v.strip() for v in match.group(1).split(",")]
            for param, value in zip(params, values, strict=True):
                body = re.sub(rf"##\s*{param}\b", value, body)
                body = re.sub(rf"\b{param}\b", value, body)
            return body.replace("##", "")

        text = re.sub(rf"\b{name}\(([^()]*)\)", expand, text)
    functions, depth, start = [], 0, 0
    for at, char in enumerate(text):  # a definition: `prefix name(parameters) {` at depth 0
        if char == "{" and depth == 0:
            header = _HEADER.fullmatch(text[start:at])
            words = header["prefix"].split() if header else ["static"]
            if "static" not in words:
                result = " ".join(w for w in words if w not in ("extern", "inline", "const"))
                parameters = [p.strip() for p in header["parameters"].split(",")]
                functions.append((result, header["name"], [p for p in parameters if p not in ("", "void")]))
        depth += {"{": 1, "}": -1}.get(char, 0)
        if depth == 0 and char in ";}":
            start = at + 1
    return functions


def _c_type(parameter: str, function: str, path: Path):
    if "*" in parameter:
        return ctypes.c_void_p
    words = [w for w in parameter.split() if w != "const"]
    if len(words) != 2 or words[0] not in _C_TYPES:
        raise ValueError(
            f"{path.name}: {function}: no ctypes type for parameter {parameter!r} (add it to _C_TYPES)"
        )
    return _C_TYPES[words[0]]

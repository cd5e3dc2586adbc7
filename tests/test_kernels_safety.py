"""The kernels' build fails safe (a bad ``CC``, a compile error or timeout, a corrupt cached
library, a folder others can write to: None and one warning line, never an exception or a
planted library loaded), its signatures come from the C sources, and the one switch of the fast
paths (:mod:`ablate.fastpaths`) chooses the torch forms. Tiny fake sources stand in for the
kernels where a build is the point."""

from __future__ import annotations

import ctypes
import logging
import os
import shutil
import subprocess
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from ablate import components, fastpaths, kernels
from ablate.errors import AblateError
from ablate.kernels import build, lanes, unfused

# CI has a C compiler and runs as root: there (ABLATE_REQUIRE_COMPILER=1, set by .ci/run) what
# would skip for lack of either fails instead.
REQUIRED = os.environ.get("ABLATE_REQUIRE_COMPILER") == "1"


def lacking(why: str) -> None:
    if REQUIRED:
        pytest.fail(f"ABLATE_REQUIRE_COMPILER is set but {why}")
    pytest.skip(f"{why} (a C compiler and root; CI sets ABLATE_REQUIRE_COMPILER=1: fails)")


NO_COMPILER = (
    "no C compiler: the fused kernels are not built (install gcc; CI sets ABLATE_REQUIRE_COMPILER=1: fails)"
)
needs_compiler = pytest.mark.skipif(
    shutil.which("cc") is None and shutil.which("gcc") is None and not REQUIRED, reason=NO_COMPILER
)

TINY = """\
#include <stdint.h>
#define TWICE(T) /* a comment */ void twice_##T(const T *x, T *out, int64_t n) { \\
    for (int64_t i = 0; i < n; i++) out[i] = 2 * x[i]; }
static int helper(int a) { return a; }
TWICE(float)
TWICE(double)
int32_t answer(void) { return 42 + helper(0); }
"""


@pytest.fixture
def tiny(tmp_path, monkeypatch, caplog):
    """A one-file source, an empty private folder to build it in, CC unset, warnings captured."""
    source = tmp_path / "tiny.c"
    source.write_text(TINY)
    monkeypatch.delenv("CC", raising=False)
    caplog.set_level(logging.WARNING, logger="ablate.kernels")
    return source, tmp_path / "private"


def warnings_of(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == "ablate.kernels"]


def test_signatures_are_read_from_the_sources_macros_included_statics_left_out(tiny):
    source, _ = tiny
    found = build.signatures([source])
    assert found == {
        "twice_float": ([ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64], None),
        "twice_double": ([ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64], None),
        "answer": ([], ctypes.c_int32),
    }


def test_every_exported_kernel_gets_its_signature():
    found = build.signatures(kernels.SOURCES)
    # 2 softmax-dropout + 2 dropout, then per float/double: 2 Sinkhorn, 4 stream-mixing, 3 gathered
    assert len(found) == 2 + 2 + 2 * (2 + 4 + 3)
    assert found["sinkhorn_backward_double"] == ([ctypes.c_void_p] * 3 + [ctypes.c_int64] * 4, None)
    assert found["dropout_bfloat16"][0][4:] == [ctypes.c_uint64, ctypes.c_int32, ctypes.c_float]
    assert {result for _, result in found.values()} == {None}
    if kernels.library() is not None and shutil.which("nm"):
        listed = subprocess.run(
            ["nm", "-D", "--defined-only", kernels.library()._name], capture_output=True, text=True
        ).stdout.split()
        exported = {name for kind, name in zip(listed[1::3], listed[2::3], strict=True) if kind == "T"}
        assert exported == set(found)


@needs_compiler
@pytest.mark.parametrize("cc", ["gcc -m64", "env gcc"])
def test_cc_is_a_command_line(tiny, monkeypatch, cc):
    if shutil.which("gcc") is None:
        lacking("no gcc")
    source, folder = tiny
    monkeypatch.setenv("CC", cc)
    library = build.load([source], [], folder)
    assert library is not None and library.answer() == 42


@pytest.mark.parametrize("cc", ["/nonexistent/cc", "ccache-that-is-not-there gcc", 'gcc "unbalanced', "true"])
def test_a_cc_that_cannot_build_gives_one_warning_line_and_no_library(tiny, monkeypatch, caplog, cc):
    source, folder = tiny
    monkeypatch.setenv("CC", cc)
    assert build.load([source], [], folder) is None
    (message,) = warnings_of(caplog)
    assert "\n" not in message and "torch's ops run in their place" in message


@needs_compiler
def test_a_compile_error_gives_one_warning_line(tiny, caplog):
    source, folder = tiny
    source.write_text("this is not C;\n")
    assert build.load([source], [], folder) is None
    (message,) = warnings_of(caplog)
    assert "failed compiling" in message and "\n" not in message


def test_a_compile_that_hangs_times_out(tiny, monkeypatch, caplog, tmp_path):
    source, folder = tiny
    slow = tmp_path / "slow-cc"
    slow.write_text('#!/bin/sh\n[ "$1" = --version ] && { echo slow 1.0; exit 0; }\nexec sleep 30\n')
    slow.chmod(0o755)
    monkeypatch.setenv("CC", str(slow))
    monkeypatch.setenv("ABLATE_KERNEL_BUILD_TIMEOUT", "0.5")
    assert build.load([source], [], folder) is None
    (message,) = warnings_of(caplog)
    assert "took over 0.5 s" in message


@needs_compiler
def test_a_corrupt_cached_library_is_rebuilt(tiny, caplog):
    source, folder = tiny
    assert build.load([source], [], folder) is not None
    (built,) = folder.glob("*.so")
    truncated = folder / "truncated"
    truncated.write_bytes(built.read_bytes()[:100])  # dlopen would raise
    truncated.replace(built)  # a new file: the loaded one stays mapped as it was
    library = build.load([source], [], folder)
    assert library is not None and library.answer() == 42 and built.stat().st_size > 100
    assert warnings_of(caplog) == []


PLANTED = """\
#include <stdio.h>
__attribute__((constructor)) static void plant(void) { FILE *f = fopen("MARKER", "w"); if (f) fclose(f); }
int answer(void) { return 7; }
"""


@needs_compiler
@pytest.mark.parametrize("unsafe", ["world-writable", "group-writable", "symlink", "someone else's"])
def test_a_library_planted_in_a_folder_others_control_is_never_loaded(tiny, tmp_path, caplog, unsafe):
    source, folder = tiny
    assert build.load([source], [], folder) is not None  # the real one, under its real name
    (built,) = folder.glob("*.so")
    marker = tmp_path / "planted-ran"
    planted = tmp_path / "planted.c"
    planted.write_text(PLANTED.replace("MARKER", str(marker)))
    compiler = build.compiler_command()
    subprocess.run(
        [*compiler, "-shared", "-fPIC", str(planted), "-o", str(tmp_path / "planted.so")], check=True
    )
    # What someone else with write access does: the planted library and a matching hash.
    shutil.copy(tmp_path / "planted.so", folder / "planted.so")
    (folder / "planted.so").replace(built)
    digest = subprocess.run(["sha256sum", str(built)], capture_output=True, text=True).stdout.split()[0]
    Path(f"{built}.sha256").write_text(digest + "\n")
    if unsafe == "world-writable":
        folder.chmod(0o777)
    elif unsafe == "group-writable":
        folder.chmod(0o770)
    elif unsafe == "symlink":
        folder.rename(tmp_path / "elsewhere")
        folder.symlink_to(tmp_path / "elsewhere")
    elif os.getuid() == 0:
        os.chown(folder, 4321, -1)
    else:
        lacking("changing a folder's owner needs root")
    assert build.load([source], [], folder) is None
    (message,) = warnings_of(caplog)
    assert "refused" in message and not marker.exists()
    ctypes.CDLL(str(tmp_path / "planted.so"))  # the marker works: loading it would have shown
    assert marker.exists()


@needs_compiler
def test_the_private_folder_is_made_for_this_user_only(tiny):
    source, folder = tiny
    assert build.load([source], [], folder / "deeper") is not None
    assert (folder / "deeper").stat().st_mode & 0o777 == 0o700


# ---------------------------------------------------------------------------------------------
# The kernels' inputs and the one switch


@pytest.mark.skipif(kernels.library() is None and not REQUIRED, reason=NO_COMPILER)
def test_gathered_dot_refuses_rows_outside_the_table():
    h, table = torch.randn(3, 4), torch.randn(5, 4)
    for bad in (5, -1):
        index = torch.tensor([[0, 1], [2, bad], [4, 4]])
        with pytest.raises(ValueError, match=r"outside the table's 5 rows \[0, 5\)"):
            kernels.gathered_dot(h, table, index)
    with pytest.raises(ValueError, match="index \\[t, k\\]"):
        kernels.gathered_dot(h, table, torch.zeros(2, 2, dtype=torch.int64))


@pytest.mark.parametrize(
    ("environment", "expected"),
    [
        ({}, dict.fromkeys(fastpaths.PATHS, True)),
        ({"ABLATE_FAST_PATHS": "0"}, dict.fromkeys(fastpaths.PATHS, False)),
        (
            {"ABLATE_FAST_PATHS": "kernels=0, fbgemm=0"},
            {"kernels": False, "lanes": True, "dense": True, "fbgemm": False},
        ),
        ({"ABLATE_FUSED_KERNELS": "0"}, {"kernels": False, "lanes": True, "dense": True, "fbgemm": True}),
    ],
)
def test_the_environment_switches_the_fast_paths(monkeypatch, environment, expected):
    monkeypatch.delenv("ABLATE_FAST_PATHS", raising=False)
    monkeypatch.delenv("ABLATE_FUSED_KERNELS", raising=False)
    for name, value in environment.items():
        monkeypatch.setenv(name, value)
    assert {path: fastpaths.enabled(path) for path in fastpaths.PATHS} == expected
    with fastpaths.fast_paths(True):  # code's choice stands over the environment's
        assert all(fastpaths.enabled(path) for path in fastpaths.PATHS)
    assert {path: fastpaths.enabled(path) for path in fastpaths.PATHS} == expected


def test_a_misspelt_fast_path_is_an_error(monkeypatch):
    monkeypatch.setenv("ABLATE_FAST_PATHS", "kernel=0")
    with pytest.raises(AblateError, match="'kernel=0' is not one of kernels=0|1"):
        fastpaths.enabled("kernels")
    with pytest.raises(TypeError, match="the fast paths are kernels, lanes, dense, fbgemm"):
        fastpaths.set_fast_paths(kernel=False)


def test_with_the_kernels_off_every_op_is_its_torch_form():
    torch.manual_seed(0)
    x, pre, res, post, y = (torch.randn(*shape) for shape in ((6, 3, 5), (6, 3), (6, 3, 3), (6, 3), (6, 5)))
    h, table, index = torch.randn(6, 5), torch.randn(9, 5), torch.randint(0, 9, (6, 4))
    logits = torch.randn(2, 4, 4)
    with fastpaths.fast_paths(kernels=False):
        assert kernels.library() is None
        assert torch.equal(kernels.sinkhorn(res, 5), unfused.sinkhorn(res, 5))
        assert torch.equal(kernels.mix_in(x, pre), unfused.mix_in(x, pre))
        assert torch.equal(kernels.mix_out(x, res, post, y), unfused.mix_out(x, res, post, y))
        assert torch.equal(kernels.gathered_dot(h, table, index), unfused.gathered_dot(h, table, index))
        assert torch.equal(kernels.dropout(h, 3, 0, 2.0), unfused.dropout(h, 3, 0, 2.0))
        assert torch.equal(
            kernels.softmax_dropout(logits, 3, (0, 16, 4), 0, 2.0),
            unfused.softmax_dropout(logits, 3, (0, 16, 4), 0, 2.0),
        )


def test_with_the_lanes_off_dropout_is_torchs():
    x = torch.randn(40, 7)
    torch.manual_seed(1)
    with fastpaths.fast_paths(False):
        ours = components.dropout(x, 0.25)
    torch.manual_seed(1)
    assert torch.equal(ours, F.dropout(x, 0.25, True))


@pytest.mark.parametrize(
    ("rows", "keys", "m", "offset"), [(3, 7, 7, 0), (5, 11, 13, 6), (2, 1, 1, 1), (4, 9, 10, 5)]
)
def test_a_chunks_lanes_are_those_of_its_place_in_the_whole(rows, keys, m, offset):
    """The torch form of softmax-dropout draws a query chunk's lanes by their place in the whole
    ``[r, n, m]``: what slicing the whole tensor's lanes gave before."""
    r, n, key = 3, offset + rows + 2, -(2**60) + 12345
    whole = lanes.lanes((r, n, m), torch.device("cpu"), key)
    block = lanes.strided_lanes((r, rows, keys), (offset * m, n * m, m), torch.device("cpu"), key)
    assert torch.equal(block, whole[:, offset : offset + rows, :keys])


def test_ci_lets_no_kernel_safety_test_skip():
    from pathlib import Path

    assert "export ABLATE_REQUIRE_COMPILER=1" in (Path(__file__).resolve().parents[1] / ".ci/run").read_text()

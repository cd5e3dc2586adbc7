"""Data by name: the registry against the files here (the mirror's, or the cache's), studies that
name their data, the mirror's one-line errors, and downloads served over loopback HTTP (a small
server in a thread): a download, a corrupted file refused by its checksum, the cache reused, an
interrupted download resumed."""

from __future__ import annotations

import gzip
import hashlib
import re
from pathlib import Path

import pytest
import yaml
from loopback import Server as _Server

from ablate.data import catalog as datasets
from ablate.data import derived
from ablate.data.catalog import Dataset, registry
from ablate.data.download import download, locate
from ablate.errors import DataError
from ablate.schema import Vocabulary

REPO = Path(__file__).resolve().parents[1]
# The entries the shared data folder holds (its README lists them): 19 files.
MIRRORED = ("ml-100k", "ml-1m-users2999", "ml-1m-sasrec-minus978", "beauty", "sports", "video")
MIRRORED += ("etth1", "etth2", "ettm1", "ettm2", "illness", "california-housing")


@pytest.mark.data(*MIRRORED)
def test_every_recorded_hash_is_the_file_here():
    """Each SHA-256 and size in the registry, computed again from the file here (a .gz file's
    from its decompressed content)."""
    checked = 0
    for dataset in registry().values():
        for relpath, (sha, size) in dataset.files.items():
            file = datasets.root() / relpath
            if not sha or not file.is_file():
                continue
            data = gzip.decompress(file.read_bytes()) if file.suffix == ".gz" else file.read_bytes()
            assert hashlib.sha256(data).hexdigest() == sha, relpath
            assert len(data) == size, relpath
            checked += 1
    assert checked >= 19  # every file of the shared data folder the registry names


def test_every_entry_is_complete():
    for d in registry().values():
        assert d.title and d.licence and d.citation and d.task in {"seqrec", "forecast", "tabular"}, d.name
        assert d.path and all(rel == d.path or rel.startswith(d.path + "/") for rel in d.files), d.name
        assert d.fetchable or d.why, f"{d.name}: neither a URL, a derivation nor why it has none"
        assert not d.derive or derived.problem(d) is None, f"{d.name}: {d.derive and derived.problem(d)}"
        assert not d.url or not d.redistribute or d.url.startswith("https://"), d.name


@pytest.mark.parametrize("study", sorted(p.name for p in (REPO / "studies").glob("*.yaml")))
def test_studies_name_their_data(study):
    """No study reads a folder beside the clone; a study that reads a file names its data set
    (tests/test_studies.py loads each from where its data are here)."""
    text = (REPO / "studies" / study).read_text()
    assert "shared/data" not in text
    data = yaml.safe_load(text)["task"].get("data", {})
    if isinstance(data, dict) and "path" in data:
        pytest.fail(f"{study}: task.data.path: name the data set instead")


def _registry_of(monkeypatch, *entries: Dataset) -> None:
    monkeypatch.setattr(datasets, "registry", lambda: Vocabulary("data set", {d.name: d for d in entries}))


def _entry(name: str, relpath: str, sha: str, url: str = "", size: int = 0) -> Dataset:
    licence = "CC0, for the test"
    return Dataset(
        name,
        name,
        "seqrec",
        {"format": "user_lines"},
        "loo",
        relpath,
        {relpath: (sha, size)},
        url,
        licence,
        "a cite",
        True,
    )


def test_a_file_missing_from_the_mirror_is_one_line(tmp_path, monkeypatch, write_study, cli):
    _registry_of(monkeypatch, _entry("toy", "toy/lines.txt", "ab" * 32))
    monkeypatch.setenv(datasets.MIRROR_ENV, str(tmp_path / "mirror"))
    code, _, err = cli("validate", write_study(replace={"task.data": {"name": "toy"}}))
    where = tmp_path / "mirror" / "toy" / "lines.txt"
    assert code == 2 and len(err.strip().splitlines()) == 1
    assert f"data set 'toy': toy/lines.txt is not in the data mirror: looked for {where}" in err
    (tmp_path / "mirror" / "toy").mkdir(parents=True)
    where.write_text("1 2 3\n")
    code, _, err = cli("validate", write_study(replace={"task.data": "toy"}))
    assert code == 2 and "does not hold the recorded data" in err and len(err.strip().splitlines()) == 1


def test_neither_network_nor_mirror_says_how_to_get_the_data(tmp_path, monkeypatch, write_study, cli):
    _registry_of(monkeypatch, _entry("toy", "toy/lines.txt", "", url="http://127.0.0.1:9/toy.txt"))
    monkeypatch.delenv(datasets.MIRROR_ENV, raising=False)
    monkeypatch.setenv(datasets.DATA_DIR_ENV, str(tmp_path / "cache"))
    monkeypatch.setattr(datasets, "RETRIES", 0)
    code, _, err = cli("validate", write_study(replace={"task.data": "toy"}))
    lines = [line for line in err.strip().splitlines() if line.startswith("error:")]
    assert code == 2 and len(lines) == 1, err
    assert "cannot download http://127.0.0.1:9/toy.txt" in lines[0]
    assert (
        "run `ablate data fetch toy` where 127.0.0.1:9 can be reached, or set ABLATE_DATA_MIRROR" in lines[0]
    )


@pytest.fixture
def server():
    body = b"".join(f"{u} {u + 1} {u + 2} {u + 3}\n".encode() for u in range(1, 20_000))
    running = _Server({"lines.txt": body, "bad.txt": body[:-10] + b"9 9 9 9 9\n"})
    yield running, body
    running.close()


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.delenv(datasets.MIRROR_ENV, raising=False)
    monkeypatch.setenv(datasets.DATA_DIR_ENV, str(tmp_path / "cache"))
    return tmp_path / "cache"


def test_download_checks_the_hash_and_reuses_the_cache(server, cache):
    srv, body = server
    toy = _entry("toy", "toy/lines.txt", hashlib.sha256(body).hexdigest(), url=f"{srv.url}/lines.txt")
    said = []
    path = download(toy, progress=False, say=said.append)
    assert path == cache / "toy" / "lines.txt" and path.read_bytes() == body
    assert said == ["toy: CC0, for the test. Cite: a cite"]
    assert srv.requests == [("/lines.txt", None)]
    assert locate(toy) == path and len(srv.requests) == 1  # in the cache and whole: no request
    path.write_bytes(body[:100])  # a damaged cached file is fetched again
    assert locate(toy).read_bytes() == body and len(srv.requests) == 2


def test_a_corrupted_download_is_refused(server, cache):
    srv, body = server
    toy = _entry("toy", "toy/lines.txt", hashlib.sha256(body).hexdigest(), url=f"{srv.url}/bad.txt")
    with pytest.raises(DataError, match=r"data set 'toy': .*bad.txt: refused, .*hash"):
        download(toy, progress=False, retries=0, say=lambda line: None)
    assert not (cache / "toy" / "lines.txt").exists()


def test_an_interrupted_download_resumes_with_a_range_request(server, cache):
    srv, body = server
    toy = _entry("toy", "toy/lines.txt", hashlib.sha256(body).hexdigest(), url=f"{srv.url}/lines.txt")
    srv.cut = 50_000
    with pytest.raises(DataError, match="cannot download"):
        download(toy, progress=False, retries=0, say=lambda line: None)
    assert not (cache / "toy" / "lines.txt").exists()
    path = download(toy, progress=False, retries=0, say=lambda line: None)
    assert path.read_bytes() == body
    (first, _), (again, asked) = srv.requests
    assert first == again == "/lines.txt"
    start = int(re.fullmatch(r"bytes=(\d+)-", asked).group(1))  # the bytes got, less a last chunk
    assert 50_000 - datasets.CHUNK < start <= 50_000
    assert not list((cache / ".partial").iterdir())  # the partial file became the download


def test_a_member_of_a_zip_archive_is_extracted_and_checked(cache):
    import io
    import zipfile

    body = b"1 2 3\n2 3 4\n"
    packed = io.BytesIO()
    with zipfile.ZipFile(packed, "w") as archive:
        archive.writestr("toy/README", b"not this one")
        archive.writestr("toy/lines.txt", body)
    srv = _Server({"toy.zip": packed.getvalue()})
    try:
        toy = _entry("toy", "toy/lines.txt", hashlib.sha256(body).hexdigest(), url=f"{srv.url}/toy.zip")
        toy = Dataset(**{**toy.__dict__, "member": "toy/lines.txt"})
        assert download(toy, progress=False, say=lambda line: None).read_bytes() == body
        wrong = Dataset(**{**toy.__dict__, "name": "wrong", "files": {"toy/lines.txt": ("00" * 32, 0)}})
        (cache / "toy" / "lines.txt").unlink()
        with pytest.raises(DataError, match="data set 'wrong': refused, .* does not hold the recorded data"):
            download(wrong, progress=False, say=lambda line: None)
        assert not (cache / "toy" / "lines.txt").exists()
    finally:
        srv.close()


def test_a_download_without_a_recorded_hash_says_so(server, cache):
    srv, body = server
    said = []
    download(_entry("toy", "toy/lines.txt", "", url=f"{srv.url}/lines.txt"), progress=False, say=said.append)
    assert said[-1].startswith("warning: toy/lines.txt: no SHA-256 is recorded for it, so nothing verified")
    assert said[-1].endswith(hashlib.sha256(body).hexdigest())


def test_the_data_commands(server, cache, cli, monkeypatch):
    srv, body = server
    toy = _entry("toy", "toy/lines.txt", hashlib.sha256(body).hexdigest(), url=f"{srv.url}/lines.txt")
    _registry_of(monkeypatch, toy)
    code, _, err = cli("data", "path", "toy")
    assert code == 2 and "data set 'toy' is not here" in err and "ablate data fetch toy" in err
    code, out, err = cli("data", "fetch", "toy")
    assert code == 0 and out.strip() == str(cache / "toy" / "lines.txt") and "CC0, for the test" in err
    code, out, _ = cli("data", "path", "toy")
    assert code == 0 and out.strip() == str(cache / "toy" / "lines.txt")
    code, out, _ = cli("data", "list")
    assert code == 0 and "toy" in out
    code, _, err = cli("data", "fetch", "tyo")
    assert code == 2 and "unknown data set 'tyo'; did you mean 'toy'?" in err

"""Data sets made here from a publisher's download (``derive`` in ablate/datasets.toml,
ablate/derived.py): the recipes on a few lines; a derivation served over loopback HTTP, its
content's digest checked and a wrong one refused; ``ablate data fetch`` saying where the data came
from; and a cache filled as a user without the shared data folder fills it — every entry the folder
holds fetched or derived from stand-ins of its publishers' files on loopback, then every committed
study that names data validated from that cache alone."""

from __future__ import annotations

import dataclasses
import gzip
import hashlib
import io
import zipfile
from collections import Counter
from pathlib import Path

import pytest
import yaml
from loopback import Server

from ablate.data import catalog as datasets
from ablate.data import derived, named
from ablate.data.catalog import Dataset
from ablate.errors import DataError
from ablate.schema import Vocabulary

REPO = Path(__file__).resolve().parents[1]
# The entries the shared data folder holds (tests/test_data_registry.py checks their digests).
MIRRORED = ("ml-100k", "ml-1m-users2999", "ml-1m-sasrec-minus978", "beauty", "sports", "video")
MIRRORED += ("etth1", "etth2", "ettm1", "ettm2", "illness", "california-housing")


def _numbered(*lines: str) -> list[tuple[int, bytes]]:
    return [(n, f"{line}\n".encode()) for n, line in enumerate(lines, 1)]


def _sha(body: bytes) -> str:
    return hashlib.sha256(body).hexdigest()


def _zip(members: dict[str, bytes]) -> bytes:
    packed = io.BytesIO()
    with zipfile.ZipFile(packed, "w", zipfile.ZIP_STORED) as archive:
        for name, body in members.items():
            archive.writestr(name, body)
    return packed.getvalue()


def _entry(name: str, relpath: str, sha: str, url: str = "", **more) -> Dataset:
    files, licence = {relpath: (sha, 0)}, "MovieLens terms, for the test"
    return Dataset(name, name, "seqrec", {}, "loo", relpath, files, url, licence, "a cite", False, **more)


def _registry_of(monkeypatch, entries: dict[str, Dataset]) -> None:
    monkeypatch.setattr(datasets, "registry", lambda: Vocabulary("data set", entries))


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.delenv(datasets.MIRROR_ENV, raising=False)
    monkeypatch.setenv(datasets.DATA_DIR_ENV, str(tmp_path / "cache"))
    return tmp_path / "cache"


def test_users_between_keeps_the_range_in_file_order():
    lines = _numbered("1::10::5::1", "2::11::3::2", "2::12::4::3", "3::10::1::4")
    kept = b"".join(derived.users_between(lines, [1, 2], "r.dat"))
    assert kept == b"1::10::5::1\n2::11::3::2\n2::12::4::3\n"
    with pytest.raises(DataError, match=r"^r.dat:2: not a MovieLens"):
        list(derived.users_between(_numbered("1::10::5::1", "x,10,5,1"), [1, 2], "r.dat"))


def test_drop_penultimate_leaves_out_the_listed_users_second_to_last_line():
    lines = _numbered("1 5", "1 6", "1 7", "2 5", "2 8", "3 9", "3 5")
    assert b"".join(derived.drop_penultimate(lines, [1, 3], "m.txt")) == b"1 5\n1 7\n2 5\n2 8\n3 5\n"
    for lines, users, problem in [
        (_numbered("1 5", "2 6"), [2], "user 2 has 1 line"),
        (_numbered("1 5", "2 6", "1 7"), [], "m.txt:3: user 1's lines are not together"),
        (_numbered("1 5", "1 6"), [1, 4], r"no line of user\(s\) \[4\]"),
        (_numbered("1 5", "one 6"), [1], "m.txt:2: not a `user item` line"),
    ]:
        with pytest.raises(DataError, match=problem):
            list(derived.drop_penultimate(lines, users, "m.txt"))


def test_a_derived_set_is_made_from_its_sources_download_and_checked(cache, cli, monkeypatch):
    ratings = "".join(f"{u}::{10 + k}::4::{1000 * u + k}\n" for u in range(1, 6) for k in range(3)).encode()
    kept = b"".join(line for line in ratings.splitlines(keepends=True) if int(line.split(b"::")[0]) <= 3)
    srv = Server({"ml/toy.zip": _zip({"toy/README": b"not this", "toy/ratings.dat": ratings})})
    try:
        recipe = {"from": "toy", "recipe": "movielens-users", "users": [1, 3]}
        source = _entry("toy", "toy/ratings.dat", "", url=f"{srv.url}/ml/toy.zip", member="toy/ratings.dat")
        made = _entry("toy-users", "toy/ratings.users1-3.dat.gz", _sha(kept), derive=recipe)
        wrong = _entry("toy-wrong", "toy/ratings.wrong.dat.gz", "00" * 32, derive=recipe)
        _registry_of(monkeypatch, {d.name: d for d in (source, made, wrong)})
        assert derived.problem(made) is None and "made from toy's download" in datasets.how_to_get(made)

        code, out, err = cli("data", "fetch", "toy-users")
        target = cache / "toy" / "ratings.users1-3.dat.gz"
        assert code == 0 and out.strip() == str(target), err
        assert gzip.decompress(target.read_bytes()) == kept
        assert "toy-users: derived from toy: the ratings of users 1-3, made here from its download" in err
        assert "its content checked against the recorded SHA-256" in err
        assert srv.requests == [("/ml/toy.zip", None)]
        code, _, err = cli("data", "fetch", "toy-users")  # made already: nothing downloaded
        assert code == 0 and "already in the cache" in err and len(srv.requests) == 1
        # The digest is the content's: the same lines as another gzip writes them still check out.
        target.write_bytes(gzip.compress(kept, compresslevel=1, mtime=12345))
        assert datasets.present(made)
        target.write_bytes(gzip.compress(kept[:-5]))
        assert not datasets.present(made)

        code, _, err = cli("data", "fetch", "toy-wrong")
        errors = [line for line in err.splitlines() if line.startswith("error:")]
        assert code == 2 and len(errors) == 1 and "data set 'toy-wrong': refused" in errors[0]
        assert "not the file it was made from" in errors[0]
        assert not list((cache / "toy").glob("ratings.wrong*"))  # nothing half-made left
    finally:
        srv.close()


def test_fetch_with_a_mirror_set_reads_the_mirror_and_says_so(tmp_path, monkeypatch, cli):
    body = b"1 2 3\n"
    toy = _entry("toy", "toy/lines.txt", _sha(body), url="http://127.0.0.1:9/toy.txt")
    _registry_of(monkeypatch, {"toy": toy})
    (tmp_path / "mirror" / "toy").mkdir(parents=True)
    (tmp_path / "mirror" / "toy" / "lines.txt").write_bytes(body)
    monkeypatch.setenv(datasets.MIRROR_ENV, str(tmp_path / "mirror"))
    code, out, err = cli("data", "fetch", "toy")
    assert code == 0 and out.strip() == str(tmp_path / "mirror" / "toy" / "lines.txt")
    assert "toy: in the data mirror" in err and "nothing downloaded" in err and "publisher" not in err


def _stand_ins(entry: Dataset, mirror: Path, sources: dict[str, Dataset]) -> dict[str, bytes]:
    """What the publisher of ``entry`` (of its source, for a derived one) serves, made from the
    mirror's file: URL → bytes."""
    if entry.derive:
        source = sources[entry.derive["from"]]
        ((relpath, _),) = entry.files.items()
        body = mirror.joinpath(relpath).read_bytes()
        if entry.derive["recipe"] == "movielens-users":  # ml-1m: the users past the cut too
            body = gzip.decompress(body) + b"3000::1193::5::978300760\n3001::661::3::978302109\n"
        else:  # SASRec's ml-1m.txt: each listed user's second-to-last item back (a stand-in item)
            listed, lines = {str(u).encode() for u in entry.derive["users"]}, body.splitlines(keepends=True)
            whole = []
            for n, line in enumerate(lines):
                user = line.split()[0]
                if user in listed and (n + 1 == len(lines) or lines[n + 1].split()[0] != user):
                    whole.append(user + b" 1\n")  # before the user's last line
                whole.append(line)
            body = b"".join(whole)
        return {source.url: _zip({source.member: body}) if source.member else body}
    if entry.member:
        return {entry.url: _zip({entry.member: mirror.joinpath(entry.path).read_bytes()})}
    return {entry.source_of(rel): mirror.joinpath(rel).read_bytes() for rel in entry.files}


def _named(study: Path) -> list[str]:
    data = yaml.safe_load(study.read_text())["task"].get("data")
    return [n for n in map(named.label_of, named.entries_of(data) or [data]) if n]


@pytest.mark.heavy
@pytest.mark.data(*MIRRORED)
def test_a_cache_filled_from_the_publishers_validates_every_committed_study(tmp_path, monkeypatch, cli):
    """The shared data folder's files stand in for what their publishers serve (GroupLens's zips
    hold them, for a derived set with the lines the derivation drops put back); every registry URL
    points at a loopback server; each entry the folder holds is fetched into an empty cache, the
    mirror unset, then each committed study naming data validates from that cache alone."""
    mirror, entries = datasets.root(), dict(datasets.registry().items())
    srv = Server({})
    moved = {
        n: dataclasses.replace(d, url=d.url.replace("https://", f"{srv.url}/")) for n, d in entries.items()
    }
    try:
        for name in MIRRORED:
            for url, body in _stand_ins(moved[name], mirror, moved).items():
                srv.files[url.removeprefix(f"{srv.url}/")] = body
        _registry_of(monkeypatch, moved)
        monkeypatch.delenv(datasets.MIRROR_ENV, raising=False)
        monkeypatch.setenv(datasets.DATA_DIR_ENV, str(tmp_path / "cache"))
        for name in MIRRORED:
            code, out, err = cli("data", "fetch", name)
            assert code == 0 and Path(out.strip()).is_relative_to(tmp_path / "cache"), err
            assert datasets.present(moved[name])
        assert set(Counter(path for path, _ in srv.requests).values()) == {1}  # each file fetched once
        studies = [p for p in sorted((REPO / "studies").glob("*.yaml")) if _named(p)]
        assert len(studies) >= 20 and {n for p in studies for n in _named(p)} <= set(MIRRORED)
        for study in studies:
            code, _, err = cli("validate", study, f"output={tmp_path / 'runs' / study.stem}")
            assert code == 0, f"{study.name}: {err}"
    finally:
        srv.close()

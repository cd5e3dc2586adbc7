"""Hostile files at the doors that read them (issue 59, item 8): JSON nested past Python's
recursion limit, an id field of megabytes, a symbolic link loop. Each is one line naming the file
(and line), never a RecursionError, a request for gigabytes or "not found"."""

from __future__ import annotations

import json

import pytest

from ablate.errors import AblateError, parse_json

DEEP = "[" * 100_000 + "]" * 100_000  # Python's parser recursed once a level: RecursionError
DEEP_OBJECT = '{"a": ' * 100_000 + "1" + "}" * 100_000


def test_json_nested_too_deeply_is_a_decode_error_like_any_other():
    for text in (DEEP, DEEP.encode()):
        with pytest.raises(json.JSONDecodeError, match="nested too deeply"):
            parse_json(text)
    assert parse_json('{"a": [1, 2]}') == {"a": [1, 2]}


def _seqrec(path):
    from ablate_plugins.seqrec.readers import read_json_lines

    read_json_lines(path)


def _lm(path):
    from ablate_plugins.lm.corpus import read_jsonl

    read_jsonl(path, "text", None)


def _items(path):
    from ablate.report.item_logs import _json_lines

    _json_lines(path)


def _journal(path):
    from ablate.drive.journal import _complete_records

    _complete_records(path)


@pytest.mark.parametrize("read", [_seqrec, _lm, _items, _journal])
def test_a_json_line_nested_too_deeply_is_one_line_naming_the_file_and_line(tmp_path, read):
    path = tmp_path / "data.jsonl"
    path.write_text(DEEP_OBJECT + "\n")
    with pytest.raises(AblateError, match="nested too deeply") as refused:
        read(path)
    assert str(refused.value).startswith(f"{path}:1: ") and "\n" not in str(refused.value)


def test_tabular_info_nested_too_deeply_is_one_line(tmp_path):
    from ablate_plugins.tabular.data import _info

    (tmp_path / "info.json").write_text(DEEP)
    with pytest.raises(AblateError, match=r"info.json:1: not valid JSON: nested too deeply"):
        _info(tmp_path / "info.json")


def test_an_id_of_megabytes_is_refused_before_it_is_stored_as_fixed_width_text(tmp_path):
    """Text ids are kept as fixed-width text: one 40 MB id made each of 44 ids 160 MB (6.7 GiB)."""
    from ablate_plugins.seqrec.ids import MAX_ID_CHARS
    from ablate_plugins.seqrec.readers import read_json_lines

    path = tmp_path / "reviews.jsonl"
    lines = [json.dumps({"user_id": f"u{i % 4}", "item_id": f"i{i}"}) for i in range(20)]
    lines.insert(7, json.dumps({"user_id": "u1", "item_id": "x" * (MAX_ID_CHARS + 1)}))
    path.write_text("\n".join(lines) + "\n")
    with pytest.raises(AblateError) as refused:
        read_json_lines(path)
    said = str(refused.value)
    assert said.startswith(f"{path}:8: item key 'item_id' holds 'xxx") and len(said) < 300, said
    assert f"{MAX_ID_CHARS + 1:,} characters long, not an id" in said


def test_a_symbolic_link_loop_is_named_as_one(tmp_path, cli):
    (tmp_path / "a.yaml").symlink_to(tmp_path / "b.yaml")
    (tmp_path / "b.yaml").symlink_to(tmp_path / "a.yaml")
    code, _, err = cli("validate", tmp_path / "a.yaml")
    assert (
        code == 2
        and err.strip()
        == f"error: {tmp_path / 'a.yaml'}: a symbolic link loop (its links never reach a file)"
    )
    args = ["-m", "acc", "--baseline", "lr=0.1", "--out", tmp_path / "r"]
    for given in (["compare", tmp_path / "a.yaml"], ["compare", "--items", tmp_path / "a.yaml"]):
        code, _, err = cli(*given, *args)
        assert code == 2 and "a symbolic link loop" in err and len(err.strip().splitlines()) == 1, err
    (tmp_path / "gone.yaml").symlink_to(tmp_path / "nowhere.yaml")
    code, _, err = cli("validate", tmp_path / "gone.yaml")
    assert code == 2 and "study file not found (a symbolic link to a missing file)" in err, err

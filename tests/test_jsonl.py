"""The one JSON-lines reader: bad lines counted and skipped with their line numbers, clear errors, gzip."""

import gzip
import json

import pytest

from rankgen_jax.data.jsonl import (MALFORMED_JSON, NOT_AN_OBJECT, NOT_UTF8, SkippedLines, iter_jsonl, parse_lines,
                                    read_jsonl, write_jsonl)
from rankgen_jax.errors import RankgenError

GOOD = [{"text": "one"}, {"text": "two", "id": 7}, {"text": "caf\u00e9"}]


def _check_text(record):
    return None if isinstance(record.get("text"), str) else "no text string"


def _mixed_file(path):
    lines = [json.dumps(GOOD[0]).encode(),  # 1
             b"{not json",  # 2
             b"",  # 3: blank, passes silently
             b"[1, 2]",  # 4
             json.dumps(GOOD[1]).encode(),  # 5
             '{"text": "caf\u00e9"}'.encode("latin-1"),  # 6: not UTF-8
             b'{"text": 3}',  # 7: rejected by the check
             b"   ",  # 8: blank
             b'{"tex',  # 9
             json.dumps(GOOD[2], ensure_ascii=False).encode() + b"\r"]  # 10: a Windows line end is fine
    path.write_bytes(b"\n".join(lines) + b"\n")
    return path


def test_bad_lines_are_counted_and_skipped_with_line_numbers(tmp_path, capsys):
    path = _mixed_file(tmp_path / "mixed.jsonl")
    assert read_jsonl(path, _check_text) == GOOD
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith(f"{path}: skipped 5 lines: ")
    assert f"2 {MALFORMED_JSON} (line 2, 9)" in err and f"1 {NOT_AN_OBJECT} (line 4)" in err
    assert f"1 {NOT_UTF8} (line 6)" in err and "1 no text string (line 7)" in err
    # Streaming gives the same records with their line numbers, and every skip as the read reaches it.
    skipped = SkippedLines()
    assert list(iter_jsonl(path, _check_text, skipped.add)) == [(1, GOOD[0]), (5, GOOD[1]), (10, GOOD[2])]
    assert skipped.count == 5 and skipped.numbers() == [2, 4, 6, 7, 9]
    assert skipped.by_reason == {MALFORMED_JSON: [2, 9], NOT_AN_OBJECT: [4], NOT_UTF8: [6], "no text string": [7]}
    # Without a check every JSON object is usable.
    assert [n for n, _ in parse_lines(path.read_bytes().split(b"\n"))] == [1, 5, 7, 10]


def test_a_summary_quotes_the_first_line_numbers_of_each_reason(tmp_path, capsys):
    path = tmp_path / "many.jsonl"
    path.write_text("\n".join(["{}"] + ["oops"] * 7) + "\n")
    read_jsonl(path)
    assert f"7 {MALFORMED_JSON} (line 2, 3, 4, 5, 6, ...)" in capsys.readouterr().err


def test_missing_file_and_no_usable_record_are_errors(tmp_path, capsys):
    with pytest.raises(RankgenError, match="missing.jsonl: no such file"):
        read_jsonl(tmp_path / "missing.jsonl")
    with pytest.raises(RankgenError, match="no such file"):
        iter_jsonl(tmp_path / "missing.jsonl")  # at the call, before the first record is asked for
    (tmp_path / "folder.jsonl").mkdir()
    with pytest.raises(RankgenError, match="folder.jsonl: no such file"):
        read_jsonl(tmp_path / "folder.jsonl")
    empty = tmp_path / "empty.jsonl"
    empty.write_text("\n\n")
    with pytest.raises(RankgenError, match=r"empty.jsonl: no usable records \(the file is empty\)"):
        read_jsonl(empty)
    useless = tmp_path / "useless.jsonl"
    useless.write_text('{"text": 1}\n[]\n')
    with pytest.raises(RankgenError, match=r"useless.jsonl: no usable records \(1 no text string \(line 1\); "
                                           r"1 not a JSON object \(line 2\)\)"):
        read_jsonl(useless, _check_text)
    assert "useless.jsonl: skipped 2 lines" in capsys.readouterr().err


def test_gzip_files_are_read_and_a_corrupt_stream_is_an_error(tmp_path):
    plain = _mixed_file(tmp_path / "mixed.jsonl")
    packed = tmp_path / "mixed.jsonl.gz"
    packed.write_bytes(gzip.compress(plain.read_bytes()))
    assert list(iter_jsonl(packed, _check_text)) == list(iter_jsonl(plain, _check_text))
    broken = tmp_path / "broken.jsonl.gz"
    broken.write_bytes(gzip.compress(plain.read_bytes())[:-12])  # the stream cut before its end
    with pytest.raises(RankgenError, match="broken.jsonl.gz: cannot read the file"):
        read_jsonl(broken)
    not_gzip = tmp_path / "plain.jsonl.gz"
    not_gzip.write_bytes(plain.read_bytes())
    with pytest.raises(RankgenError, match="plain.jsonl.gz: cannot read the file"):
        read_jsonl(not_gzip)


def test_write_then_read_round_trips_and_leaves_no_side_file(tmp_path):
    path = write_jsonl(tmp_path / "new" / "out.jsonl", iter(GOOD))
    assert path == tmp_path / "new" / "out.jsonl" and read_jsonl(path) == GOOD
    assert path.read_text(encoding="utf-8").splitlines()[2] == json.dumps(GOOD[2])
    assert sorted(p.name for p in path.parent.iterdir()) == ["out.jsonl"]

"""Reading documents from folders, text and JSON-lines files (plain and gzip), with bad input skipped and counted."""

import collections
import gzip
import json
import re
from pathlib import Path

import pytest

from rankgen_jax.data.documents import Document, ReadStats, read_documents, require_documents
from rankgen_jax.errors import RankgenError

CORPUS = Path(__file__).resolve().parents[1] / "data" / "corpus"


def write(path: Path, data: bytes | str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    if isinstance(data, str):
        data = data.encode("utf-8")
    if path.name.endswith(".gz"):
        data = gzip.compress(data)
    path.write_bytes(data)
    return path


def jsonl(*records) -> str:
    return "".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in records)


def test_bundled_corpus():
    stats = ReadStats()
    documents = list(read_documents(CORPUS, stats))
    # README.md sits in the folder and is not a document.
    ids = [d.id for d in documents]
    assert ids[:7] == [
        "austen/emma.txt",
        "austen/mansfieldpark.txt",
        "austen/northangerabbey.txt",
        "austen/persuasion.txt",
        "austen/prideprejudice.txt",
        "austen/sensesensibility.txt",
        "botchan/botchan.txt",
    ]
    # Sorted by id, one document per file, in the folders of each kind (data/corpus/README.md lists them).
    assert ids == sorted(ids) and ids[7] == "novels/moby_dick.txt"
    assert collections.Counter(i.split("/")[0] for i in ids) == {"austen": 6, "botchan": 1, "novels": 1, "plays": 18, "scripture": 21, "speeches": 121}
    assert stats.summary() == "read 168 documents from 168 files"
    botchan = documents[6].text
    # The byte-order mark is dropped and CRLF line ends become "\n".
    assert botchan.startswith("Project Gutenberg's Botchan") and "\r" not in botchan
    assert documents[0].text.startswith("EMMA\n\nBy Jane Austen")


def test_txt_and_gz_in_a_folder_sorted_and_recursive(tmp_path):
    write(tmp_path / "b.txt", "Second book.\r\nLine two.\r\n")
    write(tmp_path / "a" / "z.txt.gz", "First book, gzipped.")
    write(tmp_path / "c.md", "Not a document.")
    write(tmp_path / ".hidden" / "x.txt", "Hidden.")
    write(tmp_path / ".y.txt", "Hidden too.")
    documents = list(read_documents(tmp_path))
    assert documents == [
        Document("a/z.txt.gz", "First book, gzipped."),
        Document("b.txt", "Second book.\nLine two.\n"),
    ]


def test_jsonl_and_jsonl_gz(tmp_path):
    write(tmp_path / "a.jsonl", jsonl({"id": "one", "text": "Text one."}, "", {"text": "No id here."}, {"id": 7, "text": "Int id."}))
    write(tmp_path / "b.jsonl.gz", jsonl({"id": "gz", "text": "From gzip."}))
    stats = ReadStats()
    documents = list(read_documents(tmp_path, stats))
    assert documents == [
        Document("one", "Text one."),
        Document("a.jsonl:3", "No id here."),  # blank line 2 is skipped silently, line numbers still count it
        Document("7", "Int id."),
        Document("gz", "From gzip."),
    ]
    assert stats.summary() == "read 4 documents from 2 files"


def test_json_array_file(tmp_path):
    write(tmp_path / "docs.json", json.dumps([{"id": "x", "text": "A."}, {"text": "B."}, {"id": "z"}]))
    stats = ReadStats()
    documents = list(read_documents(tmp_path / "docs.json", stats))
    assert documents == [Document("x", "A."), Document("docs.json:2", "B.")]
    assert stats.skipped == {"record with missing or empty text": 1}


def test_list_of_sources_and_direct_files(tmp_path):
    a = write(tmp_path / "one" / "a.txt", "Alpha.")
    write(tmp_path / "two" / "b.txt", "Beta.")
    notes = write(tmp_path / "notes.md", "Named directly, so read as text.")
    documents = list(read_documents([tmp_path / "two", str(a), notes]))
    assert [(d.id, d.text) for d in documents] == [
        ("b.txt", "Beta."),
        ("a.txt", "Alpha."),
        ("notes.md", "Named directly, so read as text."),
    ]


def test_every_bad_input_is_skipped_and_counted(tmp_path):
    write(tmp_path / "01_empty.txt", b"")
    write(tmp_path / "02_blank.txt", "  \n\n\t\n")
    write(tmp_path / "03_binary.txt", b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR")
    write(tmp_path / "04_latin1.txt", "caf\u00e9 cr\u00e8me".encode("latin-1"))
    (tmp_path / "05_corrupt.txt.gz").write_bytes(b"this is not gzip data")
    write(tmp_path / "06_good.txt", "A good document.")
    write(
        tmp_path / "07_records.jsonl",
        jsonl(
            {"id": "ok", "text": "Fine."},
            "{not json",
            {"id": "no-text"},
            {"id": "empty", "text": "   "},
            {"id": "number", "text": 42},
            '["a list"]',
            "{\"text\": \"truncated",
        ),
    )
    write(tmp_path / "08_more.jsonl.gz", jsonl("nope", {"text": "Also fine."}))
    (tmp_path / "09_bytes.jsonl").write_bytes(b'{"text": "caf\xe9"}\n')
    stats = ReadStats()
    documents = list(read_documents(tmp_path, stats))
    assert [d.text for d in documents] == ["A good document.", "Fine.", "Also fine."]
    assert stats.files == 9 and stats.documents == 3
    assert stats.skipped == {
        "empty file": 2,
        "binary or non-UTF-8 file": 2,
        "unreadable file": 1,
        "malformed JSON line": 4,
        "record with missing or empty text": 4,
    }
    assert stats.total_skipped == 13
    assert stats.summary() == (
        f"read 3 documents from 9 files; skipped: 2 empty files (first: {tmp_path / '01_empty.txt'}), "
        f"2 binary or non-UTF-8 files (first: {tmp_path / '03_binary.txt'}), "
        f"1 unreadable file ({tmp_path / '05_corrupt.txt.gz'}), "
        f"4 malformed JSON lines (first: {tmp_path / '07_records.jsonl'}:2), "
        f"4 records with missing or empty text (first: {tmp_path / '07_records.jsonl'}:3)"
    )


def test_binary_jsonl_file(tmp_path):
    write(tmp_path / "data.jsonl", b'{"text": "x"}\n\x00\x01\x02')
    stats = ReadStats()
    assert list(read_documents(tmp_path, stats)) == []
    assert stats.summary() == f"read 0 documents from 1 file; skipped: 1 binary or non-UTF-8 file ({tmp_path / 'data.jsonl'})"


def test_missing_path_is_a_clear_error(tmp_path):
    missing = tmp_path / "nowhere" / "books"
    with pytest.raises(RankgenError, match=re.escape(f"no such file or folder: {missing}")):
        list(read_documents(missing))
    write(tmp_path / "a.txt", "Here.")
    with pytest.raises(RankgenError, match="nowhere"):
        list(read_documents([tmp_path / "a.txt", missing]))


def test_require_documents_empty_folder(tmp_path):
    with pytest.raises(RankgenError) as error:
        require_documents(tmp_path)
    assert str(error.value) == f"no usable document in {tmp_path} (read 0 documents from 0 files)"


def test_require_documents_only_bad_input(tmp_path):
    write(tmp_path / "x.jsonl", jsonl("{broken"))
    with pytest.raises(RankgenError) as error:
        require_documents([tmp_path])
    assert str(error.value) == (
        f"no usable document in {tmp_path} (read 0 documents from 1 file; "
        f"skipped: 1 malformed JSON line ({tmp_path / 'x.jsonl'}:1))"
    )


def test_require_documents_min_words(tmp_path):
    write(tmp_path / "short.txt", "Too short.")
    write(tmp_path / "long.txt", "word " * 50)
    documents, stats = require_documents(tmp_path, min_words=20)
    assert [d.id for d in documents] == ["long.txt"]
    assert stats.skipped == {"document below the word minimum": 1}
    assert "1 document below the word minimum (short.txt)" in stats.summary()
    with pytest.raises(RankgenError, match="no usable document"):
        require_documents(tmp_path, min_words=100)

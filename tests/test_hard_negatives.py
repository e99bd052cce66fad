"""suffix-negatives (RankGen App. C.1): items cut at sentence boundaries, negatives against a brute-force scoring of
every span of the document by the model."""

import json

import numpy as np
import pytest

from rankgen_jax.cli.main import run_command
from rankgen_jax.data.documents import Document
from rankgen_jax.errors import RankgenError
from rankgen_jax.eval.hard_negatives import HardNegativeConfig, mine_document
from rankgen_jax.testing import BOTCHAN, build_tiny_rankgen

SMALL = HardNegativeConfig(prefix_words=60, continuation_words=30, span_words=30, min_words=5, negatives=4)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory, spiece_model):
    return build_tiny_rankgen(tmp_path_factory.mktemp("tiny_rankgen") / "ckpt", spiece_model, seed=5)


@pytest.fixture(scope="module")
def model(model_dir):
    from rankgen_jax.inference.encoder import load_model

    return load_model(model_dir)


def _documents() -> list[Document]:
    words = BOTCHAN.read_text(encoding="utf-8").split()
    return [Document("botchan/a", " ".join(words[2000:2400])), Document("botchan/b", " ".join(words[9000:9300]))]


def _brute_force_spans(sentences: list[str], span_words: int, min_words: int) -> list[tuple[int, int]]:
    """Every start sentence's longest run of at most span_words words (at least min_words), by plain counting."""
    spans = []
    for start in range(len(sentences)):
        end, words = start, 0
        while end < len(sentences) and words + len(sentences[end].split()) <= span_words:
            words += len(sentences[end].split())
            end += 1
        if words >= min_words:
            spans.append((start, end))
    return spans


def test_negatives_are_the_best_scoring_spans_of_the_document(model):
    from rankgen_jax.data.sentences import split_sentences

    for doc in _documents():
        records = mine_document(model, doc, SMALL, batch_size=16)
        assert len(records) >= 3, doc.id
        sentences = split_sentences(doc.text)
        spans = _brute_force_spans(sentences, SMALL.span_words, SMALL.min_words)
        texts = [" ".join(sentences[a:b]) for a, b in spans]
        for record in records:
            (pa, pb), (ga, gb) = record["prefix_span"], record["continuation_span"]
            assert record["prefix"] == " ".join(sentences[pa:pb]) and pb == ga
            assert record["candidates"][0] == " ".join(sentences[ga:gb]) and record["label"] == 0
            assert 30 <= len(record["prefix"].split()) <= 60 and 5 <= len(record["candidates"][0].split()) <= 30
            # Brute force: the model scores the prefix against every span, one list through its public score.
            scores = model.score([record["prefix"]], [texts])[0]
            allowed = [k for k, (a, b) in enumerate(spans) if b <= pa or a >= gb]
            best = sorted(allowed, key=lambda k: (-scores[k], k))[: SMALL.negatives]
            assert record["negative_spans"] == [list(spans[k]) for k in best]
            assert record["candidates"][1:] == [texts[k] for k in best]
            np.testing.assert_allclose(record["negative_scores"], [scores[k] for k in best], atol=1e-4)
            assert record["candidates"][0] not in record["candidates"][1:]
            gold = model.score([record["prefix"]], [[record["candidates"][0]]])[0][0]
            assert record["gold_score"] == pytest.approx(float(gold), abs=1e-4)


def test_items_per_document_and_bad_settings(model):
    doc = _documents()[0]
    every = mine_document(model, doc, SMALL)
    two = mine_document(model, doc, HardNegativeConfig(**{**SMALL.__dict__, "items_per_document": 2}))
    # The same items as among all of them (scores differ only by float noise of other batches).
    key = lambda r: (r["prefix_span"], r["continuation_span"], r["negative_spans"])  # noqa: E731
    assert len(two) == 2 and {json.dumps(key(r)) for r in two} <= {json.dumps(key(r)) for r in every}
    assert mine_document(model, Document("short", "Too short. Far too short."), SMALL) == []
    with pytest.raises(RankgenError, match="negatives"):
        HardNegativeConfig(negatives=0)
    with pytest.raises(RankgenError, match="min_words"):
        HardNegativeConfig(span_words=8, min_words=10)


def test_cli_writes_items_that_score_reads(model_dir, tmp_path, capsys):
    folder = tmp_path / "docs"
    folder.mkdir()
    for doc in _documents():
        (folder / (doc.id.split("/")[1] + ".txt")).write_text(doc.text, encoding="utf-8")
    (folder / "tiny.txt").write_text("One sentence only.", encoding="utf-8")
    out = tmp_path / "items.jsonl"
    stats = run_command(["suffix-negatives", "--model", model_dir, "--documents", str(folder), "--out", str(out),
                         "--prefix_words", "60", "--continuation_words", "30", "--span_words", "30", "--min_words", "5",
                         "--negatives", "4", "--no_progress"])
    assert stats["documents"] == 3 and stats["documents_without_item"] == 1 and stats["items"] >= 6
    items = [json.loads(line) for line in out.read_text(encoding="utf-8").splitlines()]
    assert len(items) == stats["items"] and all(len(i["candidates"]) == 5 for i in items)
    capsys.readouterr()
    result = run_command(["score", "--model", model_dir, "--input", str(out), "--no_progress"])
    # Mined against this very model, so it ranks a negative above the gold wherever the gold is not its best.
    want = np.mean([float(i["gold_score"] > max(i["negative_scores"])) for i in items])
    assert result["n"] == len(items) and result["accuracy"] == pytest.approx(want, abs=1e-6)
    with pytest.raises(RankgenError, match="long enough"):
        run_command(["suffix-negatives", "--model", model_dir, "--documents", str(folder / "tiny.txt"),
                     "--out", str(tmp_path / "none.jsonl"), "--no_progress"])

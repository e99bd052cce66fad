"""The ready configurations for the common jobs, run as their docs show: import MiniLM, mine BM25 negatives of a
BEIR folder's training queries, train with the shipped gin file, export; only the sizes are made small here."""

from __future__ import annotations

import json

import numpy as np
import pytest

from rankgen_jax.checkpoints import native
from rankgen_jax.cli.main import main
from rankgen_jax.data.beir_books import BooksCollectionConfig, build_books_collection
from rankgen_jax.experiments.retrieval_example import bundled_books

# The shipped settings stay; these only make the run small (steps, batch, lengths).
SMALL = ["--gin.TrainerConfig.num_steps=2", "--gin.OptimizerConfig.warmup_steps=1",
         "--gin.TrainerConfig.checkpoint_every=2", "--gin.TrainerConfig.async_checkpoints=False",
         "--gin.DataConfig.batch_size=8", "--gin.DataConfig.prefix_length=32", "--gin.RetrievalData.continuation_length=64"]


@pytest.fixture(scope="module")
def mined(tmp_path_factory):
    """(MiniLM checkpoint, Tevatron file of BM25-mined training queries), made with the commands the docs give."""
    root = tmp_path_factory.mktemp("ready")
    beir = root / "beir"
    build_books_collection(bundled_books(), beir, BooksCollectionConfig(passages_per_book=12, prefix_words=48,
                                                                        max_continuation_words=40))
    assert main(["import", "--from", "hf", "--path", "minilm", "--out", str(root / "ckpt" / "minilm")]) == 0
    assert main(["mine-negatives", "--bm25", "--corpus", str(beir), "--queries", str(beir), "--negatives", "8",
                 "--depth", "2-30", "--output", str(root / "mined" / "train.jsonl"), "--no_progress"]) == 0
    return root, root / "ckpt" / "minilm", root / "mined" / "train.jsonl"


def _train(workdir, gin_file, checkpoint, train_file, capsys, *extra):
    code = main(["train", f"--gin_file={gin_file}", f"--workdir={workdir}",
                 f"--gin.TrainerConfig.init_checkpoint='{checkpoint}'", f"--gin.RetrievalData.train_file='{train_file}'",
                 *SMALL, *extra])
    assert code == 0, capsys.readouterr().err


def test_the_mined_file_holds_training_queries_only(mined):
    root, checkpoint, train_file = mined
    assert native.load_provenance(checkpoint)["model_id"] == "sentence-transformers/all-MiniLM-L6-v2"
    train_ids = {line.split("\t")[0] for line in (root / "beir" / "qrels" / "train.tsv").read_text().splitlines()[1:]}
    records = [json.loads(line) for line in train_file.read_text().splitlines()]
    assert records and {r["query_id"] for r in records} <= train_ids
    assert all(r["negative_passages"] for r in records)


def test_minilm_retriever_config(mined, tmp_path, capsys):
    root, checkpoint, train_file = mined
    _train(tmp_path / "run", "retrieval_minilm.gin", checkpoint, train_file, capsys)
    config = native.load_model_config(tmp_path / "run")
    assert config.kind == "dual_encoder" and config.encoder_type == "bert" and config.head.l2_normalize
    conventions = native.load_input_conventions(tmp_path / "run")
    assert (conventions.prefix_marker, conventions.suffix_marker, conventions.prefix_keep) == ("", "", "start")
    assert main(["export-hf", "--checkpoint", str(tmp_path / "run"), "--out", str(tmp_path / "hf")]) == 0
    st = pytest.importorskip("sentence_transformers")
    model = st.SentenceTransformer(str(tmp_path / "hf"), device="cpu")
    vectors = model.encode(["a query", "a passage"])
    np.testing.assert_allclose(np.linalg.norm(vectors, axis=-1), 1.0, atol=1e-5)
    card = (tmp_path / "hf" / "README.md").read_text()
    assert "base_model: sentence-transformers/all-MiniLM-L6-v2" in card and str(tmp_path) not in card


def test_minilm_cross_encoder_config(mined, tmp_path, capsys):
    root, checkpoint, train_file = mined
    _train(tmp_path / "run", "ranker_minilm.gin", checkpoint, train_file, capsys, "--gin.RetrievalData.hard_negatives=3")
    config = native.load_model_config(tmp_path / "run")
    assert config.kind == "cross_encoder" and config.encoder_type == "bert" and config.head.pooling == "pooler"
    assert main(["export-hf", "--checkpoint", str(tmp_path / "run"), "--out", str(tmp_path / "hf")]) == 0
    assert json.loads((tmp_path / "hf" / "config.json").read_text())["architectures"] == \
        ["BertForSequenceClassification"]
    # The tokenizer cuts pairs at the trained length; the card shows how to load the export.
    assert json.loads((tmp_path / "hf" / "tokenizer_config.json").read_text())["model_max_length"] == 32 + 64
    card = (tmp_path / "hf" / "README.md").read_text()
    assert 'CrossEncoder("path/to/this/folder", max_length=96)' in card and "trust_remote_code" not in card
    assert "base_model: sentence-transformers/all-MiniLM-L6-v2" in card
    st = pytest.importorskip("sentence_transformers")
    from rankgen_jax.inference.encoder import load_model

    pairs = [("what did Emma say", "Emma said nothing at all."), ("what did Emma say", "The ship sailed at dawn.")]
    scores = st.CrossEncoder(str(tmp_path / "hf"), device="cpu").predict(pairs)
    ours = load_model(str(tmp_path / "run"), kind="cross_encoder").score_pairs([pairs[0][0]], [[p[1] for p in pairs]])
    np.testing.assert_allclose(scores, ours[0], atol=1e-4)

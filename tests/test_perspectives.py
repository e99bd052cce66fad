"""The multi-perspective demo: passages, labelled pairs, AUC, and a tiny end-to-end run with a random BERT."""

import json
from collections import Counter

import jax
import numpy as np
import pytest

from rankgen_jax.checkpoints import native
from rankgen_jax.cli.main import run_command
from rankgen_jax.models.configs import HeadConfig
from rankgen_jax.data.lists import PairBatches
from rankgen_jax.errors import RankgenError
from rankgen_jax.models.batch_layout import CANDIDATE_LISTS, BatchLayout
from rankgen_jax.models.factory import build_model
from rankgen_jax.experiments.perspective_eval import pair_scores
from rankgen_jax.experiments.perspective_pairs import (
    PERSPECTIVES, Passages, Work, build_passages, load_works, pair_labels, passages_of_text, sample_pairs,
    strip_gutenberg,
)
from rankgen_jax.experiments.perspectives import ROWS, PerspectivesConfig, format_table, initial_params, model_configs
from rankgen_jax.pretrained import resolve_model
from rankgen_jax.data.text import load_text_encoder
from rankgen_jax.inference.encoder import LoadedModel
from rankgen_jax.testing import TINY_MINILM_BERT, build_tiny_minilm

TINY_BERT = TINY_MINILM_BERT


@pytest.fixture(scope="module")
def minilm_tokenizer():
    return resolve_model("minilm") + "/tokenizer.json"


@pytest.fixture(scope="module")
def bundled():
    """The bundled works cut with the demo's settings."""
    cfg = PerspectivesConfig()
    works = load_works(cfg.works_file)
    train, held = build_passages(works, cfg.min_words, cfg.max_words, cfg.eval_fraction)
    return cfg, works, train, held


def _words(n, start=0):
    return [f"w{i}" for i in range(start, start + n)]


def test_gutenberg_markers_and_line_numbers_are_stripped():
    body = "\n".join(" ".join(_words(10, 10 * i)) + ("          10" if i == 3 else "") for i in range(30))
    text = ("Header line of the ebook\n*** START OF THIS PROJECT GUTENBERG EBOOK X ***\n" + body
            + "\n*** END OF THIS PROJECT GUTENBERG EBOOK X ***\nLicense text\n")
    assert strip_gutenberg(text).strip() == body
    assert strip_gutenberg(body) == body
    passages = passages_of_text(text, 20, 40)
    words = " ".join(passages).split()
    # Nothing outside the markers, no line number, and the body's words in order.
    assert words == _words(len(words)) and "10" not in words and "Header" not in words
    assert len(words) == 300


def test_passages_respect_bounds_and_prefer_paragraph_then_sentence_ends():
    # Paragraphs of 3 lines of 8 words: a passage of >= 20 words closes at the first paragraph end.
    paragraph = lambda k: "\n".join(" ".join(_words(8, 24 * k + 8 * j)) for j in range(3))  # noqa: E731
    passages = passages_of_text("\n\n".join(paragraph(k) for k in range(6)), 20, 40)
    assert [len(p.split()) for p in passages] == [24] * 6
    # One long paragraph: the cut goes after the last sentence end that leaves >= min words.
    lines = [" ".join(_words(8, 8 * j)) + ("." if j in (2, 3) else "") for j in range(12)]
    passages = passages_of_text("\n".join(lines), 20, 40)
    assert passages[0].endswith("w31.") and len(passages[0].split()) == 32
    # Short lines ending in a period (speaker tags) are not sentence ends; unwrapped lines are split.
    assert all(20 <= len(p.split()) <= 40 for p in passages_of_text("Ber.\n" + " ".join(_words(500)), 20, 40))
    with pytest.raises(RankgenError, match="min_words < max_words"):
        passages_of_text("x", 50, 50)


def test_bundled_passages_are_bounded_and_splits_share_no_text(bundled):
    cfg, works, train, held = bundled
    assert {w.form for w in works} == {"play", "poem", "novel", "prose"} and len({w.author for w in works}) == 4
    train_texts = {t for texts in train.texts for t in texts}
    held_texts = {t for texts in held.texts for t in texts}
    assert not train_texts & held_texts
    for work, t, e in zip(works, train.texts, held.texts):
        assert t and e, work.work
        assert all(cfg.min_words <= len(p.split()) <= cfg.max_words for p in t + e)
        # The held-out part is the work's last fifth.
        assert abs(len(e) / (len(t) + len(e)) - cfg.eval_fraction) < 0.02, work.work
    assert "*** START" not in " ".join(held.texts[-1] + train.texts[-1])


def test_pair_labels_are_consistent_and_balanced(bundled):
    _, works, train, held = bundled
    by_title = {w.work: w for w in works}
    for part, count in ((train, 900), (held, 600)):
        texts = {t for ts in part.texts for t in ts}
        records = sample_pairs(part, count, np.random.default_rng(5))
        assert len(records) == count
        labels = np.asarray([r["labels"] for r in records])
        for r in records:
            a, b = (by_title[t] for t in r["works"])
            assert tuple(r["labels"]) == pair_labels(a, b)
            assert r["a"] in texts and r["b"] in texts and r["a"] != r["b"]
        same_work = labels[:, 1] == 1
        assert np.all(labels[same_work, 0] == 1) and np.all(labels[same_work, 2] == 1)
        # Every perspective has both classes in reasonable proportion; the patterns come in their shares.
        rates = labels.mean(axis=0)
        assert np.all((rates > 0.2) & (rates < 0.8)), rates
        patterns = Counter(tuple(r["labels"]) for r in records)
        assert patterns[(1.0, 1.0, 1.0)] == count // 3
        assert len(patterns) == 5 and min(patterns.values()) >= count // 6 - 1
        # Each perspective disagrees with the others somewhere, so they are separate tasks.
        assert np.any(labels[:, 0] != labels[:, 2]) and np.any(labels[:, 0] != labels[:, 1])


def test_pairs_without_possible_patterns_fall_back_or_fail(tmp_path):
    one = Passages([Work(tmp_path, "A", "W", "poem")], [["x y", "y z", "z w"]])
    records = sample_pairs(one, 6, np.random.default_rng(0))
    assert all(r["labels"] == [1.0, 1.0, 1.0] for r in records)
    with pytest.raises(RankgenError, match="no passage pairs"):
        sample_pairs(Passages(one.works, [["x y"]]), 4, np.random.default_rng(0))
    with pytest.raises(RankgenError, match="pair shares"):
        sample_pairs(one, 4, np.random.default_rng(0), 0.8, 0.4)


def test_works_file_errors(tmp_path):
    with pytest.raises(RankgenError, match="no such works file"):
        load_works(tmp_path / "none.json")
    bad = tmp_path / "works.json"
    bad.write_text("{not json")
    with pytest.raises(RankgenError, match="not valid JSON"):
        load_works(bad)
    (tmp_path / "a.txt").write_text("text")
    bad.write_text(json.dumps({"a.txt": {"author": "A", "work": "W"}}))
    with pytest.raises(RankgenError, match="needs non-empty strings"):
        load_works(bad)
    bad.write_text(json.dumps({"b.txt": {"author": "A", "work": "W", "form": "poem"}}))
    with pytest.raises(RankgenError, match="is not a file"):
        load_works(bad)


def test_mpts_defaults_last2_avg_cls_linear_and_tau():
    cfg = PerspectivesConfig()
    configs = model_configs(cfg)
    assert configs["bi_encoder"].head == HeadConfig("last2_avg", -1, True) and cfg.tau == 0.5
    # [CLS] -> one linear layer of N outputs: no projection before the logits.
    assert configs["cross_encoder"].head == HeadConfig("first", 0, False)
    from rankgen_jax.train.config import LossConfig

    assert LossConfig().tau == 0.5
    # The earlier heads stay as options.
    old = model_configs(PerspectivesConfig(bi_encoder_pooling="mean", cross_encoder_projection=True))
    assert old["bi_encoder"].head == HeadConfig("mean", -1, True)
    assert old["cross_encoder"].head == HeadConfig("first", -1, False)


def test_format_table_shows_f1_accuracy_auc_and_the_w_avg():
    row = {"per_perspective": {p: {"f1": 0.25, "accuracy": 0.5, "auc": 0.61} for p in PERSPECTIVES},
           "w_avg": {"f1": 0.25}}
    table = format_table({"zero_shot": row})
    assert "zero_shot" in table and "0.610" in table and "0.250" in table
    assert "author F1" in table and "W.Avg F1" in table


@pytest.fixture(scope="module")
def tiny_init(tmp_path_factory):
    return build_tiny_minilm(tmp_path_factory.mktemp("perspectives") / "init")


def test_pair_scores_use_the_training_layout(tiny_init, minilm_tokenizer):
    """Evaluation tokenises and scores pairs exactly as PairBatches feeds them to the trainer."""
    # The end-to-end run's lengths and batch size, so it reuses the compiled scoring functions.
    cfg = PerspectivesConfig(init_checkpoint=str(tiny_init), passage_length=32)
    text = load_text_encoder(minilm_tokenizer)
    records = [{"a": f"the {w} house stood by the river " * 4, "b": f"a {w} boat passed every morning",
                "labels": [1, 0, 1]} for w in ("old", "red", "tall", "small")]
    for name, kind, length in (("bi_encoder", "dual_encoder", 32), ("cross_encoder", "cross_encoder", 64)):
        config, params = initial_params(cfg, tiny_init, name)
        assert config.kind == kind and config.num_scores == 3 and config.encoder == TINY_BERT
        layout = BatchLayout(kind, CANDIDATE_LISTS)  # both perspective losses read candidate lists
        batch = PairBatches(records, text, 4, layout, length).batch(0)
        members, _ = PairBatches(records, text, 4, layout, length).batches.members(0, None)
        # Jitted: eager flax dispatch of a BERT is slower than compiling it.
        apply = jax.jit(lambda ids, types: build_model(config).apply({"params": params}, ids, None, types))
        if kind == "dual_encoder":
            # The encoder is MiniLM's (here the tiny init's), the perspective projections new.
            assert "perspective_projections" in params
            a, b = (np.asarray(apply(batch[k], None)) for k in ("query_ids", "positive_ids"))
            expect = np.sum(a * b, axis=-1)
        else:
            expect = np.asarray(apply(batch["pair_ids"], batch["pair_type_ids"]))
        got = pair_scores(LoadedModel.from_params(config, params, text), members, length, batch_size=8)
        assert got.shape == (4, 3)
        np.testing.assert_allclose(got, expect, atol=1e-5)


def test_tiny_end_to_end_run_and_resume(tmp_path, tiny_init, capsys):
    gin_file = tmp_path / "tiny.gin"
    gin_file.write_text("\n".join([
        f"PerspectivesConfig.init_checkpoint = '{tiny_init}'",
        "PerspectivesConfig.num_train_pairs = 24",
        "PerspectivesConfig.num_eval_pairs = 16",
        "PerspectivesConfig.passage_length = 32",
        "PerspectivesConfig.batch_size = 8",
        "PerspectivesConfig.eval_batch_size = 8",
        "PerspectivesConfig.max_steps = 2",
        "PerspectivesConfig.train_eval_every = 0",
    ]) + "\n")
    argv = ["perspectives", "--gin_file", str(gin_file), "--workdir", str(tmp_path / "run")]
    results = run_command(argv)
    table = results["table"]
    assert list(table) == list(ROWS)
    for name, row in table.items():
        assert row["n"] == 16, name
        for p in PERSPECTIVES:
            assert 0.0 <= row["per_perspective"][p]["auc"] <= 1.0, (name, p)
            assert 0.0 <= row["per_perspective"][p]["f1"] <= 1.0, (name, p)
        assert set(row["w_avg"]) == {"accuracy", "auc", "precision", "recall", "f1"}
    assert all(table["majority"]["per_perspective"][p]["auc"] == 0.5 for p in PERSPECTIVES)
    root = tmp_path / "run"
    for name in ("bi_encoder", "cross_encoder"):
        steps = [json.loads(line)["step"] for line in (root / name / "metrics.jsonl").read_text().splitlines()]
        assert max(steps) == 2 and results["training"][name]["steps"] == 2
        config = native.load_model_config(root / name)
        assert config.num_scores == 3 and config.encoder == TINY_BERT
    assert native.load_model_config(root / "cross_encoder").kind == "cross_encoder"
    saved = json.loads((root / "results.json").read_text())
    assert saved["table"] == json.loads(json.dumps(table)) and saved["data"]["eval_pairs"] == 16
    assert "cross_encoder_step0" in capsys.readouterr().out
    # A second run resumes: no stage runs again and the table is read back.
    again = run_command(argv)
    assert again["table"] == table and set(again["seconds"]) == set(results["seconds"])



def test_demo_gin_file_parses_to_the_defaults():
    import dataclasses

    from rankgen_jax.train.gin_parsing import parse_gin

    defaults = PerspectivesConfig()  # no bindings yet (the autouse fixture clears gin)
    parse_gin(["perspectives_minilm.gin"], [])
    cfg = PerspectivesConfig()
    # The gin file spells out the defaults; its relative works file resolves from the repository.
    assert dataclasses.replace(cfg, works_file="") == dataclasses.replace(defaults, works_file="")
    assert load_works(cfg.works_file) == load_works(defaults.works_file)
    with pytest.raises(RankgenError, match="gin config"):
        parse_gin(["perspectives_minilm.gin"], ["PerspectivesConfig.no_such_field = 1"])

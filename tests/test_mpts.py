"""MPTS files, the bundled splits, the released recipe's settings and a tiny end-to-end run with a random BERT."""

import gzip
import json

import numpy as np
import pytest

from rankgen_jax.checkpoints import native
from rankgen_jax.cli.main import run_command
from rankgen_jax.data.mpts import MPTS_RELEASED_PERSPECTIVES, read_mpts
from rankgen_jax.errors import RankgenError
from rankgen_jax.experiments.mpts import MptsConfig, optimizer_config, steps_per_epoch
from rankgen_jax.resources import MPTS_DIR
from rankgen_jax.testing import build_tiny_minilm

GENRES = ["Action", "Adult", "Adventure", "Animation", "Biography", "Comedy", "Crime", "Documentary", "Drama",
          "Family", "Fantasy", "Game-Show", "History", "Horror", "Music", "Musical", "Mystery", "News", "Reality-TV",
          "Romance", "Sci-Fi", "Short", "Sport", "Talk-Show", "Thriller", "War", "Western"]


def _tsv(rows, columns=("id", "texta", "textb", *GENRES)):
    return "\t".join(columns) + "\n" + "".join("\t".join(map(str, r)) + "\n" for r in rows)


def _row(i, rng, words=("a ship at sea", "a quiet farm", "a murder in town", "two friends laugh")):
    return [f"{i}_{i + 1000}", f" {words[i % 4]} story {i}", f" {words[(i * 3) % 4]} tale {i}",
            *rng.choice([1, 0, -1], size=len(GENRES), p=[0.35, 0.4, 0.25])]


def test_reader_maps_cells_like_the_released_code_and_counts_bad_rows(tmp_path, capsys):
    rows = [["p1", "text one", "text two", *([1, 0, -1] * 9)],
            ["p2", "text three", "text four", *([-1] * 27)],
            ["p3", "only two fields"],  # wrong field count
            ["p4", "", "text", *([1] * 27)],  # empty text
            ["p5", "x", "y", *([2] + [1] * 26)],  # a label outside {1, 0, -1}
            ["p1", "again", "again", *([0] * 27)]]  # repeated id
    path = tmp_path / "pairs.tsv.gz"
    path.write_bytes(gzip.compress(_tsv(rows).encode()))
    pairs = read_mpts(path, ("Action", "Adult", "Adventure"))
    assert [r["id"] for r in pairs.records] == ["p1", "p2"]
    # 1 -> similar, 0 and -1 -> not similar, in the order asked for.
    assert pairs.records[0]["labels"] == [1, 0, 0] and pairs.records[1]["labels"] == [0, 0, 0]
    assert pairs.records[0]["a"] == "text one"
    assert pairs.skipped.count == 4 and set(pairs.skipped.numbers()) == {4, 5, 6, 7}
    assert "skipped 4 rows" in capsys.readouterr().err
    # No perspectives named: every column after textb.
    assert read_mpts(path, quiet=True).perspectives == tuple(GENRES)


def test_reader_errors_name_the_problem(tmp_path):
    with pytest.raises(RankgenError, match="no such file|not found|MPTS file"):
        read_mpts(tmp_path / "missing.tsv")
    bad = tmp_path / "bad.tsv"
    bad.write_text(_tsv([["1", "a", "b", "1"]], ("id", "text", "textb", "Action")))
    with pytest.raises(RankgenError, match="texta"):
        read_mpts(bad)
    ok = tmp_path / "ok.tsv"
    ok.write_text(_tsv([["1", "a", "b", "1"]], ("id", "texta", "textb", "Action")))
    with pytest.raises(RankgenError, match="Drama"):
        read_mpts(ok, ("Drama",))
    empty = tmp_path / "empty.tsv"
    empty.write_text(_tsv([["1", "a", "b", "7"]], ("id", "texta", "textb", "Action")))
    with pytest.raises(RankgenError, match="no usable pairs"):
        read_mpts(empty, quiet=True)


def test_the_bundled_splits_are_the_released_ones():
    dev = read_mpts(MPTS_DIR / "dev.tsv.gz", MPTS_RELEASED_PERSPECTIVES)
    test = read_mpts(MPTS_DIR / "test.tsv.gz", MPTS_RELEASED_PERSPECTIVES)
    assert len(dev.records) == 734 and len(test.records) == 2000 and not dev.skipped.count + test.skipped.count
    # The supports the released code's `stastics()` prints for these files.
    assert dev.positive_counts()["Drama"] == 449 and test.positive_counts()["Drama"] == 1251
    assert sum(test.positive_counts().values()) == 6728
    assert len(read_mpts(MPTS_DIR / "test.tsv.gz", quiet=True).perspectives) == 27


def test_the_recipe_is_the_released_one():
    cfg = MptsConfig()
    assert (cfg.epochs, cfg.batch_size, cfg.learning_rate, cfg.clip_grad_norm, cfg.weight_decay, cfg.tau) == \
        (10, 32, 5e-5, 1.0, 0.01, 0.5)
    assert (cfg.bi_encoder_length, cfg.cross_encoder_length, cfg.seed) == (128, 256, 7)
    assert steps_per_epoch(cfg, 587) == 18
    opt = optimizer_config(cfg, 180)
    assert (opt.name, opt.schedule, opt.warmup_steps, opt.clip_grad_norm, opt.eps) == ("adamw", "linear", 18, 1.0, 1e-6)
    with pytest.raises(RankgenError, match="single_perspective"):
        MptsConfig(single_perspective=("Western",))
    with pytest.raises(RankgenError, match="select_fraction"):
        MptsConfig(select_fraction=0.0)


@pytest.fixture(scope="module")
def tiny_init(tmp_path_factory):
    return build_tiny_minilm(tmp_path_factory.mktemp("mpts") / "init")


def test_tiny_end_to_end_run_scores_all_twelve_perspectives(tmp_path, tiny_init, capsys):
    rng = np.random.default_rng(0)
    (tmp_path / "train.tsv").write_text(_tsv([_row(i, rng) for i in range(40)]))
    (tmp_path / "test.tsv").write_text(_tsv([_row(100 + i, rng) for i in range(16)]))
    gin_file = tmp_path / "tiny.gin"
    gin_file.write_text("\n".join([
        "include 'mpts_minilm.gin'",
        f"MptsConfig.init_checkpoint = '{tiny_init}'",
        f"MptsConfig.train_file = '{tmp_path / 'train.tsv'}'",
        f"MptsConfig.test_file = '{tmp_path / 'test.tsv'}'",
        "MptsConfig.single_perspective = ('Drama',)",
        "MptsConfig.epochs = 2",
        "MptsConfig.batch_size = 8",
        "MptsConfig.eval_batch_size = 8",
        "MptsConfig.bi_encoder_length = 32",
        "MptsConfig.cross_encoder_length = 64",
        "MptsConfig.bootstrap_resamples = 50",
    ]) + "\n")
    argv = ["mpts", "--gin_file", str(gin_file), "--workdir", str(tmp_path / "run")]
    results = run_command(argv)
    root = tmp_path / "run"
    assert results["data"]["pairs"] == {"train": 32, "select": 8, "test": 16}
    for row in ("majority", "all_similar", "zero_shot", "bi_encoder", "cross_encoder"):
        assert list(results["table"][row]["per_perspective"]) == list(MPTS_RELEASED_PERSPECTIVES), row
        predictions = [json.loads(line) for line in (root / "predictions" / f"{row}.jsonl").read_text().splitlines()]
        assert len(predictions) == 16 and set(predictions[0]) == {"id", *MPTS_RELEASED_PERSPECTIVES}
        assert set(predictions[0]["Drama"]) == {"label", "probability", "prediction"}
        summary = results["summary"]["rows"][row]
        assert summary["f1"] == pytest.approx(results["table"][row]["w_avg"]["f1"], abs=1e-9)
        assert summary["f1_se"] >= 0.0
    for row in ("bi_encoder", "cross_encoder", "single_Drama"):
        chosen = results["selection"][row]
        assert len(chosen["select_w_avg_f1"]) == 2 and chosen["step"] == 4 * chosen["epoch"]
        assert chosen["select_w_avg_f1"][chosen["epoch"] - 1] == max(chosen["select_w_avg_f1"])
        assert results["training"][row]["steps"] == 8
    assert native.load_model_config(root / "bi_encoder").num_scores == 12
    assert native.load_model_config(root / "single_Drama").num_scores == 1
    assert "Drama" in results["summary"]["single_perspective"]
    # Every pair similar: the positive-class F1's floor, 2r / (1 + r) per perspective.
    drama = results["table"]["all_similar"]["per_perspective"]["Drama"]
    rate = drama["support"] / 16
    assert drama["f1"] == pytest.approx(2 * rate / (1 + rate))
    assert "W.Avg F1" in capsys.readouterr().out
    # A rerun resumes: nothing trains again and the summary is the same.
    again = run_command(argv)
    assert again["summary"] == json.loads(json.dumps(results["summary"]))
    assert again["training"] == results["training"]

"""The main job end to end on a tiny random T5: evals before and after, plot, export, results; and the
export reads text as training did (input conventions travel with the model)."""

import contextlib
import io
import json

import numpy as np
import pytest

from rankgen_jax.checkpoints import native
from rankgen_jax.cli.main import main
from rankgen_jax.data.conventions import InputConventions
from rankgen_jax.experiments.demo_folder import DemoFolder

# Prefixes of about 48 words, cut to 24 tokens keeping their END: most prefixes are over-long, so which end
# is kept changes the scores.
PREFIX_TOKENS = 24
JOB = ["train", "--job", "--gin_file=models/t5_1_1_tiny.gin",
       "--gin.t5_config.vocab_size=8064", "--gin.DataConfig.source=@ExamplesData()",
       "--gin.DataConfig.batch_size=8", f"--gin.DataConfig.prefix_length={PREFIX_TOKENS}",
       "--gin.ExamplesData.prefix_keep='end'",
       "--gin.ExamplesData.continuation_length=32", "--gin.ExamplesData.prefix_words=48",
       "--gin.ExamplesData.max_continuation_words=24", "--gin.ExamplesData.holdout_documents=2",
       "--gin.TrainerConfig.num_steps=3", "--gin.TrainerConfig.log_every=1",
       "--gin.TrainerConfig.eval_every=3", "--gin.OptimizerConfig.name='adamw'",
       "--gin.OptimizerConfig.learning_rate=1e-3", "--gin.JobConfig.suffix_eval_examples=12",
       "--gin.JobConfig.suffix_eval_negatives=4"]


@pytest.fixture(scope="module")
def job(tmp_path_factory):
    root = tmp_path_factory.mktemp("job")
    stdout = io.StringIO()
    with contextlib.redirect_stdout(stdout):
        code = main(JOB[:2] + [f"--workdir={root}"] + JOB[2:])
    return root, code, stdout.getvalue()


def test_job_runs_end_to_end(job):
    root, code, out = job
    assert code == 0
    assert "held-out suffix identification" in out
    results = json.loads((root / "results.json").read_text())
    for name in ("unigram", "token_overlap", "fine_tuned"):
        assert results[name]["n"] == 12
        assert 0.0 <= results[name]["accuracy_2way"] <= 1.0 and 0.0 <= results[name]["mrr_5way"] <= 1.0
        assert 0.0 <= results[name]["accuracy_pairwise"] <= 1.0
    assert "zero_shot" not in results  # random init: nothing to compare before training
    assert (root / "train" / "demo_results.png").stat().st_size > 10_000
    assert (root / "hf" / "modeling_rankgen.py").is_file()


def _scores(path):
    return [np.asarray(json.loads(line)["scores"]) for line in path.read_text().splitlines()]


def test_the_export_scores_as_the_training_run_evaluated(job, capsys):
    """`score` on the HF export, with no flags, gives the scores of the job's own held-out evaluation."""
    root, _, _ = job
    trained = InputConventions(prefix_length=PREFIX_TOKENS, suffix_length=32, prefix_keep="end", truncation="clean")
    assert native.load_input_conventions(root / "train") == trained
    assert InputConventions.from_json((root / "hf" / "input_conventions.json").read_text(), "export") == trained
    items = DemoFolder(root).items
    evaluated = _scores(DemoFolder(root).scores("fine_tuned"))
    assert len(evaluated) == 12
    # The items have prefixes longer than the limit, so the kept end matters.
    out = root / "scored.jsonl"
    assert main(["score", "--model", str(root / "hf"), "--input", str(items), "--output", str(out),
                 "--no_progress"]) == 0
    err = capsys.readouterr().err
    assert "input conventions: markers 'pre ' / 'suffi '; prefix 24 tokens keeping the end" in err
    assert "recorded in" in err
    for got, want in zip(_scores(out), evaluated):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    # The scores the released conventions (first 512 tokens) or the other end of the prefix give are others.
    for flags in (["--prefix_keep", "start"], ["--prefix_length", "512", "--truncation", "released",
                                               "--prefix_keep", "start"]):
        other = root / "other.jsonl"
        assert main(["score", "--model", str(root / "hf"), "--input", str(items), "--output", str(other),
                     "--no_progress", *flags]) == 0
        assert "given: " in capsys.readouterr().err
        assert max(np.abs(a - b).max() for a, b in zip(_scores(other), evaluated)) > 1e-3
    # An import of the export keeps the record, and `encode` / RankGenEncoder read with it.
    assert main(["import", "--from", "hf", "--path", str(root / "hf"), "--out", str(root / "reimported")]) == 0
    assert native.load_input_conventions(root / "reimported") == trained
    prefixes = [json.loads(line)["prefix"] for line in items.read_text().splitlines()]
    (root / "prefixes.txt").write_text("\n".join(prefixes) + "\n")
    assert main(["encode", "--model", str(root / "reimported"), "--input", str(root / "prefixes.txt"),
                 "--side", "prefix", "--output", str(root / "prefixes.npy")]) == 0
    assert "keeping the end" in capsys.readouterr().err
    from rankgen_jax.inference.api import RankGenEncoder

    encoder = RankGenEncoder(root / "hf")
    assert encoder.conventions == trained and encoder.truncation == "clean"
    assert sum(len(i) > PREFIX_TOKENS for i in encoder.model.tokenize(prefixes, "prefix")) >= 10
    ids = encoder.input_ids(prefixes, "prefix")
    assert max(len(i) for i in ids) == PREFIX_TOKENS and all(i[-1] == 1 for i in ids)
    np.testing.assert_allclose(np.load(root / "prefixes.npy"), encoder.encode(prefixes, "prefix"), atol=1e-5)


def test_the_export_carries_a_model_card_of_the_run(job):
    """README.md with hub metadata (read by huggingface_hub), the conventions, the run's gin config and results."""
    hub = pytest.importorskip("huggingface_hub")
    root, _, _ = job
    card = hub.ModelCard.load(root / "hf" / "README.md")
    meta = card.data.to_dict()
    assert meta["library_name"] == "transformers" and meta["pipeline_tag"] == "feature-extraction"
    assert "license" not in meta and "base_model" not in meta  # random init: nothing it derives from
    assert {"rankgen-jax", "t5", "dual-encoder"} <= set(meta["tags"])
    text = card.text
    assert "2 layers, d_model 128" in text and "the first token's hidden state" in text
    assert "| maximum length (tokens) | 24 | 32 |" in text and "| an over-long text keeps its | end | start |" in text
    assert "ExamplesData.prefix_keep = 'end'" in text and "DataConfig.source = @ExamplesData()" in text
    assert "`TrainerConfig.num_steps = 3`" in text and "this export is step 3" in text
    # Every one-line operative binding is quoted as it ran (the source's class holds only what it reads); paths of
    # this machine are not.
    operative = (root / "train" / "operative_config.gin").read_text()
    quoted = 0
    for line in operative.splitlines():
        if " = " not in line or line.startswith((" ", "#")) or "'/" in line or line.rstrip().endswith(("\\", "[", "{", "(")):
            continue
        assert line in text, line
        quoted += 1
    assert quoted >= 20 and str(root) not in text
    results = json.loads((root / "results.json").read_text())
    lines = text.splitlines()
    row = next(line for line in lines if line.startswith("| fine_tuned |"))
    header = next(line for line in lines if line.startswith("| model | "))
    columns = [cell.strip() for cell in header.strip("|").split("|")][1:]
    assert columns[0] == "n" and {"accuracy_2way", "accuracy_5way", "mrr_5way"} <= set(columns)
    fine_tuned = results["fine_tuned"]
    assert row == "| fine_tuned | " + " | ".join(
        f"{fine_tuned[k]:.4g}" if isinstance(fine_tuned[k], float) else str(fine_tuned[k]) for k in columns) + " |"


HELD_OUT = ["'plays/othello.txt'", "'speeches/2017_donald_j_trump.txt'", "'speeches/2021_joseph_r_biden.txt'"]


@pytest.fixture(scope="module")
def job_from_start(job, tmp_path_factory):
    """The job again, started from the first job's model: the starting model is read at two prefix lengths
    and compared per genre (plays, speeches) with the fine-tuned one; every step is kept (for demo-curve)."""
    first, _, _ = job
    root = tmp_path_factory.mktemp("job_from_start")
    stdout = io.StringIO()
    args = [a for a in JOB[2:] if "holdout_documents" not in a and "suffix_eval_examples" not in a]
    with contextlib.redirect_stdout(stdout):
        code = main(JOB[:2] + [f"--workdir={root}"] + args + [
            f"--gin.TrainerConfig.init_checkpoint='{first / 'train'}'", "--gin.JobConfig.export=False",
            "--gin.JobConfig.plot=False", "--gin.JobConfig.suffix_eval_examples=6",
            "--gin.TrainerConfig.checkpoint_every=1", "--gin.TrainerConfig.keep_checkpoints=5",
            f"--gin.ExamplesData.holdout_ids=[{', '.join(HELD_OUT)}]",
            f"--gin.JobConfig.zero_shot_prefix_lengths=(12, {PREFIX_TOKENS})"])
    return root, code, stdout.getvalue()


def _wins(path, candidates):
    """Per item, 1 where the gold (candidate 0) scores strictly highest among the first `candidates`."""
    return np.array([np.argmax(s[:candidates]) == 0 for s in _scores(path)], float)


def test_job_compares_per_genre_with_the_best_prefix_length(job_from_start):
    root, code, out = job_from_start
    assert code == 0
    results = json.loads((root / "results.json").read_text())
    report = results["by_genre"]
    assert {k: v["n"] for k, v in report.items()} == {"plays": 6, "speeches": 6}
    items = [json.loads(line) for line in DemoFolder(root).items.read_text().splitlines()]
    genres = np.array([it["genre"] for it in items])
    assert {it["doc_id"] for it in items} <= {h.strip("'") for h in HELD_OUT}
    # The starting model at the training length is the job's zero-shot reading.
    for got, want in zip(_scores(DemoFolder(root).scores(f"zero_shot_{PREFIX_TOKENS}")),
                         _scores(DemoFolder(root).scores("zero_shot"))):
        np.testing.assert_array_equal(got, want)
    # Recomputed from the score files: accuracies per length, the best, the fine-tuned one.
    for name, candidates in (("vs 1", 2), ("vs 4", 5)):
        tuned = _wins(DemoFolder(root).scores("fine_tuned"), candidates)
        base = {length: _wins(DemoFolder(root).scores(f"zero_shot_{length}"), candidates)
                for length in (12, PREFIX_TOKENS)}
        for genre in ("plays", "speeches"):
            row = report[genre][name]
            rows = genres == genre
            for length, wins in base.items():
                assert row["zero_shot"][str(length)]["accuracy"] == pytest.approx(wins[rows].mean())
            assert row["best_zero_shot"]["accuracy"] == pytest.approx(max(w[rows].mean() for w in base.values()))
            assert row["fine_tuned"]["accuracy"] == pytest.approx(tuned[rows].mean())
            assert row["gain"] == pytest.approx(tuned[rows].mean() - base[row["best_length"]][rows].mean())
    table = DemoFolder(root).comparison_table.read_text()
    assert table == results["by_genre_table"] and table.count("\n") == 2 + 2 * 2
    assert f"| best zero-shot | fine-tuned @{PREFIX_TOKENS} |" in table and "| speeches | 6 | vs 4 |" in table
    assert "per genre: fine-tuned against the starting model's best prefix length" in out


def test_demo_curve_compares_every_saved_step(job_from_start, capsys):
    root, _, _ = job_from_start
    assert main(["demo-curve", f"--workdir={root}"]) == 0
    assert "scoring 12 items with step 1" in capsys.readouterr().err
    curve = json.loads((root / "curve" / "curve.json").read_text())
    points = curve["points"]
    assert [p["step"] for p in points] == [1, 2, 3]
    # Minutes are what the trainer logged: positive and growing with the step.
    minutes = [p["minutes"] for p in points]
    assert all(m > 0 for m in minutes) and minutes == sorted(minutes)
    # The last step is the job's fine-tuned model: the same scores and per-genre report as the job's own evaluation.
    for got, want in zip(_scores(root / "curve" / "scores_step3.jsonl"), _scores(DemoFolder(root).scores("fine_tuned"))):
        np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)
    results = json.loads((root / "results.json").read_text())
    for genre, entry in results["by_genre"].items():
        for name in ("vs 1", "vs 4"):
            got, want = points[-1]["by_genre"][genre][name], entry[name]
            assert (got["gain"], got["gain_se"], got["clear"]) == pytest.approx((want["gain"], want["gain_se"], want["clear"]))
    # Each step is scored with its own parameters: training moved them between steps 1 and 3.
    assert not np.allclose(np.concatenate(_scores(root / "curve" / "scores_step1.jsonl")),
                           np.concatenate(_scores(root / "curve" / "scores_step3.jsonl")))
    table = (root / "curve" / "curve.md").read_text()
    assert table.count("\n| ") == 4 and "| plays vs 1 | plays vs 4 | speeches vs 1 | speeches vs 4 | > 2 SE |" in table
    assert (root / "curve" / "curve.png").stat().st_size > 10_000
    # A rerun reads the scores back; a step that was not saved is named.
    assert main(["demo-curve", f"--workdir={root}", "--steps=3"]) == 0
    assert "scoring" not in capsys.readouterr().err
    assert main(["demo-curve", f"--workdir={root}", "--steps=2,7"]) != 0
    assert "no saved steps [7] (saved: [1, 2, 3])" in capsys.readouterr().err

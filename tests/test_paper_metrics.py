"""The RankGen paper's metrics as its released code defines them: rep, token overlap, length, MAUVE (against
mauve-text itself), and pairwise suffix identification; each on fixed inputs with values worked out by hand."""

import json

import numpy as np
import pytest

from rankgen_jax.cli.main import run_command
from rankgen_jax.errors import RankgenError
from rankgen_jax.eval.generation_metrics import (MAUVE_MAX_LENGTH, generation_metrics, last_token_features,
                                                 mean_and_std, paper_mauve_texts, paper_metrics, rep_statistic)
from rankgen_jax.eval.ranking import gold_beats, pairwise_accuracy, score_file
from rankgen_jax.experiments.demo import suffix_identification
from rankgen_jax.retrieval.sparse import (NLTK_ENGLISH_STOPWORDS, normalized_words, token_overlap,
                                          token_overlap_scores, unigram_overlap_scores)
from rankgen_jax.testing import BOTCHAN, build_tiny_gpt2


def test_normalized_words_lower_case_no_ascii_punctuation_no_articles():
    # Punctuation is deleted, not replaced by a space ("don't" -> "dont", "well-known" -> "wellknown"); only
    # ASCII punctuation goes ("—" stays), and a / an / the go only as whole words ("another", "theme" stay).
    assert normalized_words("Don't stop, the END. An apple a day—A! Another well-known theme") == [
        "dont", "stop", "end", "apple", "day—", "another", "wellknown", "theme"]
    assert normalized_words("") == [] and normalized_words("The a AN.") == []


def test_nltk_stopwords_are_the_english_list():
    assert len(NLTK_ENGLISH_STOPWORDS) == 179
    assert {"i", "ourselves", "don't", "mightn", "wouldn't", "y", "ma"} <= NLTK_ENGLISH_STOPWORDS
    # Not in NLTK's list (unlike retrieval.sparse.ENGLISH_STOPWORDS or scikit-learn's).
    assert not {"also", "could", "would", "another"} & NLTK_ENGLISH_STOPWORDS
    # After normalisation only the entries without an apostrophe can match a word.
    assert sum("'" not in w for w in NLTK_ENGLISH_STOPWORDS) == 153


def test_token_overlap_is_precision_of_the_texts_words_against_the_prefix():
    prefix = "The cat sat on the mat with another cat."
    # Text words: cat cat dog sat ("a", "and" gone); prefix words: cat sat mat another cat ("the", "on",
    # "with" gone). Matched with counts: cat x2 (the prefix has two), sat -> 3 of 4.
    assert token_overlap("A cat, a cat and a dog sat.", prefix) == pytest.approx(3 / 4)
    # A prefix word matches at most as often as it occurs there: 1 of 3.
    assert token_overlap("cat cat cat", "cat") == pytest.approx(1 / 3)
    # Only stop words on both sides: 1.0; on one side only: 0.0.
    assert token_overlap("and of it", "the was") == 1.0
    assert token_overlap("", prefix) == 0.0 and token_overlap("cat", "and so") == 0.0
    # Case and punctuation do not matter: "Cat!" is "cat".
    assert token_overlap("Cat!", "cat") == 1.0
    np.testing.assert_allclose(token_overlap_scores(prefix, ["A cat, a cat and a dog sat.", "dogs bark"]),
                               [0.75, 0.0])
    # The other variant, unigram_overlap_scores, is an F1 of word sets with stop words kept:
    # {a, cat, and, dog, sat} vs {the, cat, sat, on, mat, with, another}: p 2/5, r 2/7 -> F1 1/3.
    assert unigram_overlap_scores(prefix, ["A cat, a cat and a dog sat."])[0] == pytest.approx(1 / 3)


def test_rep_statistic_window_reaches_into_the_prefix():
    # Words x y z | x q r x. Window 3: the first x sees [x y z] (repeat), q and r do not repeat, the last x
    # sees [x q r] (repeat): 2 of 4. Window 2: the first x sees [y z], the last [q r]: 0 of 4.
    assert rep_statistic("x y z", "x q r x", window=3) == pytest.approx(2 / 4)
    assert rep_statistic("x y z", "x q r x", window=2) == 0.0
    assert rep_statistic("x y z", "x q r x") == pytest.approx(2 / 4)
    # Normalised first: "The cat sat." -> cat sat; "The CAT, the sat!" -> cat sat: both repeat.
    assert rep_statistic("The cat sat.", "The CAT, the sat!") == 1.0
    # Nothing generated (after normalisation): 0.0.
    assert rep_statistic("x y", "the . !") == 0.0
    # A short prefix is looked back into even when prefix + generation exceed the window.
    generation = "red " + " ".join(f"w{i}" for i in range(19))
    assert rep_statistic("red green blue", generation) == pytest.approx(1 / 20)
    with pytest.raises(RankgenError, match="window"):
        rep_statistic("x", "x", window=0)


def test_paper_metrics_average_per_example():
    prefixes = ["x y z", "one two", "The cat sat on the mat with another cat."]
    generations = ["x q r x", "three four five", "A cat, a cat and a dog sat."]
    got = paper_metrics(prefixes, generations)
    # rep (stop words kept): 2/4; 0/3; cat cat and dog sat after "cat sat on mat with another cat": cat, cat
    # and sat repeat -> 3/5.
    assert got["rep"] == pytest.approx((2 / 4 + 0 + 3 / 5) / 3)
    # token overlap: x q r x against x z ("y" is an NLTK stop word), one x to match -> 1/4; 0/3; 3/4.
    assert got["token_overlap"] == pytest.approx((1 / 4 + 0 + 3 / 4) / 3)
    assert got["length_words"] == pytest.approx((4 + 3 + 8) / 3)
    # Per example, not pooled: a 1-word generation that repeats and a 3-word one that does not give 1/2.
    assert paper_metrics(["a b", "c"], ["b", "d e f"])["rep"] == pytest.approx(0.5)
    assert np.isnan(paper_metrics([], [])["rep"])
    with pytest.raises(RankgenError, match="2 prefixes but 1"):
        paper_metrics(["a", "b"], ["c"])


def test_generation_metrics_cli_reports_paper_metrics_and_variants(tmp_path, capsys):
    records = [{"prefix": "x y z", "generation": "x q r x"},
               {"prefix": "The cat sat on the mat with another cat.", "generation": "A cat, a cat and a dog sat."}]
    source = tmp_path / "gens.jsonl"
    source.write_text("\n".join(json.dumps(r) for r in records) + "\n", encoding="utf-8")
    out = run_command(["generation-metrics", "--input", str(source), "--rep_no_prefix"])
    assert json.loads(capsys.readouterr().out.splitlines()[-1]) == out
    assert out["rep"] == pytest.approx((2 / 4 + 3 / 5) / 2)
    assert out["token_overlap"] == pytest.approx((1 / 4 + 3 / 4) / 2)
    assert out["length_words"] == pytest.approx((4 + 8) / 2)
    # rep_pooled (raw whitespace tokens, generation only): the second x and the second "a" repeat ("cat," is
    # not "cat", "A" not "a"): 2 of 12.
    assert out["rep_pooled"] == pytest.approx(2 / 12)
    assert out["rep_pooled"] == generation_metrics(records, with_prefix=False)["rep_pooled"]
    with pytest.raises(RankgenError, match="window"):
        run_command(["generation-metrics", "--input", str(source), "--rep_window", "0"])


def test_pairwise_suffix_identification_is_the_mean_over_negatives():
    # Gold 0.5 beats 0.1 and 0.2, loses to 0.9, ties 0.5 (a tie is a loss, as in the paper's code): 2 of 4.
    assert gold_beats([0.5, 0.1, 0.9, 0.5, 0.2], 0) == pytest.approx(2 / 4)
    assert gold_beats([0.2, 0.7], 1) == 1.0 and gold_beats([1.0], 0) is None
    assert gold_beats([float("nan"), 0.3], 1) == 1.0  # NaN is the lowest score
    scores = [[0.5, 0.1, 0.9, 0.5, 0.2], [0.2, 0.7], [3.0]]
    # The one-candidate list has no negative to compare: the mean is over the other two.
    assert pairwise_accuracy(scores, [0, 1, 0]) == pytest.approx((0.5 + 1.0) / 2)
    assert np.isnan(pairwise_accuracy([[1.0]], [0]))
    # The demo reports it next to the 2-way and all-way accuracy.
    demo = suffix_identification([np.array([0.5, 0.1, 0.9, 0.5, 0.2]), np.array([0.9, 0.1, 0.2, 0.3, 0.4])])
    assert demo["accuracy_pairwise"] == pytest.approx((0.5 + 1.0) / 2)
    assert demo["accuracy_2way"] == 1.0 and demo["accuracy_5way"] == 0.5


def test_score_token_overlap_baseline_reports_pairwise(tmp_path, capsys):
    lines = [{"prefix": "The cat sat on the mat with another cat.",
              "candidates": ["dogs bark", "A cat, a cat and a dog sat.", "cat"], "label": 1},
             {"prefix": "x y z", "candidates": ["x q r x", "x"], "label": 0}]
    path = tmp_path / "items.jsonl"
    path.write_text("\n".join(json.dumps(x) for x in lines) + "\n", encoding="utf-8")
    result = score_file(None, str(path), str(tmp_path / "out.jsonl"), method="token_overlap")
    written = [json.loads(x) for x in (tmp_path / "out.jsonl").read_text().splitlines()]
    np.testing.assert_allclose(written[0]["scores"], [0.0, 0.75, 1.0])
    np.testing.assert_allclose(written[1]["scores"], [0.25, 1.0])
    # Line 1: gold 0.75 beats 0.0, loses to 1.0 -> 1/2; line 2: gold 0.25 loses -> 0.
    assert result["pairwise_accuracy"] == pytest.approx(0.25) and result["accuracy"] == 0.0
    run_command(["score", "--input", str(path), "--method", "token_overlap"])
    summary = json.loads(capsys.readouterr().out.splitlines()[-1])
    assert summary["pairwise_accuracy"] == pytest.approx(0.25) and summary["n"] == 2


# ---------------------------------------------------------------------------
# MAUVE, against mauve-text itself


@pytest.fixture(scope="module")
def gpt2_dir(tmp_path_factory, one_torch_thread):
    # "gpt2" in the folder name: mauve-text loads only models whose name says gpt2 (or bert).
    return build_tiny_gpt2(tmp_path_factory.mktemp("tiny_gpt2_mauve"), seed=3, n_positions=1024)


def _passages(n: int, words: int) -> list[str]:
    tokens = BOTCHAN.read_text(encoding="utf-8").split()
    return [" ".join(tokens[5000 + 97 * i : 5000 + 97 * i + words + 7 * (i % 5)]) for i in range(n)]


@pytest.mark.usefixtures("one_torch_thread")
def test_last_token_features_equal_mauve_texts_own(gpt2_dir):
    pytest.importorskip("mauve")
    from mauve.compute_mauve import get_features_from_input

    from rankgen_jax.lm.scoring import load_causal_lm

    lm = load_causal_lm(gpt2_dir)
    long_text = " ".join(BOTCHAN.read_text(encoding="utf-8").split()[:1200])
    assert len(lm.text_ids(long_text)) > MAUVE_MAX_LENGTH + 100  # so the cut at 768 tokens matters
    texts = _passages(5, 30) + [long_text, "Short."]
    ours = last_token_features(lm, texts, batch_size=3)
    theirs = get_features_from_input(None, None, texts, gpt2_dir, MAUVE_MAX_LENGTH, -1, name="p", batch_size=2)
    assert ours.shape == theirs.shape == (7, 32)
    np.testing.assert_allclose(ours, theirs, atol=1e-5, rtol=1e-5)
    # Cut anywhere else, the long text's last token (and so its feature) is another one.
    other = last_token_features(lm, [long_text], max_length=MAUVE_MAX_LENGTH + 50)
    assert np.abs(other[0] - theirs[5]).max() > 1e-2


@pytest.mark.usefixtures("one_torch_thread")
def test_paper_mauve_equals_mauve_text_called_as_the_paper(gpt2_dir, tmp_path, capsys):
    mauve = pytest.importorskip("mauve")
    n = 40
    prefixes, golds = _passages(n, 40), _passages(2 * n, 25)[n:]
    rng = np.random.default_rng(0)
    # Generations: the gold's words shuffled for half the items, a degenerate repetition for the rest.
    generations = [" ".join(rng.permutation(g.split())) if i % 2 else "I said no. " * (3 + i % 4)
                   for i, g in enumerate(golds)]
    source = tmp_path / "gens.jsonl"
    source.write_text("\n".join(json.dumps({"prefix": p, "generation": g, "gold": c})
                                for p, g, c in zip(prefixes, generations, golds)) + "\n", encoding="utf-8")
    out = run_command(["generation-metrics", "--input", str(source), "--mauve_model", gpt2_dir,
                       "--reference_field", "gold", "--mauve_no_cut"])
    # The paper's call: texts in, mauve-text tokenises, featurises and cuts at 768 tokens itself.
    want = mauve.compute_mauve(p_text=[p + " " + g for p, g in zip(prefixes, generations)],
                               q_text=[p + " " + c for p, c in zip(prefixes, golds)],
                               featurize_model_name=gpt2_dir, device_id=-1, max_text_length=768, verbose=False)
    assert 0.1 < want.mauve < 0.9  # far from both ends, so comparing other texts would show
    assert out["mauve"] == pytest.approx(want.mauve, abs=1e-6) and out["mauve_std"] == 0.0
    capsys.readouterr()
    # Without the prefixes (the variant) the texts compared differ, and so does the score.
    alone = run_command(["generation-metrics", "--input", str(source), "--mauve_model", gpt2_dir,
                         "--reference_field", "gold", "--mauve_no_prefix", "--mauve_no_cut"])
    want_alone = mauve.compute_mauve(p_text=generations, q_text=golds, featurize_model_name=gpt2_dir,
                                     device_id=-1, max_text_length=768, verbose=False)
    assert alone["mauve"] == pytest.approx(want_alone.mauve, abs=1e-6)
    assert abs(alone["mauve"] - out["mauve"]) > 1e-3


def test_mauve_runs_mean_and_std_as_the_paper():
    # The paper's five MAUVE runs (App. D.1) and the standard deviation it reports for them, 0.015.
    mean, std = mean_and_std([0.803, 0.778, 0.759, 0.785, 0.768])
    assert mean == pytest.approx(0.7786)
    # By hand: squared deviations 0.0244^2 + 0.0006^2 + 0.0196^2 + 0.0064^2 + 0.0106^2 = 0.0011332, over 5.
    assert std == pytest.approx((0.0011332 / 5) ** 0.5) and round(std, 3) == 0.015
    with pytest.raises(RankgenError, match="no runs"):
        mean_and_std([])


def test_paper_mauve_texts_cut_both_sides_at_a_sentence_end():
    records = [{"prefix": "It rained.", "generation": " He  ran home. Then he", "gold": "She sat; the dog slept and"},
               {"prefix": "Night.", "generation": "No end here", "gold": "Done! Yes? maybe"}]
    references, generations = paper_mauve_texts(records, "gold")
    assert references == ["It rained. She sat;", "Night. Done! Yes?"]
    assert generations == ["It rained. He ran home.", "Night. No end here"]
    assert paper_mauve_texts(records, "gold", cut=False, with_prefix=False)[1] == [" He  ran home. Then he",
                                                                                   "No end here"]


@pytest.mark.usefixtures("one_torch_thread")
def test_mauve_repeated_over_runs_and_seeds_against_mauve_text(gpt2_dir, tmp_path, capsys):
    """Two generation files (two generation seeds) at two k-means seeds: four mauve-text calls on the cut texts,
    their mean and ddof-0 standard deviation."""
    mauve = pytest.importorskip("mauve")
    n = 24
    prefixes, golds = _passages(n, 30), _passages(2 * n, 20)[n:]
    # Unfinished last sentences on both sides, so the cut matters.
    golds = [g + ". And then the" for g in golds]
    rng = np.random.default_rng(1)
    files, cut_generations = [], []
    for run in range(2):
        generations = [" ".join(rng.permutation(g.split()[:12])) + ". It was so. but " + "w" * (run + i % 3)
                       for i, g in enumerate(golds)]
        path = tmp_path / f"run{run}.jsonl"
        path.write_text("".join(json.dumps({"prefix": p, "generation": g, "gold": c}) + "\n"
                                for p, g, c in zip(prefixes, generations, golds)), encoding="utf-8")
        files.append(str(path))
        # By hand: the generation up to "It was so." and the gold up to its own last full stop.
        cut_generations.append([g[: g.index("It was so.") + len("It was so.")] for g in generations])
    cut_golds = [g[: -len(" And then the")] for g in golds]
    out = run_command(["generation-metrics", "--input", *files, "--mauve_model", gpt2_dir, "--reference_field",
                       "gold", "--mauve_seeds", "25", "7"])
    want = []
    for run in range(2):
        for seed in (25, 7):
            want.append(mauve.compute_mauve(
                p_text=[" ".join((p + " " + g).split()) for p, g in zip(prefixes, cut_generations[run])],
                q_text=[" ".join((p + " " + c).split()) for p, c in zip(prefixes, cut_golds)],
                featurize_model_name=gpt2_dir, device_id=-1, max_text_length=768, verbose=False, seed=seed).mauve)
    assert [(r["input"], r["seed"]) for r in out["mauve_runs"]] == [(files[0], 25), (files[0], 7),
                                                                    (files[1], 25), (files[1], 7)]
    np.testing.assert_allclose([r["mauve"] for r in out["mauve_runs"]], want, atol=1e-6)
    mean = sum(want) / 4
    assert out["mauve"] == pytest.approx(mean, abs=1e-6)
    assert out["mauve_std"] == pytest.approx((sum((w - mean) ** 2 for w in want) / 4) ** 0.5, abs=1e-6)
    assert len(set(np.round(want, 6))) > 1  # the runs do differ, so the spread is measured
    assert out["n"] == 2 * n
    assert out["mauve_generation_words"] == pytest.approx(np.mean([len(g.split()) for c in cut_generations
                                                                   for g in c]))
    assert out["mauve_reference_words"] == pytest.approx(np.mean([len(c.split()) for c in cut_golds]))

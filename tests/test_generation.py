"""`generate`: token samplers, RankGen beam search, re-rankers, seeding, memory cap, CLI; generation metrics."""

import json
import math
import sys
import types

import numpy as np
import pytest

from rankgen_jax.cli.main import run_command
from rankgen_jax.errors import RankgenError
from rankgen_jax.lm.generation import (Decoding, PerplexityReranker, RankGenReranker, SearchSettings, generate,
                                    pick_tokens, unigram_reranker)
from rankgen_jax.eval.generation_metrics import (generation_metrics, last_token_features, mauve_score,
                                            repeated_tokens, repetition)
from rankgen_jax.testing import botchan_prefixes, build_tiny_gpt2, build_tiny_rankgen

# Small budgets keep every search to a fraction of a second on the 2-layer GPT-2.
SMALL = dict(beam_size=2, num_samples=3, rerank_length=5, max_new_tokens=12)


pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture(scope="module")
def lm_dir(tmp_path_factory, one_torch_thread):
    return build_tiny_gpt2(tmp_path_factory.mktemp("tiny_gpt2"))


@pytest.fixture(scope="module")
def lm(lm_dir):
    from rankgen_jax.lm.scoring import load_causal_lm

    return load_causal_lm(lm_dir)


@pytest.fixture(scope="module")
def rankgen_dir(tmp_path_factory, spiece_model):
    return build_tiny_rankgen(tmp_path_factory.mktemp("tiny_rankgen") / "ckpt", spiece_model)


@pytest.fixture(scope="module")
def rankgen_model(rankgen_dir):
    from rankgen_jax.inference.encoder import load_model

    return load_model(rankgen_dir)


class Recording:
    """Wraps a re-ranker and keeps every (prefix, candidates, scores) it was asked for."""

    def __init__(self, inner):
        self.inner, self.calls = inner, []

    def __call__(self, prefix, candidates):
        scores = np.asarray(self.inner(prefix, list(candidates)))
        self.calls.append((prefix, list(candidates), scores))
        return scores


def beams_of(results):
    return [[(b["text"], b["new_tokens"], b["score"]) for b in r.beams] for r in results]


# ---------------------------------------------------------------------------
# Token samplers


def test_pick_tokens_truncates_then_inverts_the_cdf():
    import torch

    logits = torch.log(torch.tensor([[0.5, 0.3, 0.15, 0.05]]))

    def pick(u, **kw):
        return pick_tokens(logits, torch.tensor([u], dtype=torch.float64), Decoding(**kw)).item()

    # Nucleus 0.7 keeps {0, 1} (mass 0.8): u scales the kept mass, 0.99 * 0.8 = 0.79 lands in token 1.
    assert [pick(u, top_p=0.7) for u in (0.0, 0.6, 0.99)] == [0, 0, 1]
    assert pick(0.7, top_p=0.7) == 1 and pick(0.99, top_p=0.9) == 2
    assert pick(0.99, sampler="top_k", top_k=3) == 2 and pick(0.99, sampler="top_k", top_k=1) == 0
    assert pick(0.99, sampler="ancestral") == 3 and pick(0.9, sampler="greedy") == 0
    # Typical: entropy 1.14 nats; surprisal closest to it is token 1 (1.20), then token 0 (0.69).
    assert pick(0.0, sampler="typical", typical_p=0.5) == 1 and pick(0.99, sampler="typical", typical_p=0.5) == 0
    # Rows are independent: a batch gives what each row gives alone.
    batch = torch.randn(6, 50)
    u = torch.rand(6, dtype=torch.float64)
    for sampler in ("nucleus", "top_k", "typical", "ancestral"):
        together = pick_tokens(batch, u, Decoding(sampler)).tolist()
        assert together == [pick_tokens(batch[r : r + 1], u[r : r + 1], Decoding(sampler)).item() for r in range(6)]


def test_nucleus_and_top_k_from_the_head_equal_the_full_sort(monkeypatch):
    """The head shortcut (top NUCLEUS_CANDIDATES keys) picks what sorting the whole vocabulary picks."""
    import torch

    from rankgen_jax.lm import generation

    torch.manual_seed(0)
    vocab = 5000
    peaked = torch.randn(8, vocab) * 6.0  # a trained LM's shape: the nucleus is a few tokens
    flat = torch.randn(4, vocab) * 0.1  # the nucleus reaches past the head: the full sort is used
    tied = torch.zeros(2, vocab)
    tied[:, :3] = 5.0  # every token after the first three ties: a tie across the head's cut
    u = torch.rand(14, dtype=torch.float64)
    logits = torch.cat([peaked, flat, tied])
    for decoding in (Decoding("nucleus", top_p=0.9), Decoding("nucleus", top_p=0.5), Decoding("top_k", top_k=40)):
        head = pick_tokens(logits, u, decoding).tolist()
        # Each row alone, so the rows that can use the head do, whatever the others need.
        alone = [pick_tokens(logits[r : r + 1], u[r : r + 1], decoding).item() for r in range(14)]
        monkeypatch.setattr(generation, "NUCLEUS_CANDIDATES", vocab)  # no head: always the full sort
        full = pick_tokens(logits, u, decoding).tolist()
        monkeypatch.undo()
        assert head == full and alone == full
    # The head is used where it holds the nucleus, and refused where it does not.
    key = torch.log_softmax(logits, -1)
    nucleus = Decoding("nucleus", top_p=0.9)
    assert generation._head_order(key[:8], key[:8].exp(), nucleus) is not None
    assert generation._head_order(key[8:12], key[8:12].exp(), nucleus) is None
    assert generation._head_order(key[12:], key[12:].exp(), Decoding("top_k", top_k=40)) is None


def test_rows_of_one_context_share_its_prefill(lm, monkeypatch):
    """Rows with the same context run its first forward pass once; each row samples what it samples alone."""
    from rankgen_jax.lm.generation import SampleRow, row_seed, sample_rows

    a, b = lm.prefix_ids("The master of the school said"), lm.prefix_ids("It rained all night, and then")
    rows = [SampleRow(a, 12, row_seed(5, 0, 0, 0, i)) for i in range(3)] + [SampleRow(b, 12, row_seed(5, 1, 0, 0, 0))]
    alone, _ = sample_rows(lm, rows, Decoding(), max_batch_rows=1)
    widths = []
    forward = type(lm).forward

    def counting(self, ids, mask, positions, cache=None, keep=0):
        widths.append((ids.shape[0], ids.shape[1], cache is None))
        return forward(self, ids, mask, positions, cache=cache, keep=keep)

    monkeypatch.setattr(type(lm), "forward", counting)
    together, _ = sample_rows(lm, rows, Decoding(), max_batch_rows=64)
    assert together == alone
    assert widths[0] == (2, max(len(a), len(b)), True)  # the prefill: two distinct contexts, not four rows
    assert all(rows_ == 4 for rows_, _, _ in widths[1:])


def test_decoding_settings_are_checked():
    with pytest.raises(RankgenError, match="`top_p` must be in"):
        Decoding(top_p=0.0).check()
    with pytest.raises(RankgenError, match="unknown sampling"):
        Decoding("beam").check()


# ---------------------------------------------------------------------------
# Search


def test_beam_search_returns_b_beams_scored_on_the_whole_text(lm):
    reranker = Recording(unigram_reranker)
    prefixes = botchan_prefixes(2)
    results = generate(lm, prefixes, "beam", SearchSettings(seed=3, **SMALL), reranker=reranker)
    for result in results:
        assert len(result.beams) == 2
        for beam in result.beams:
            # Every beam used its whole budget, unless it ended at EOS.
            assert beam["new_tokens"] == 12 or (beam["eos"] and beam["new_tokens"] <= 12)
        assert result.text == result.beams[0]["text"] and result.new_tokens == result.beams[0]["new_tokens"]
        assert result.beams[0]["score"] >= result.beams[1]["score"]
        assert result.seconds_generate > 0 and result.seconds_rerank > 0
    assert any(b["new_tokens"] == 12 for r in results for b in r.beams)
    # Rounds of 5, 5, 2 tokens: the first scores B*N candidates (B empty beams, as the paper's code starts),
    # later ones up to B*N new ones per prefix.
    per_prefix = [[len(c) for p, c, _ in reranker.calls if p == prefix] for prefix in prefixes]
    assert all(counts[0] == 6 and 1 <= len(counts) <= 3 and max(counts) <= 6 for counts in per_prefix)
    # What the last round scored is the beams' whole generated text, not its last 5 tokens.
    for prefix, result in zip(prefixes, results):
        last = [c for p, c, _ in reranker.calls if p == prefix][-1]
        assert any(b["text"] in last for b in result.beams if b["new_tokens"] > 5)


def test_budget_is_per_prefix(lm):
    short, long = "Once.", botchan_prefixes(3)[2]
    together = generate(lm, [short, long], "beam", SearchSettings(seed=5, **SMALL), reranker=unigram_reranker)
    alone = generate(lm, [long], "beam", SearchSettings(seed=5, **SMALL), reranker=unigram_reranker, prefix_indices=[1])
    # The long prefix gets the same beams whether or not another prefix shares the call.
    assert beams_of(together)[1] == beams_of(alone)[0]
    for g in together:
        assert all(b["new_tokens"] == 12 or b["eos"] for b in g.beams)
    # Plain sampling: each prefix gets up to the whole budget, whatever the other one does.
    plain = generate(lm, [short, long], "ancestral", SearchSettings(max_new_tokens=9, seed=5))
    assert all(g.new_tokens == 9 or g.beams[0]["eos"] for g in plain)
    assert (
        generate(lm, [long], "ancestral", SearchSettings(max_new_tokens=9, seed=5), prefix_indices=[1])[0].text
        == plain[1].text
    )


def test_n1_b1_lmax_equals_plain_sampling(lm):
    prefixes = botchan_prefixes(3)
    plain = generate(lm, prefixes, "nucleus", SearchSettings(max_new_tokens=15, seed=7))
    beam = generate(
        lm,
        prefixes,
        "beam",
        SearchSettings(beam_size=1, num_samples=1, rerank_length=15, max_new_tokens=15, seed=7),
        reranker=unigram_reranker,
    )
    rerank = generate(
        lm, prefixes, "rerank", SearchSettings(num_samples=1, max_new_tokens=15, seed=7), reranker=unigram_reranker
    )
    assert [g.text for g in plain] == [g.text for g in beam] == [g.text for g in rerank]
    assert [g.new_tokens for g in plain] == [g.new_tokens for g in beam]
    other = generate(lm, prefixes, "nucleus", SearchSettings(max_new_tokens=15, seed=8))
    assert [g.text for g in other] != [g.text for g in plain]
    assert plain[0].beams[0]["score"] == 0.0 and plain[0].seconds_rerank == 0.0


def test_memory_cap_changes_nothing_but_speed(lm):
    prefixes = botchan_prefixes(3)
    runs = [
        generate(lm, prefixes, "beam", SearchSettings(seed=11, max_batch_rows=cap, **SMALL), reranker=unigram_reranker)
        for cap in (1, 4, 64)
    ]
    assert beams_of(runs[0]) == beams_of(runs[1]) == beams_of(runs[2])
    typical = [
        generate(lm, prefixes, "typical", SearchSettings(max_new_tokens=10, seed=2, max_batch_rows=cap))
        for cap in (1, 64)
    ]
    assert [g.text for g in typical[0]] == [g.text for g in typical[1]]


def test_rankgen_reranker_picks_the_best_candidate(lm, rankgen_model):
    reranker = Recording(RankGenReranker(rankgen_model))
    prefixes = botchan_prefixes(2)
    results = generate(
        lm, prefixes, "rerank", SearchSettings(num_samples=5, max_new_tokens=10, seed=1), reranker=reranker
    )
    assert len(reranker.calls) == 2
    for (prefix, candidates, scores), result in zip(reranker.calls, results):
        # Scores computed separately with the model's own score ("pre " / "suffi " markers, dot product).
        want = rankgen_model.score([prefix], [candidates])[0]
        np.testing.assert_allclose(scores, want, rtol=1e-4, atol=1e-5)
        assert len(set(candidates)) > 1
        assert result.text == candidates[int(np.argmax(want))]
        assert result.beams[0]["score"] == pytest.approx(float(np.max(want)), rel=1e-4, abs=1e-5)


def test_lm_and_unigram_rerankers_pick_their_best(lm):
    from rankgen_jax.eval.ranking import unigram_overlap_scores
    from rankgen_jax.lm.scoring import lm_loglik_scores

    prefix = botchan_prefixes(1)[0]
    for inner, reference in ((PerplexityReranker(lm), lambda c: lm_loglik_scores(lm, prefix, c)),
                             (unigram_reranker, lambda c: unigram_overlap_scores(prefix, c))):
        reranker = Recording(inner)
        result = generate(
            lm, [prefix], "rerank", SearchSettings(num_samples=4, max_new_tokens=8, seed=4), reranker=reranker
        )[0]
        (_, candidates, scores), = reranker.calls
        np.testing.assert_allclose(scores, reference(candidates), rtol=1e-6)
        # Ties keep sampling order, so the first of the best wins.
        assert result.text == candidates[int(np.argmax(scores))]


def test_paper_protocol_is_the_default(lm):
    """RankGen §2.3 / §3.2 / App. A.3: rerank 20 samples; beam B=2, N=10, L=20; 128-token generations, cut."""
    import inspect

    from rankgen_jax.cli.main import build_parser

    defaults = inspect.signature(generate).parameters["settings"].default
    assert (defaults.beam_size, defaults.rerank_length, defaults.max_new_tokens) == (2, 20, 128)
    assert defaults.num_samples is None and defaults.cut == "sentence" and defaults.decoding.top_p == 0.9
    args = build_parser().parse_args(["generate", "--lm", "x", "--input", "y", "--output", "z"])
    assert (args.beam_size, args.num_samples, args.rerank_length, args.max_new_tokens, args.cut, args.top_p) == (
        2, None, 20, 128, "sentence", 0.9)
    # num_samples unset: 20 over-generated samples for rerank, 10 per beam for beam search.
    prefix = botchan_prefixes(1)
    rerank = Recording(unigram_reranker)
    generate(lm, prefix, "rerank", SearchSettings(max_new_tokens=4, seed=1), reranker=rerank)
    assert [len(c) for _, c, _ in rerank.calls] == [20]
    beam = Recording(unigram_reranker)
    result = generate(lm, prefix, "beam", SearchSettings(max_new_tokens=4, rerank_length=2, seed=1), reranker=beam)[0]
    assert len(beam.calls[0][1]) == 20 and len(result.beams) == 2  # B x N samples a round
    # One sample with the default budget: 128 new tokens unless it ended at EOS.
    plain = generate(lm, prefix, "ancestral", SearchSettings(seed=3))[0]
    assert plain.new_tokens == 128 or plain.beams[0]["eos"]


def test_cut_at_the_last_sentence_end_as_the_released_code():
    from rankgen_jax.data.sentences import cut_at_last_sentence_end as cut

    assert cut("He left.  She  stayed and") == "He left."
    assert cut("Was it? Yes! no; and then") == "Was it? Yes! no;"
    assert cut("no end at all") == "no end at all"
    assert cut(".only a leading mark") == ".only a leading mark"  # the released code cuts only after index 0
    assert cut("  Mr. Smith came\n in") == "Mr."
    assert cut("") == ""


def test_generations_are_cut_at_a_sentence_end(lm):
    prefixes = botchan_prefixes(4)
    whole = generate(
        lm,
        prefixes,
        "rerank",
        SearchSettings(num_samples=3, max_new_tokens=40, seed=2, cut="none"),
        reranker=unigram_reranker,
    )
    cut = generate(
        lm, prefixes, "rerank", SearchSettings(num_samples=3, max_new_tokens=40, seed=2), reranker=unigram_reranker
    )
    from rankgen_jax.data.sentences import cut_at_last_sentence_end

    for w, c in zip(whole, cut):
        # Candidates are cut before they are scored: every beam is the cut of an uncut candidate.
        assert all(b["text"] == cut_at_last_sentence_end(b["text"]) for b in c.beams)
        assert c.new_tokens <= 40
    assert any(cut_at_last_sentence_end(w.text) != w.text for w in whole)  # the cut changes something here
    with pytest.raises(RankgenError, match="unknown `cut`"):
        generate(lm, prefixes, "nucleus", SearchSettings(cut="words"))


def test_baseline_strategies(lm):
    prefixes = botchan_prefixes(2)
    greedy = [generate(lm, prefixes, "greedy", SearchSettings(max_new_tokens=6, seed=s)) for s in (0, 1)]
    assert [g.text for g in greedy[0]] == [g.text for g in greedy[1]]  # no randomness
    for strategy in ("ancestral", "top_k", "typical"):
        runs = [generate(lm, prefixes, strategy, SearchSettings(max_new_tokens=6, seed=s)) for s in (0, 1)]
        assert all(0 < g.new_tokens <= 6 for g in runs[0])
        assert [g.text for g in runs[0]] != [g.text for g in runs[1]], strategy
    with pytest.raises(RankgenError, match="needs a `reranker`"):
        generate(lm, prefixes, "beam")
    with pytest.raises(RankgenError, match="greedy"):
        generate(lm, prefixes, "rerank", SearchSettings(decoding=Decoding("greedy")), reranker=unigram_reranker)
    with pytest.raises(RankgenError, match="`beam_size` must be at least 1"):
        generate(lm, prefixes, "beam", SearchSettings(beam_size=0), reranker=unigram_reranker)
    with pytest.raises(RankgenError, match="no room for a prompt"):
        generate(lm, prefixes, "nucleus", SearchSettings(max_new_tokens=256))


# ---------------------------------------------------------------------------
# Command line


def test_generate_cli_writes_jsonl_and_skips_bad_lines(lm_dir, rankgen_dir, tmp_path, capsys):
    prefixes = botchan_prefixes(3)
    source = tmp_path / "in.jsonl"
    source.write_text("\n".join([json.dumps({"id": 0, "prefix": prefixes[0], "continuation": "gold"}), "{broken",
                                 json.dumps({"prefix": "  "}), json.dumps({"prefix": prefixes[1]}), "",
                                 json.dumps({"prefix": prefixes[2]})]) + "\n", encoding="utf-8")
    outputs = []
    for batch in ("1", "2"):
        out = tmp_path / f"out{batch}.jsonl"
        stats = run_command(["generate", "--lm", lm_dir, "--model", rankgen_dir, "--input", str(source),
                             "--output", str(out), "--beam_size", "2", "--num_samples", "2",
                             "--rerank_length", "4", "--max_new_tokens", "8", "--prefix_batch", batch,
                             "--max_batch_rows", "3", "--no_progress"])
        assert stats["generated"] == 3 and stats["bad_lines"] == 2 and 0 < stats["rerank_share"] < 1
        outputs.append([json.loads(line) for line in out.read_text(encoding="utf-8").splitlines()])
    rows = outputs[0]
    assert [r["prefix"] for r in rows] == prefixes and rows[0]["id"] == 0 and rows[0]["continuation"] == "gold"
    for row in rows:
        assert {"prefix", "generation", "strategy", "reranker", "beams", "seconds_generate", "seconds_rerank",
                "new_tokens"} <= set(row)
        assert row["strategy"] == "beam" and row["reranker"] == "rankgen" and len(row["beams"]) == 2
        assert row["generation"] == row["beams"][0]["text"] and row["seconds_rerank"] > 0
    # Prefixes decoded one at a time or two together: the same text (only the timings differ).
    strip = lambda rs: [{k: v for k, v in r.items() if not k.startswith("seconds")} for r in rs]  # noqa: E731
    assert strip(outputs[0]) == strip(outputs[1])
    assert "3 prefixes with beam, 2 bad lines skipped" in capsys.readouterr().out

    plain = tmp_path / "plain.jsonl"
    run_command(["generate", "--lm", lm_dir, "--input", str(source), "--output", str(plain),
                 "--strategy", "top_k", "--max_new_tokens", "5", "--no_progress"])
    row = json.loads(plain.read_text(encoding="utf-8").splitlines()[0])
    assert row["strategy"] == "top_k" and "beams" not in row and row["seconds_rerank"] == 0.0
    with pytest.raises(RankgenError, match="needs --model"):
        run_command(["generate", "--lm", lm_dir, "--input", str(source), "--output", str(plain)])
    with pytest.raises(RankgenError, match="missing.jsonl does not exist"):
        run_command(["generate", "--lm", lm_dir, "--input", str(tmp_path / "missing.jsonl"),
                     "--output", str(plain), "--strategy", "greedy"])


# ---------------------------------------------------------------------------
# Generation metrics


def test_repetition_counts_tokens_seen_in_the_window():
    assert repeated_tokens(list("abab")) == 2
    assert repeated_tokens(list("abcab"), window=2) == 0  # "a" was 3 tokens back
    assert repeated_tokens(list("xy"), context=list("qx")) == 1
    # Pooled over generations: 2 repeats of 4 tokens and 0 of 2.
    assert repetition([list("abab"), list("cd")]) == pytest.approx(2 / 6)
    assert math.isnan(repetition([[]]))
    with pytest.raises(RankgenError, match="window"):
        repeated_tokens([1], window=0)


def test_generation_metrics_and_cli(tmp_path, capsys):
    records = [{"prefix": "the cat sat", "generation": "the cat sat the cat", "seconds_generate": 3.0,
                "seconds_rerank": 1.0, "new_tokens": 5},
               {"prefix": "a dog", "generation": "ran far away", "seconds_generate": 1.0, "seconds_rerank": 0.0,
                "new_tokens": 3}]
    result = generation_metrics(records, with_prefix=False)
    assert result["rep_pooled"] == pytest.approx(2 / 8) and result["rerank_share"] == pytest.approx(1 / 5)
    assert result["unigram_overlap"] == pytest.approx(0.5) and result["mean_new_tokens"] == 4
    # Looking back into the prefix: "the", "cat", "sat" of the first generation repeat the prefix.
    assert generation_metrics(records)["rep_pooled"] == pytest.approx(5 / 8)
    source = tmp_path / "gens.jsonl"
    source.write_text("\n".join(json.dumps(r) for r in records) + "\nnot json\n", encoding="utf-8")
    out = run_command(["generation-metrics", "--input", str(source), "--rep_no_prefix",
                       "--output", str(tmp_path / "m.json")])
    assert out["bad_lines"] == 1
    assert json.loads(capsys.readouterr().out.splitlines()[-1])["rep_pooled"] == pytest.approx(0.25)
    assert json.loads((tmp_path / "m.json").read_text())["n"] == 2


def test_mauve_features_and_optional_dependency(lm, lm_dir, monkeypatch, tmp_path):
    import torch

    texts = botchan_prefixes(3)
    features = last_token_features(lm, texts, batch_size=2)
    with torch.no_grad():
        ids = torch.tensor([lm.text_ids(texts[1])])
        alone = lm.model(input_ids=ids, output_hidden_states=True).hidden_states[-1][0, -1].numpy()
    assert features.shape == (3, 32)
    np.testing.assert_allclose(features[1], alone, atol=1e-5)
    monkeypatch.setitem(sys.modules, "mauve", None)  # as if mauve-text were not installed
    with pytest.raises(RankgenError, match="mauve-text"):
        mauve_score(texts, texts, lm)
    source = tmp_path / "g.jsonl"
    source.write_text(json.dumps({"prefix": "p", "generation": "g", "continuation": "c"}) + "\n")
    with pytest.raises(RankgenError, match="mauve-text"):
        run_command(["generation-metrics", "--input", str(source), "--mauve_model", lm_dir,
                     "--reference_field", "continuation"])
    seen = {}

    def compute_mauve(p_features, q_features, **kwargs):
        seen.update(p=p_features, q=q_features)
        return types.SimpleNamespace(mauve=0.75)

    monkeypatch.setitem(sys.modules, "mauve", types.SimpleNamespace(compute_mauve=compute_mauve))
    assert mauve_score(texts[:2], texts, lm) == 0.75
    # Generations are mauve-text's P, references its Q, as in the RankGen paper's code.
    assert seen["p"].shape == (3, 32) and seen["q"].shape == (2, 32)


def test_released_generator_face_is_generate(lm_dir, rankgen_dir):
    """rankgen_jax.RankGenGenerator, the released class's names and returns, gives what generate() gives."""
    import rankgen_jax
    from rankgen_jax.inference.api import RankGenEncoder

    encoder = RankGenEncoder(rankgen_dir)
    generator = rankgen_jax.RankGenGenerator(encoder, lm_dir, seed=3)
    contexts = botchan_prefixes(2)
    reranker = RankGenReranker(encoder.model)
    for call, strategy, settings in (
            (lambda: generator.beam_search(contexts, beam_size=2, num_tokens=5, num_samples=3, max_length=12),
             "beam", dict(beam_size=2, num_samples=3, rerank_length=5)),
            (lambda: generator.overgenerate_rerank(contexts, num_samples=3, max_length=12), "rerank",
             dict(num_samples=3)),
            (lambda: generator.generate_single(contexts, max_length=12), "nucleus", {})):
        texts, scores = call()
        want = generate(
            generator.lm, contexts, strategy, SearchSettings(max_new_tokens=12, seed=3, **settings), reranker=reranker
        )
        assert texts == [[b["text"] for b in w.beams] for w in want]
        assert [s.tolist() for s in scores] == [[b["score"] for b in w.beams] for w in want]
    assert len(texts) == 2 and all(len(t) == 1 for t in texts)
    with pytest.raises(RankgenError, match="a list of context strings"):
        generator.beam_search("one string")
    with pytest.raises(RankgenError, match="temperature=0.7 is not supported"):
        generator.overgenerate_rerank(contexts, temperature=0.7)
    with pytest.raises(RankgenError, match="cache_dir is for model-hub downloads"):
        rankgen_jax.RankGenGenerator(encoder, lm_dir, cache_dir="/tmp/hub")


def test_offline_recipe_for_generate(tmp_path, capsys):
    """The documented way to try `generate` offline: a tiny GPT-2 and RankGen model built from the bundled text."""
    from rankgen_jax.testing import build_tiny_gpt2, build_tiny_rankgen, train_tiny_vocab

    lm = build_tiny_gpt2(tmp_path / "tiny_gpt2")
    model = build_tiny_rankgen(tmp_path / "tiny_rankgen", train_tiny_vocab(tmp_path / "spiece.model"))
    (tmp_path / "prefixes.jsonl").write_text(json.dumps({"prefix": "It was a bright cold day in April"}) + "\n")
    run_command(["generate", "--lm", lm, "--model", model, "--input", str(tmp_path / "prefixes.jsonl"), "--output",
                 str(tmp_path / "out.jsonl"), "--beam_size", "2", "--num_samples", "2", "--rerank_length", "4",
                 "--max_new_tokens", "8", "--no_progress"])
    (row,) = [json.loads(line) for line in (tmp_path / "out.jsonl").read_text().splitlines()]
    assert row["strategy"] == "beam" and len(row["beams"]) == 2 and 0 < row["new_tokens"] <= 8

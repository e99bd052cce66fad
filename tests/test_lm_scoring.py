"""LM baselines: token log-probs independent of padding, lm_loglik / PMI / avg ULL, and `score --method ...`."""

import json
import math

import numpy as np
import pytest

from rankgen_jax.cli.main import build_parser, run_command
from rankgen_jax.errors import RankgenError
from rankgen_jax.eval.ranking import score_file
from rankgen_jax.lm.scoring import lm_loglik_scores, load_causal_lm, pmi_scores, score_lists, token_logprobs
from rankgen_jax.testing import botchan_prefixes, build_tiny_gpt2


pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture(scope="module")
def lm_dir(tmp_path_factory, one_torch_thread):
    return build_tiny_gpt2(tmp_path_factory.mktemp("tiny_gpt2"), n_positions=128)


@pytest.fixture(scope="module")
def lm(lm_dir):
    return load_causal_lm(lm_dir)


def reference_logprobs(lm, context, target):
    """log p(target | context) from one unpadded forward pass, without the code under test."""
    import torch

    with torch.no_grad():
        logits = lm.model(input_ids=torch.tensor([context + target])).logits[0].float()
    logprobs = torch.log_softmax(logits, -1)[len(context) - 1 : -1]
    return logprobs.gather(-1, torch.tensor(target)[:, None])[:, 0].double().numpy()


def test_batched_equals_one_by_one_with_left_and_right_padding(lm):
    texts = botchan_prefixes(6)
    # Cut to fit the 128-position context, so the reference forward needs no truncation.
    contexts = [lm.prefix_ids(t)[-40 + 9 * i :] for i, t in enumerate(texts[:3])] + [lm.prefix_ids("Hi")]
    targets = [lm.text_ids(" " + t)[: 30 - 7 * i] for i, t in enumerate(texts[3:])] + [lm.text_ids(" there")]
    want = [reference_logprobs(lm, c, t) for c, t in zip(contexts, targets)]
    assert len({len(c) + len(t) for c, t in zip(contexts, targets)}) > 1  # rows really are padded
    for side in ("left", "right"):
        for batch_size in (1, 3, 4):
            got = token_logprobs(lm, contexts, targets, batch_size=batch_size, padding_side=side)
            for g, w in zip(got, want):
                np.testing.assert_allclose(g, w, atol=2e-5, err_msg=f"{side} {batch_size}")
    with pytest.raises(RankgenError, match="padding side"):
        token_logprobs(lm, contexts, targets, padding_side="middle")


def test_loglik_and_pmi_definitions(lm):
    prefix = botchan_prefixes(1)[0]
    candidates = [" and so he went home.", " The cat.", ""]
    per_token = [reference_logprobs(lm, lm.prefix_ids(prefix), lm.text_ids(c)) for c in candidates[:2]]
    prior = [reference_logprobs(lm, [lm.start_id], lm.text_ids(c)) for c in candidates[:2]]
    mean = lm_loglik_scores(lm, prefix, candidates)
    total = lm_loglik_scores(lm, prefix, candidates, reduce="sum")
    np.testing.assert_allclose(mean[:2], [v.mean() for v in per_token], atol=2e-5)
    np.testing.assert_allclose(total[:2], [v.sum() for v in per_token], atol=1e-4)
    np.testing.assert_allclose(pmi_scores(lm, prefix, candidates)[:2],
                               [(c - p).mean() for c, p in zip(per_token, prior)], atol=2e-5)
    np.testing.assert_allclose(pmi_scores(lm, prefix, candidates, reduce="sum")[:2],
                               [(c - p).sum() for c, p in zip(per_token, prior)], atol=1e-4)
    # An empty candidate has nothing to judge: it ranks last.
    assert mean[2] == -math.inf and pmi_scores(lm, prefix, candidates)[2] == -math.inf
    # Lists of different prefixes, batched together, give what each list gives alone.
    many = score_lists(lm, [prefix, "Snow fell."], [candidates, [" It was cold."]], "pmi", batch_size=2)
    np.testing.assert_allclose(many[1], pmi_scores(lm, "Snow fell.", [" It was cold."]), atol=2e-5)
    with pytest.raises(RankgenError, match="unknown LM scoring method"):
        score_lists(lm, [prefix], [candidates], "perplexity")


def test_average_unconditional_loglik_is_the_joined_texts_mean(lm):
    """Appendix C.6's avg ULL: log p(prefix + candidate) / (|prefix| + |candidate|), by one plain forward pass."""
    import torch

    prefix = botchan_prefixes(1)[0]
    candidates = [" and so he went home. ", "The cat sat.", ""]
    got = score_lists(lm, [prefix], [candidates], "avg_ull")[0]
    total = score_lists(lm, [prefix], [candidates], "avg_ull", reduce="sum")[0]
    for j, candidate in enumerate(candidates[:2]):
        ids = lm.tokenizer(prefix.strip() + " " + candidate.strip(), add_special_tokens=False)["input_ids"]
        with torch.no_grad():
            logits = lm.model(input_ids=torch.tensor([[lm.start_id] + ids])).logits[0].double()
        logprobs = torch.log_softmax(logits, -1)[:-1].gather(-1, torch.tensor(ids)[:, None])[:, 0]
        assert got[j] == pytest.approx(float(logprobs.mean()), abs=2e-5)
        assert total[j] == pytest.approx(float(logprobs.sum()), abs=1e-3)
    assert got[2] == -math.inf
    # The prefix counts: another prefix changes the score of the same candidate (unlike a suffix-only score).
    other = score_lists(lm, ["Snow fell on the hills."], [candidates[:1]], "avg_ull")[0]
    assert abs(other[0] - got[0]) > 1e-3
    # Too long for the context: the joined text keeps its end, the candidate whole.
    long_prefix = " ".join(botchan_prefixes(12))
    ids = lm.text_ids(long_prefix.strip() + " He laughed.")[-127:]
    want = reference_logprobs(lm, [lm.start_id], ids).mean()
    assert score_lists(lm, [long_prefix], [[" He laughed."]], "avg_ull")[0][0] == pytest.approx(want, abs=2e-5)


def test_long_inputs_keep_the_end_of_the_prefix(lm):
    long_prefix = " ".join(botchan_prefixes(12))  # far beyond the 128-position context
    target = lm.text_ids(" He laughed.")
    context = lm.prefix_ids(long_prefix)
    assert len(context) > 128
    got = token_logprobs(lm, [context], [target])[0]
    np.testing.assert_allclose(got, reference_logprobs(lm, context[-(128 - len(target)):], target), atol=2e-5)


def write_jsonl(path, records):
    path.write_text("".join(json.dumps(r) + "\n" for r in records), encoding="utf-8")
    return str(path)


def test_score_command_lm_methods(lm, lm_dir, tmp_path, capsys):
    texts = botchan_prefixes(6)
    records = [{"prefix": texts[i], "candidates": [" " + texts[i + 1], " " + texts[5 - i]], "label": i % 2}
               for i in range(3)]
    path = write_jsonl(tmp_path / "in.jsonl", records + [{"prefix": "no candidates"}])
    parser = build_parser()
    for method in ("lm_loglik", "pmi", "avg_ull"):
        out = tmp_path / f"{method}.jsonl"
        args = parser.parse_args(["score", "--method", method, "--lm", lm_dir, "--input", path,
                                  "--output", str(out), "--lm_batch_size", "3", "--no_progress"])
        args.run(args)
        summary = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
        assert summary["n"] == 3 and 0 <= summary["accuracy"] <= 1
        written = [json.loads(line)["scores"] for line in out.read_text(encoding="utf-8").splitlines()]
        want = score_lists(lm, [r["prefix"] for r in records], [r["candidates"] for r in records], method)
        for w, s in zip(written, want):
            np.testing.assert_allclose(w, s, atol=1e-5)
    with pytest.raises(RankgenError, match="the --method pmi needs --lm"):
        run_command(["score", "--method", "pmi", "--input", path])
    with pytest.raises(RankgenError, match="needs a causal LM"):
        score_file(None, path, method="lm_loglik")

"""RankGen's claim about generation: the combined table against a hand-made case, the clear error without
negatives-claim's outputs, and the job end to end with a tiny LM and a tiny MiniLM."""

import json

import pytest

from rankgen_jax.errors import RankgenError
from rankgen_jax.experiments import generation_claim as claim

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def _row(length, beams, samples, mauve, std, seconds=1.0, share=0.0):
    return {"rerank_length": length, "beam_size": beams, "num_samples": samples, "mauve": mauve, "mauve_std": std,
            "mauve_runs": [{}] * 3, "mauve_generation_words": 50.0, "mauve_reference_words": 60.0,
            "seconds_per_generation": seconds, "rerank_share": share}


def test_table_by_hand():
    nucleus = _row("max", 1, 1, 0.50, 0.05)
    rerankers = {"trained": {"rows": {"Lmax_B1_N1": nucleus, "Lmax_B1_N20": _row("max", 1, 20, 0.62, 0.04, 9.0, 0.1),
                                      "L20_B2_N10": _row(20, 2, 10, 0.53, 0.02)}},
                 "perplexity": {"rows": {"Lmax_B1_N1": nucleus, "Lmax_B1_N20": _row("max", 1, 20, 0.45, 0.06)}}}
    lines = claim.table_markdown(rerankers).splitlines()
    cells = [[c.strip() for c in line.strip("|").split("|")] for line in lines[2:]]
    # Nucleus once, then each re-ranker's other configurations.
    assert [c[:2] for c in cells] == [["nucleus (p = 0.9)", "-"], ["over-generate 20, re-rank", "trained"],
                                      ["beam B = 2, N = 10, L = 20", "trained"],
                                      ["over-generate 20, re-rank", "perplexity"]]
    assert cells[1][2:5] == ["0.620 ± 0.040 (3)", "+0.120", "yes"]  # 0.12 > max(0.04, 0.05)
    assert cells[2][3:5] == ["+0.030", "no"] and cells[3][3:5] == ["-0.050", "no"]
    assert cells[1][5:] == ["50.0 / 60.0", "9.00", "10.0%"]


def test_unknown_rerankers_are_refused():
    with pytest.raises(RankgenError, match="rerankers must be some of"):
        claim.GenerationClaimConfig(rerankers=("trained", "bm25"))
    with pytest.raises(RankgenError, match="rerankers must be some of"):
        claim.GenerationClaimConfig(rerankers=())


def test_missing_negatives_claim_outputs_are_a_clear_error(tmp_path):
    import gin

    from rankgen_jax.experiments.gin_runs import gin_config

    with gin_config(["rankgen_claims/generation_minilm.gin"], [f"GenerationClaimConfig.claim_dir = '{tmp_path}'"]):
        with pytest.raises(RankgenError, match="no held-out prefixes; run `rankgen-jax negatives-claim"):
            claim.run_generation_claim(str(tmp_path / "w"))
    gin.clear_config()


def test_the_job_end_to_end_with_tiny_models(tmp_path):
    pytest.importorskip("mauve")
    import gin

    from rankgen_jax.experiments.gin_runs import gin_config
    from rankgen_jax.testing import botchan_prefixes, build_tiny_gpt2, build_tiny_minilm

    lm = build_tiny_gpt2(tmp_path / "lm", n_positions=512)
    ranker = build_tiny_minilm(tmp_path / "claim" / "ranker_both")
    texts = botchan_prefixes(16)
    (tmp_path / "claim" / "eval_prefixes.jsonl").write_text(
        "".join(json.dumps({"id": str(i), "prefix": texts[i], "continuation": texts[i + 8] + " The end."}) + "\n"
                for i in range(8)), encoding="utf-8")
    grid = tmp_path / "grid.json"
    grid.write_text(json.dumps({"rerank_lengths": [4], "samples": [[1, 1], [2, 2]], "full_rerank_samples": [3],
                                "seeds": [0, 1], "max_new_tokens": 8, "prefixes": 6}))
    bindings = [f"GenerationClaimConfig.claim_dir = '{tmp_path / 'claim'}'", f"GenerationClaimConfig.grid = '{grid}'",
                f"GenerationClaimConfig.lm = '{lm}'", f"GenerationClaimConfig.mauve_model = '{lm}'",
                "GenerationClaimConfig.init_from_hf = ''", f"GenerationClaimConfig.init_checkpoint = '{ranker}'"]
    with gin_config(["rankgen_claims/generation_minilm.gin"], bindings):
        results = claim.run_generation_claim(str(tmp_path / "w"), progress=False)
    gin.clear_config()
    for name in claim.RERANKERS:
        rows = results["rerankers"][name]["rows"]
        assert list(rows) == ["Lmax_B1_N1", "L4_B2_N2", "Lmax_B1_N3"]
        assert all(len(row["mauve_runs"]) == 2 and 0 < row["mauve"] <= 1 for row in rows.values())
    # The same seeds give the same nucleus text whatever re-ranks (it re-ranks nothing).
    nucleus = [[json.loads(line)["generation"] for line in
                (tmp_path / "w" / name / "Lmax_B1_N1" / "seed0.jsonl").read_text().splitlines()]
               for name in claim.RERANKERS]
    assert nucleus[0] == nucleus[1] == nucleus[2]
    table = (tmp_path / "w" / claim.TABLE_FILE).read_text()
    assert table.count("| nucleus (p = 0.9) |") == 1 and table.count("over-generate 3, re-rank") == 3

"""RankGen's claim about negatives: the training groups and held-out items it draws, its length-only scorer and
table against a hand-made case, and (slow) the job end to end with a tiny LM and a tiny MiniLM."""

import json

import numpy as np
import pytest

from rankgen_jax.data.source_configs import DataConfig, ExamplesData
from rankgen_jax.data.sources import corpus_split
from rankgen_jax.data.vocab import BUNDLED_CORPUS
from rankgen_jax.experiments import negatives_claim as claim

pytestmark = pytest.mark.usefixtures("one_torch_thread")

DATA = DataConfig(ExamplesData(corpus=str(BUNDLED_CORPUS / "austen"), prefix_words=64, max_continuation_words=48, holdout_documents=1), batch_size=8)


def test_training_groups_are_whole_documents_spread_over_the_corpus():
    records = claim.training_prefixes(DATA, groups=6, seed=0)
    (train_docs, held_docs), _ = corpus_split(DATA.source)
    assert len(records) == 6 * 8 and len({r["id"] for r in records}) == 48
    groups = [records[k: k + 8] for k in range(0, 48, 8)]
    assert all(len({r["doc_id"] for r in g}) == 1 for g in groups)
    # Documents in turn: as many documents as groups allow, never a held-out one.
    assert len({g[0]["doc_id"] for g in groups}) == min(6, len(train_docs))
    assert not {r["doc_id"] for r in records} & {d.id for d in held_docs}
    assert records == claim.training_prefixes(DATA, groups=6, seed=0)
    with pytest.raises(Exception, match="groups of 8, not 100000"):
        claim.training_prefixes(DATA, groups=100000, seed=0)


def test_held_out_items_come_from_the_held_out_documents():
    items = claim.held_out_items(DATA, count=5, negatives=3, seed=0)
    (_, held_docs), _ = corpus_split(DATA.source)
    assert len(items) == 5 and all(len(it["candidates"]) == 4 for it in items)
    assert {it["doc_id"] for it in items} <= {d.id for d in held_docs}


def test_length_only_scorer_and_the_table_by_hand():
    # The longer candidate scores higher; a tie goes against the gold.
    assert list(np.argsort(-claim.length_only_scores(["a b c", "a b c d", "a"]))) == [1, 0, 2]
    assert claim.length_only_scores(["a b", "c d"]).argmax() == 1
    wins = {"inbook": {"inbook": {"all": [1, 0, 1, 0], "vs1": [1, 1, 1, 0]},
                       "machine": {"all": [0, 0, 1, 0], "vs1": [0, 0, 1, 0]}},
            "both": {"inbook": {"all": [1, 0, 1, 1], "vs1": [1, 1, 1, 1]},
                     "machine": {"all": [1, 1, 1, 0], "vs1": [1, 1, 1, 0]}}}
    table = claim.table_markdown({"wins": wins})
    both = next(line for line in table.splitlines() if line.startswith("| ranker: both"))
    cells = [c.strip() for c in both.strip("|").split("|")]
    # vs 10 InBook 0.75 (SE sqrt(.75 * .25 / 4)); vs LM 0.75; paired vs the InBook ranker: +0.5 and +0.25.
    assert cells[1] == "0.750 ± 0.217" and cells[3] == "0.750 ± 0.217"
    assert cells[4] == f"+0.500 ± {np.std([1, 1, 0, 0], ddof=1) / 2:.3f}"
    assert cells[5] == f"+0.250 ± {np.std([0, 0, 0, 1], ddof=1) / 2:.3f}"
    inbook = next(line for line in table.splitlines() if line.startswith("| ranker: InBook"))
    assert inbook.rstrip(" |").endswith("| - | -")


@pytest.mark.slow
def test_the_job_end_to_end_with_tiny_models(tmp_path):
    import gin

    from rankgen_jax.experiments.gin_runs import gin_config
    from rankgen_jax.testing import build_tiny_gpt2, build_tiny_minilm

    lm = build_tiny_gpt2(tmp_path / "lm")
    init = build_tiny_minilm(tmp_path / "init")
    bindings = [f"ExamplesData.corpus = '{BUNDLED_CORPUS / 'austen'}'", "ExamplesData.holdout_ids = []",
                "ExamplesData.holdout_documents = 1", "DataConfig.batch_size = 8", "ExamplesData.prefix_words = 48",
                "ExamplesData.max_continuation_words = 24", "DataConfig.prefix_length = 32",
                "ExamplesData.continuation_length = 24", "ExamplesData.vocab = ''",
                "TrainerConfig.eval_every = 0", "TrainerConfig.checkpoint_every = 4", "TrainerConfig.log_every = 2",
                f"NegativesClaimConfig.lm = '{lm}'", "NegativesClaimConfig.init_from_hf = ''",
                f"NegativesClaimConfig.init_checkpoint = '{init}'", "NegativesClaimConfig.train_groups = 2",
                "NegativesClaimConfig.eval_items = 6", "NegativesClaimConfig.eval_negatives = 3",
                "NegativesClaimConfig.steps = 4", "NegativesClaimConfig.lm_max_new_tokens = 40",
                "NegativesClaimConfig.lm_prompt_tokens = 32", "NegativesClaimConfig.lm_batch_size = 4"]
    with gin_config(["rankgen_claims/negatives_minilm.gin"], bindings):
        results = claim.run_negatives_claim(str(tmp_path / "w"))
    gin.clear_config()
    triples = [json.loads(line) for line in (tmp_path / "w" / "train_triples.jsonl").read_text().splitlines()]
    assert len(triples) == 16 and all(t["generative_negative"] for t in triples)
    for name in ("unigram", "length", "zero_shot", "inbook", "generative", "both"):
        assert len(results["wins"][name]["inbook"]["all"]) == 6 and len(results["wins"][name]["machine"]["vs1"]) == 6
    assert all(results[f"train_{name}"]["steps"] == 4 for name in claim.RANKERS)
    assert "| ranker: both |" in (tmp_path / "w" / claim.TABLE_FILE).read_text()

"""BERT-family models through the one sharded step: shared / separate dual-encoder towers and a cross encoder."""

import jax
import numpy as np
import pytest

from rankgen_jax.runtime import partitioning
from rankgen_jax.models.configs import BertConfig, HeadConfig, ModelConfig
from rankgen_jax.data.source_configs import DataConfig, RandomData
from rankgen_jax.data.sources import RandomTriples
from rankgen_jax.models import batch_layout
from rankgen_jax.models.factory import abstract_variables
from rankgen_jax.train.step import StepOptions
from step_harness import TOL, assert_trees_close, run_steps

BERT = BertConfig(vocab_size=128, d_model=32, d_ff=64, num_layers=2, num_heads=4, max_position_embeddings=64)
TRIPLES = DataConfig(RandomData(continuation_length=8, vocab_size=128), batch_size=16, prefix_length=12, seed=5)


def triples(index):
    return RandomTriples(TRIPLES).batch(index)


def candidate_lists(index, batch=16, candidates=4, length=10):
    """[B, C, L] query/candidate pairs with token types, one-hot gold labels and a padded candidate."""
    rng = np.random.default_rng([11, index])
    ids = rng.integers(3, 128, (batch, candidates, length)).astype(np.int32)
    ids[:, :, -2:] = 0
    types = np.zeros_like(ids)
    types[:, :, 4:] = 1
    labels = np.zeros((batch, candidates), np.float32)
    labels[np.arange(batch), rng.integers(0, candidates - 1, batch)] = 1.0
    mask = np.ones((batch, candidates), bool)
    mask[::3, -1] = False
    return {"pair_ids": ids, "pair_type_ids": types, "labels": labels, "candidate_mask": mask}


CASES = {
    "dual_shared": (ModelConfig(encoder=BERT, head=HeadConfig("mean", 0, True)),
                    StepOptions("in_batch_softmax", (("logit_scale", 20.0),)), triples),
    "dual_two_tower": (ModelConfig(encoder=BERT, head=HeadConfig("first", 16, False), shared_towers=False),
                       StepOptions("in_batch_softmax"), triples),
    "cross_encoder": (ModelConfig(encoder=BERT, head=HeadConfig("first", 0, False), kind="cross_encoder"),
                      StepOptions("listwise_softmax", towers=batch_layout.towers("cross_encoder")), candidate_lists),
}


def test_two_tower_parameter_tree():
    params = abstract_variables(CASES["dual_two_tower"][0])["params"]
    assert set(params) == {"query_tower", "document_tower"}
    assert "projection_layer" in params["query_tower"] and "embeddings" in params["document_tower"]
    shared = abstract_variables(CASES["dual_shared"][0])["params"]
    assert "embeddings" in shared and "query_tower" not in shared
    cross = abstract_variables(CASES["cross_encoder"][0])["params"]
    assert "score_head" in cross and "embeddings" in cross


@pytest.mark.parametrize("case", sorted(CASES))
def test_sharded_step_equals_single_device(case):
    config, options, batch_fn = CASES[case]
    single = run_steps(config, options, batch_fn, partitioning.make_mesh(1, 1, devices=jax.devices()[:1]), "standard")
    sharded = run_steps(config, options, batch_fn, partitioning.make_mesh(4, 2), "standard")
    np.testing.assert_allclose(sharded[0], single[0], rtol=TOL, atol=TOL)
    assert single[0][0] != single[0][-1]
    assert_trees_close(sharded[1], single[1])  # gradients of step 0
    assert_trees_close(sharded[2], single[2])  # params after 3 steps
    if case == "dual_two_tower":
        # Queries train the query tower, candidates the document tower: both get gradients.
        model_grads = single[1][0]
        for tower in ("query_tower", "document_tower"):
            norm = sum(float(np.sum(np.square(g))) for g in jax.tree_util.tree_leaves(model_grads[tower]))
            assert norm > 0, tower

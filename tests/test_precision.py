"""The dtype policy (models.precision): a bfloat16 step against the float32 step, what stays float32."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rankgen_jax.data.source_configs import DataConfig, RandomData
from rankgen_jax.data.sources import RandomTriples
from rankgen_jax.errors import RankgenError
from rankgen_jax.models.configs import BertConfig, HeadConfig, ModelConfig, T5Config, t5_config
from rankgen_jax.models.factory import build_model, init_params
from rankgen_jax.models.precision import resolve_activation_dtype
from rankgen_jax.runtime import partitioning
from rankgen_jax.tpu.aot import sub_jaxprs
from rankgen_jax.train.step import StepOptions, compute_grads
from step_harness import run_steps

DATA = DataConfig(RandomData(continuation_length=8, vocab_size=128, with_negative=True), batch_size=8, prefix_length=12, seed=3)
T5 = ModelConfig(encoder=t5_config("tiny", vocab_size=128, dtype="float32"), head=HeadConfig("first", -1, False))
BERT = ModelConfig(encoder=BertConfig(vocab_size=128, d_model=32, d_ff=64, num_layers=2, num_heads=4,
                                      max_position_embeddings=64, dtype="float32"), head=HeadConfig("mean", 0, True))
OPTIONS = StepOptions("in_batch_softmax", (("logit_scale", 20.0),))
# bfloat16 keeps 8 significant bits (relative rounding 2^-9 ~ 0.2% per op): through two
# layers and the loss the step's loss agrees to LOSS_TOL (relative), every gradient tensor to
# GRAD_TOL of its largest entry. Measured here: loss within 0.05%, gradients within 2% (T5), 5% (BERT).
LOSS_TOL = 1e-2
GRAD_TOL = 8e-2


def _bf16(config: ModelConfig) -> ModelConfig:
    return dataclasses.replace(config, encoder=dataclasses.replace(config.encoder, dtype="bfloat16"))


def _batch(index):
    return RandomTriples(DATA).batch(index)


def _float_dtypes(tree):
    return {jnp.dtype(x.dtype) for x in jax.tree_util.tree_leaves(tree) if jnp.issubdtype(x.dtype, jnp.floating)}


def _loss_and_grads(config, params, batch):
    fn = jax.jit(lambda p, b: compute_grads(build_model(config), OPTIONS, p, {}, b, None))
    loss, _, (grads, _) = fn(params, batch)
    return float(loss), jax.device_get(grads)


@pytest.mark.parametrize("config", [T5, BERT], ids=["t5", "bert"])
def test_bfloat16_step_is_close_to_the_float32_step(config):
    params, batch = init_params(config, seed=1), _batch(1)
    loss, grads = _loss_and_grads(config, params, batch)
    loss_bf16, grads_bf16 = _loss_and_grads(_bf16(config), params, batch)
    assert abs(loss_bf16 - loss) <= LOSS_TOL * abs(loss)
    # Gradients that are zero in exact arithmetic (a key bias: softmax ignores a shift) are
    # measured against the tree's largest entry instead.
    floor = 1e-3 * max(float(np.abs(g).max()) for g in jax.tree_util.tree_leaves(grads))
    worst = 0.0
    for (path, g), g_bf16 in zip(jax.tree_util.tree_leaves_with_path(grads), jax.tree_util.tree_leaves(grads_bf16)):
        assert jnp.dtype(g_bf16.dtype) == jnp.float32, jax.tree_util.keystr(path)
        scale = max(float(np.abs(g).max()), floor)
        diff = float(np.abs(np.asarray(g_bf16) - g).max())
        assert diff <= GRAD_TOL * scale, f"{jax.tree_util.keystr(path)}: {diff:.3g} > {GRAD_TOL} x {scale:.3g}"
        worst = max(worst, diff / scale)
    # Not vacuous: the bfloat16 step really computed in bfloat16.
    assert worst > 1e-4


def test_params_and_optimizer_state_stay_float32():
    mesh = partitioning.make_mesh(1, 1, devices=jax.devices()[:1])
    losses, _, params, _, state = run_steps(_bf16(T5), OPTIONS, _batch, mesh, "standard", num_steps=2)
    assert losses[0] != losses[1]
    assert _float_dtypes(params) == {jnp.dtype(jnp.float32)}
    assert _float_dtypes(state.opt_state) == {jnp.dtype(jnp.float32)}


def _dot_outputs(jaxpr):
    """(output shape, dtype) of every dot_general in a jaxpr and its sub-jaxprs."""
    found = []
    for eqn in jaxpr.eqns:
        if eqn.primitive.name == "dot_general":
            found.append((tuple(eqn.outvars[0].aval.shape), jnp.dtype(eqn.outvars[0].aval.dtype)))
        for value in eqn.params.values():
            for sub in sub_jaxprs(value):
                found += _dot_outputs(sub)
    return found


@pytest.mark.parametrize("config", [T5, BERT], ids=["t5", "bert"])
def test_in_batch_logits_are_float32_and_the_encoder_bfloat16(config):
    config = _bf16(config)
    params = init_params(config)
    batch = _batch(0)
    jaxpr = jax.make_jaxpr(lambda p: compute_grads(build_model(config), OPTIONS, p, {}, batch, None))(params)
    dots = _dot_outputs(jaxpr.jaxpr)
    b = DATA.batch_size
    # query x (positives and negatives): [B, 2B] scores, and the encoder's matmuls.
    scores = [dtype for shape, dtype in dots if shape == (b, 2 * b)]
    assert scores and set(scores) == {jnp.dtype(jnp.float32)}
    assert jnp.dtype(jnp.bfloat16) in {dtype for _, dtype in dots}


def test_auto_is_bfloat16_on_accelerators_and_float32_on_cpu():
    assert T5Config().dtype == "auto" and BertConfig().dtype == "auto"
    for platform in ("gpu", "cuda", "tpu"):
        assert resolve_activation_dtype("auto", platform) == jnp.bfloat16
    assert resolve_activation_dtype("auto", "cpu") == jnp.float32
    assert resolve_activation_dtype("float32", "tpu") == jnp.float32
    assert resolve_activation_dtype("bfloat16", "cpu") == jnp.bfloat16
    with pytest.raises(RankgenError, match="T5Config.dtype='fp16'"):
        t5_config("tiny", dtype="fp16")

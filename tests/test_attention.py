"""The softmax attention implementations against NumPy and against each other (values and gradients),
and which one the dispatch picks on each platform."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rankgen_jax.ops import dispatch
from rankgen_jax.ops.attention import key_lengths, library_attention, softmax_attention_autodiff, softmax_attention_cpu
from test_cpu_kernels import kernels_or_skip

B, L, H, K = 3, 12, 2, 8


def _inputs(seed=0):
    rng = np.random.default_rng(seed)
    q, k, v = (rng.normal(size=(B, L, H, K)).astype(np.float32) for _ in range(3))
    relpos = rng.normal(size=(1, H, L, L)).astype(np.float32)
    mask = np.zeros((B, 1, 1, L), np.float32)
    mask[1, ..., L - 4:] = -1e9  # padded keys of the second row
    keep = (rng.random((B, H, L, L)) > 0.25).astype(np.float32) / 0.75
    return q, k, v, relpos, mask, keep


def _numpy_attention(q, k, v, bias, keep):
    logits = np.einsum("bqhd,bkhd->bhqk", q.astype(np.float64), k) + bias
    weights = np.exp(logits - logits.max(-1, keepdims=True))
    weights /= weights.sum(-1, keepdims=True)
    if keep is not None:
        weights = weights * keep
    return np.einsum("bhqk,bkhd->bqhd", weights, v)


@pytest.mark.parametrize("impl", [softmax_attention_autodiff, softmax_attention_cpu], ids=["autodiff", "cpu"])
@pytest.mark.parametrize("with_dropout", [False, True])
def test_forward_matches_numpy(impl, with_dropout):
    q, k, v, relpos, mask, keep = _inputs()
    keep = keep if with_dropout else None
    out = impl(q, k, v, jnp.asarray(relpos + mask), keep, jnp.float32)
    np.testing.assert_allclose(np.asarray(out), _numpy_attention(q, k, v, relpos + mask, keep), atol=2e-5)


def _loss_and_grads(impl, keep, dtype, bias_terms):
    q, k, v, relpos, mask, _ = _inputs()
    cotangent = np.random.default_rng(1).normal(size=(B, L, H, K)).astype(np.float32)

    def loss(q, k, v, relpos, mask):
        bias = relpos + mask if bias_terms == "relpos+mask" else mask
        out = impl(q.astype(dtype), k.astype(dtype), v.astype(dtype), bias, keep, dtype)
        return jnp.sum(out.astype(jnp.float32) * cotangent)

    return jax.jit(jax.value_and_grad(loss, argnums=(0, 1, 2, 3, 4)))(q, k, v, relpos, mask)


@pytest.mark.parametrize("bias_terms", ["relpos+mask", "mask"])
@pytest.mark.parametrize("with_dropout", [False, True])
def test_cpu_vjp_equals_autodiff(bias_terms, with_dropout):
    keep = jnp.asarray(_inputs()[5]) if with_dropout else None
    value_ref, grads_ref = _loss_and_grads(softmax_attention_autodiff, keep, jnp.float32, bias_terms)
    value, grads = _loss_and_grads(softmax_attention_cpu, keep, jnp.float32, bias_terms)
    np.testing.assert_allclose(value, value_ref, rtol=1e-5)
    for name, g, g_ref in zip(["q", "k", "v", "relpos", "mask"], grads, grads_ref):
        assert g.shape == g_ref.shape, name
        np.testing.assert_allclose(np.asarray(g), np.asarray(g_ref), atol=2e-5, rtol=1e-4, err_msg=name)
    # Not vacuous: the bias gradients are summed over the batch, the q/k/v ones are not small.
    bias_grad = grads[3] if bias_terms == "relpos+mask" else grads[4]
    assert float(jnp.abs(bias_grad).max()) > 0.1 and float(jnp.abs(grads[0]).max()) > 0.1


def test_cpu_vjp_equals_autodiff_in_bfloat16():
    value_ref, grads_ref = _loss_and_grads(softmax_attention_autodiff, None, jnp.bfloat16, "relpos+mask")
    value, grads = _loss_and_grads(softmax_attention_cpu, None, jnp.bfloat16, "relpos+mask")
    np.testing.assert_allclose(value, value_ref, rtol=2e-2, atol=2e-2)
    for name, g, g_ref in zip(["q", "k", "v", "relpos"], grads, grads_ref):
        scale = float(jnp.abs(g_ref).max())
        np.testing.assert_allclose(np.asarray(g, np.float32), np.asarray(g_ref, np.float32), atol=3e-2 * scale, err_msg=name)


# The fused C++ kernel (kernels/fused_attention.py): compiled here on first use.
def _fused_or_skip():
    from rankgen_jax_cpu.fused_attention import fused_attention

    kernels_or_skip()
    return fused_attention


@pytest.mark.parametrize(
    "batch,length,heads,head_dim,with_position_bias",
    [(3, 12, 2, 8, True), (2, 37, 3, 20, True), (2, 64, 4, 32, False), (2, 130, 2, 64, True)],
)
def test_fused_kernel_equals_autodiff(batch, length, heads, head_dim, with_position_bias):
    fused_attention = _fused_or_skip()
    rng = np.random.default_rng(0)
    q, k, v = (rng.normal(size=(batch, length, heads, head_dim)).astype(np.float32) for _ in range(3))
    position_bias = rng.normal(size=(1, heads, length, length)).astype(np.float32) if with_position_bias else None
    mask = np.zeros((batch, 1, 1, length), np.float32)
    mask[-1, ..., length // 2:] = -1e9  # the last row is half padding
    cotangent = rng.normal(size=q.shape).astype(np.float32)

    def reference(q, k, v, position_bias):
        bias = mask if position_bias is None else position_bias + mask
        return jnp.sum(softmax_attention_autodiff(q, k, v, bias, None, jnp.float32) * cotangent)

    def fused(q, k, v, position_bias):
        return jnp.sum(fused_attention(q, k, v, position_bias, mask) * cotangent)

    argnums = (0, 1, 2, 3) if with_position_bias else (0, 1, 2)
    value_ref, grads_ref = jax.jit(jax.value_and_grad(reference, argnums=argnums))(q, k, v, position_bias)
    value, grads = jax.jit(jax.value_and_grad(fused, argnums=argnums))(q, k, v, position_bias)
    np.testing.assert_allclose(value, value_ref, rtol=1e-5)
    for name, g, g_ref in zip(["q", "k", "v", "position_bias"], grads, grads_ref):
        scale = float(jnp.abs(g_ref).max())
        assert scale > 1e-2, name
        np.testing.assert_allclose(np.asarray(g), np.asarray(g_ref), atol=2e-5 * scale, err_msg=name)


def test_t5_encoder_same_with_and_without_the_fused_kernels(monkeypatch):
    """Attention, gated GELU, RMS norm and the dense layers' matmuls go through the kernels; outputs and gradients equal XLA's."""
    _fused_or_skip()
    from rankgen_jax.models.configs import t5_config
    from rankgen_jax.models.t5 import T5EncoderStack
    from rankgen_jax.ops import dispatch

    cfg = t5_config("tiny", vocab_size=64)
    model = T5EncoderStack(cfg)
    rng = np.random.default_rng(0)
    x = rng.normal(size=(2, 20, cfg.d_model)).astype(np.float32)
    mask = np.ones((2, 20), bool)
    mask[1, 13:] = False
    params = model.init(jax.random.PRNGKey(0), x, mask)["params"]
    # A random projection: the sum of squares after the final RMS norm is nearly constant.
    cotangent = rng.normal(size=(2, 20, cfg.d_model)).astype(np.float32)

    def loss(params):
        return jnp.sum(model.apply({"params": params}, x, mask).last_hidden_state * cotangent)

    calls = []
    kernels = dispatch.active_kernels()
    assert kernels is not None and kernels.name == "cpu_kernel"  # conftest enables the CPU plug-in
    # T5 1.1's MLP is the fused gated-GELU MLP (t5.MlpBlock); all of them are reached through `ops.dispatch`.
    used = ("attention", "rms_norm", "dense", "gated_gelu_mlp")
    counted = dataclasses.replace(kernels, **{name: lambda *a, real=getattr(kernels, name), name=name:
                                              calls.append(name) or real(*a) for name in used})
    monkeypatch.setattr(dispatch, "active_kernels", lambda: counted)
    value_fused, grads_fused = jax.value_and_grad(loss)(params)
    assert set(calls) == set(used), calls
    monkeypatch.setattr(dispatch, "active_kernels", lambda: None)
    value_xla, grads_xla = jax.value_and_grad(loss)(params)
    np.testing.assert_allclose(value_fused, value_xla, rtol=1e-5)
    for g, g_ref in zip(jax.tree_util.tree_leaves(grads_fused), jax.tree_util.tree_leaves(grads_xla)):
        np.testing.assert_allclose(np.asarray(g), np.asarray(g_ref), atol=1e-5 * float(jnp.abs(g_ref).max()) + 1e-7)



# jax.nn.dot_product_attention as the GPU path calls it; its `xla` implementation runs here,
# `cudnn` needs a GPU. Key masks: right-padded rows (the fused path, padding as lengths), and
# a row padded on the left or a row without a valid key (the lax.cond's general branch).
MASKS = {
    "right-padded": [L, L - 4, 1],
    "left-padded": [L, -3, L - 2],
    "no-valid-key": [L, 0, L - 5],
}


def _key_mask(lengths):
    mask = np.zeros((len(lengths), 1, 1, L), np.float32)
    for row, n in enumerate(lengths):
        if n >= 0:
            mask[row, ..., n:] = -1e10
        else:
            mask[row, ..., :-n] = -1e10
    return mask


def test_key_lengths_tell_right_padding_apart():
    for name, lengths in MASKS.items():
        lengths_B, right_padded = key_lengths(jnp.asarray(_key_mask(lengths)))
        assert bool(right_padded) == (name == "right-padded"), name
        if name == "right-padded":
            np.testing.assert_array_equal(np.asarray(lengths_B), lengths)


@pytest.mark.parametrize("mask_name", list(MASKS))
@pytest.mark.parametrize("with_position_bias", [True, False])
def test_library_attention_equals_reference(mask_name, with_position_bias):
    q, k, v, relpos, _, _ = _inputs(4)
    mask = _key_mask(MASKS[mask_name])
    relpos = relpos if with_position_bias else None
    out = jax.jit(lambda *a: library_attention(*a, jnp.float32, "xla"))(q, k, v, relpos, mask)
    bias = mask if relpos is None else relpos + mask
    # A row without a valid key has no defined result (its logits all round to the mask value
    # in float32): finite is all the encoder needs there.
    rows = [i for i, n in enumerate(MASKS[mask_name]) if n != 0]
    assert np.isfinite(np.asarray(out)).all()
    np.testing.assert_allclose(np.asarray(out)[rows], _numpy_attention(q, k, v, bias, None)[rows], atol=2e-5)


@pytest.mark.parametrize("dtype,tol", [(jnp.float32, 2e-5), (jnp.bfloat16, 3e-2)], ids=["float32", "bfloat16"])
def test_library_attention_gradients_equal_autodiff(dtype, tol):
    """Against XLA's autodiff in float32 on the same (dtype-rounded) inputs; tol is relative to each gradient's max."""
    q, k, v, relpos, _, _ = _inputs(5)
    q, k, v = (np.asarray(jnp.asarray(x).astype(dtype).astype(jnp.float32)) for x in (q, k, v))
    mask = jnp.asarray(_key_mask(MASKS["right-padded"]))
    cotangent = np.random.default_rng(2).normal(size=(B, L, H, K)).astype(np.float32)

    def loss(impl, dtype):
        def value(q, k, v, relpos):
            out = impl(q.astype(dtype), k.astype(dtype), v.astype(dtype), relpos, dtype)
            return jnp.sum(out.astype(jnp.float32) * cotangent)
        return jax.jit(jax.value_and_grad(value, argnums=(0, 1, 2, 3)))(q, k, v, relpos)

    value, grads = loss(lambda q, k, v, relpos, dt: library_attention(q, k, v, relpos, mask, dt, "xla"), dtype)
    value_ref, grads_ref = loss(lambda q, k, v, relpos, dt: softmax_attention_autodiff(q, k, v, relpos + mask, None, dt),
                                jnp.float32)
    np.testing.assert_allclose(value, value_ref, rtol=tol, atol=tol)
    for name, g, g_ref in zip(["q", "k", "v", "relpos"], grads, grads_ref):
        scale = float(jnp.abs(g_ref).max())
        assert scale > 0.1, name
        np.testing.assert_allclose(np.asarray(g, np.float32), np.asarray(g_ref, np.float32), atol=tol * scale,
                                   err_msg=name)


@pytest.mark.parametrize(
    "platform,dtype,length,head_dim,with_dropout,expected",
    [
        ("gpu", jnp.bfloat16, 512, 64, False, "cudnn"),
        ("cuda", jnp.float16, 128, 128, False, "cudnn"),
        ("gpu", jnp.float32, 512, 64, False, "xla"),  # cuDNN's flash attention is half precision only
        ("gpu", jnp.bfloat16, 511, 64, False, "xla"),  # with a bias in training: even lengths only
        ("gpu", jnp.bfloat16, 512, 12, False, "xla"),  # head dim not a multiple of 8
        ("gpu", jnp.bfloat16, 512, 64, True, "xla"),   # dropout on the weights: XLA's
        ("tpu", jnp.bfloat16, 512, 64, False, "xla"),
        ("cpu", jnp.bfloat16, 512, 64, False, "cpu"),
    ],
)
def test_attention_implementation_per_platform(monkeypatch, platform, dtype, length, head_dim, with_dropout, expected):
    monkeypatch.setattr(dispatch, "target_platform", lambda: platform)
    q = jax.ShapeDtypeStruct((2, length, 4, head_dim), dtype)
    assert dispatch.attention_implementation(q, q, dtype, with_dropout) == expected

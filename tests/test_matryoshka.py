"""The Matryoshka loss against NumPy: the weighted sum of the wrapped loss on every cut of the vectors (re-normalised
for a normalising head), its gradients, and the settings refused before anything compiles."""

from __future__ import annotations

import jax
import numpy as np
import pytest

from rankgen_jax.errors import RankgenError
from rankgen_jax.losses import registry
from rankgen_jax.losses.matryoshka import Matryoshka, matryoshka_loss
from rankgen_jax.models.configs import HeadConfig, ModelConfig, t5_config
from rankgen_jax.train.config import LossConfig, matryoshka_for
from test_list_losses import ref_kl
from test_losses import make_batch, numpy_loss

DIMS, WEIGHTS = (8, 4, 2), (1.0, 0.5, 0.25)


def _cut(vectors, dim, normalize):
    cut = np.asarray(vectors, np.float64)[..., :dim]
    return cut / np.linalg.norm(cut, axis=-1, keepdims=True) if normalize else cut


def _matryoshka_value_and_grad(name, outputs, batch, options, spec):
    fn = matryoshka_loss(registry.get_loss(name), spec)
    value_and_grad = jax.jit(jax.value_and_grad(lambda o: fn(o, batch, {}, **options), has_aux=True))
    (loss, metrics), grads = value_and_grad(outputs)
    return float(loss), metrics, grads


@pytest.mark.parametrize("normalize", [False, True])
def test_in_batch_softmax_sums_each_cut_as_numpy_does(normalize):
    outputs, batch = make_batch(6, 2, dim=8, seed=3)
    options = {"logit_scale": 5.0}
    spec = Matryoshka(DIMS, WEIGHTS, normalize)
    loss, metrics, grads = _matryoshka_value_and_grad("in_batch_softmax", outputs, batch, options, spec)
    want, want_grads = 0.0, {k: np.zeros(v.shape) for k, v in outputs.items()}
    for dim, weight in zip(DIMS, WEIGHTS):
        cut = {k: _cut(v, dim, normalize) for k, v in outputs.items()}
        ref_metrics, ref_grads, _, _ = numpy_loss("in_batch_softmax", cut, batch, options)
        want += weight * ref_metrics["loss"]
        np.testing.assert_allclose(float(metrics[f"loss_dim{dim}"]), ref_metrics["loss"], rtol=1e-5)
        if not normalize:  # a plain cut passes the gradient to the first `dim` components
            for key, grad in ref_grads.items():
                want_grads[key][..., :dim] += weight * grad
    np.testing.assert_allclose(loss, want, rtol=1e-5)
    np.testing.assert_allclose(float(metrics["loss"]), want, rtol=1e-5)
    if not normalize:
        for key, grad in want_grads.items():
            np.testing.assert_allclose(np.asarray(grads[key]), grad, rtol=1e-5, atol=1e-6, err_msg=key)


def test_a_distillation_loss_is_wrapped_alike():
    rng = np.random.RandomState(4)
    query, candidates = rng.normal(size=(3, 6)).astype(np.float32), rng.normal(size=(3, 5, 6)).astype(np.float32)
    batch = {"teacher_scores": rng.normal(size=(3, 5)).astype(np.float32), "candidate_mask": np.ones((3, 5), bool)}
    spec = Matryoshka((6, 3), (1.0, 2.0))
    loss, _, _ = _matryoshka_value_and_grad("kl_distillation", {"query": query, "candidates": candidates}, batch,
                                           {"temperature": 2.0}, spec)
    want = sum(w * ref_kl(np.einsum("bd,bcd->bc", _cut(query, d, False), _cut(candidates, d, False)), batch,
                          temperature=2.0) for d, w in zip((6, 3), (1.0, 2.0)))
    np.testing.assert_allclose(loss, want, rtol=1e-5)


def test_weights_default_to_one_and_follow_the_head():
    spec = LossConfig(matryoshka_dims=(16, 8)).matryoshka(normalize=True)
    assert spec == Matryoshka((16, 8), (1.0, 1.0), True)
    model = ModelConfig(encoder=t5_config("tiny", vocab_size=64), head=HeadConfig("mean", -1, True))
    assert matryoshka_for(LossConfig(matryoshka_dims=(8, 4)), model).normalize
    assert matryoshka_for(LossConfig(), model) is None


@pytest.mark.parametrize("loss, model, message", [
    (dict(matryoshka_dims=(4, 8)), None, "largest first"),
    (dict(matryoshka_dims=(8, 8)), None, "distinct"),
    (dict(matryoshka_dims=(8, 4), matryoshka_weights=(1.0,)), None, "one weight each"),
    (dict(matryoshka_weights=(1.0,)), None, "not given"),
    (dict(matryoshka_dims=(8, 4), matryoshka_weights=(0.0, 0.0)), None, "one of them > 0"),
    (dict(matryoshka_dims=(4096, 8)), "dual", "have 128 dimensions"),
    (dict(matryoshka_dims=(8,), name="listmle"), "cross", "cut a dual encoder's vectors"),
])
def test_settings_that_would_train_wrongly_are_refused(loss, model, message):
    models = {"dual": ModelConfig(encoder=t5_config("tiny", vocab_size=64)),
              "cross": ModelConfig(encoder=t5_config("tiny", vocab_size=64), kind="cross_encoder")}
    with pytest.raises(RankgenError, match=message):
        config = LossConfig(**loss)
        matryoshka_for(config, models[model or "dual"])

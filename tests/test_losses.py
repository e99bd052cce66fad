"""Contrastive losses against plain NumPy references: values, metrics, gradients, duplicate masking, sharding."""

import functools

import jax
import numpy as np
import pytest
from jax.sharding import NamedSharding, PartitionSpec

from rankgen_jax.losses import contrastive
from rankgen_jax.losses import registry as losses
from rankgen_jax.runtime import partitioning
from rankgen_jax.errors import RankgenError

RTOL = 1e-5
ATOL = 1e-6


# ----------------------------------------------------------------------------- fixtures


def make_batch(num_examples, num_negatives, dim=8, seed=0, duplicates=True):
    """Random embeddings and right-padded ids; with `duplicates`, plant same-text candidates.

    Planted cases (all need masking): two examples share a gold text; a
    negative equals another example's gold text but is padded to a different
    length; a negative equals its own example's gold text.
    """
    rng = np.random.RandomState(seed)
    len_pos, len_neg = 6, 9  # different padded lengths for positives and negatives
    outputs = {
        "query": rng.normal(0, 0.6, (num_examples, dim)).astype(np.float32),
        "positive": rng.normal(0, 0.6, (num_examples, dim)).astype(np.float32),
    }
    pos_ids = np.zeros((num_examples, len_pos), np.int32)
    for b in range(num_examples):
        n = rng.randint(2, len_pos + 1)
        pos_ids[b, :n] = rng.randint(1, 50, n)
    batch = {"positive_ids": pos_ids}
    if num_negatives is not None:
        k = max(num_negatives, 1)
        neg_ids = np.zeros((num_examples, k, len_neg), np.int32)
        for b in range(num_examples):
            for j in range(k):
                n = rng.randint(2, len_neg + 1)
                neg_ids[b, j, :n] = rng.randint(1, 50, n)
        if duplicates:
            last = num_examples - 1
            pos_ids[last] = pos_ids[0]  # same gold text in two examples (across shards when sharded)
            neg_ids[1, 0] = 0
            neg_ids[1, 0, :len_pos] = pos_ids[last - 1]  # another example's gold, longer padding
            neg_ids[2, k - 1] = 0
            neg_ids[2, k - 1, :len_pos] = pos_ids[2]  # its own gold text
        shape = (num_examples, dim) if num_negatives == 0 else (num_examples, k, dim)
        outputs["negative"] = rng.normal(0, 0.6, shape).astype(np.float32)
        batch["negative_ids"] = neg_ids[:, 0] if num_negatives == 0 else neg_ids
    elif duplicates:
        pos_ids[num_examples - 1] = pos_ids[0]
    return outputs, batch


# ----------------------------------------------------------------------------- numpy reference


def text(ids):
    """The unpadded token tuple of one sequence (the reference's notion of 'same text')."""
    return tuple(np.trim_zeros(np.asarray(ids), "b").tolist())


def candidates_and_texts(outputs, batch):
    """Global candidate list in the documented column order: all positives, then negatives b*K + k."""
    positive = outputs["positive"].astype(np.float64)
    cands = [positive]
    texts = [text(r) for r in batch["positive_ids"]]
    if "negative" in outputs:
        neg = outputs["negative"].astype(np.float64)
        neg = neg[:, None] if neg.ndim == 2 else neg
        neg_ids = batch["negative_ids"]
        neg_ids = neg_ids[:, None] if neg_ids.ndim == 2 else neg_ids
        cands.append(neg.reshape(-1, neg.shape[-1]))
        texts += [text(r) for r in neg_ids.reshape(-1, neg_ids.shape[-1])]
    return np.concatenate(cands, 0), texts


def reference_rows(name, outputs, batch, mask_duplicates):
    """For each row i: the global candidate columns left in its softmax (its gold column is i)."""
    num_examples = outputs["query"].shape[0]
    cands, texts = candidates_and_texts(outputs, batch)
    rows = []
    for i in range(num_examples):
        if name == "in_batch_softmax":
            cols = list(range(len(cands)))
        else:
            k = (len(cands) - num_examples) // num_examples
            cols = [i] + [num_examples + i * k + j for j in range(k)]
        keep = [j for j in cols if j == i or not (mask_duplicates and texts[j] == texts[i])]
        rows.append(keep)
    return cands, rows


def numpy_loss(name, outputs, batch, options, log_scale=None):
    """Loss, metrics and analytic gradients (softmax minus one-hot) in float64 loops."""
    mask_duplicates = options.get("mask_duplicates", True)
    margin = options.get("margin", 0.0)
    scale = np.exp(log_scale) if options.get("learn_logit_scale") else options.get("logit_scale", 1.0)
    query = outputs["query"].astype(np.float64)
    num_examples = query.shape[0]
    cands, rows = reference_rows(name, outputs, batch, mask_duplicates)

    loss = 0.0
    correct = 0
    pos_scores, neg_scores = [], []
    d_query = np.zeros_like(query)
    d_cands = np.zeros_like(cands)
    d_log_scale = 0.0
    num_masked = 0
    for i, cols in enumerate(rows):
        raw = np.array([query[i] @ cands[j] for j in cols])
        gold = np.array([j == i for j in cols])
        z = scale * (raw - margin * gold)
        m = z.max()
        lse = m + np.log(np.exp(z - m).sum())
        loss += (lse - z[gold][0]) / num_examples
        correct += cols[int(np.argmax(raw))] == i
        pos_scores.append(raw[gold][0])
        neg_scores += list(raw[~gold])
        g = (np.exp(z - lse) - gold) / num_examples  # dL/dz
        for gj, j in zip(g, cols):
            d_query[i] += gj * scale * cands[j]
            d_cands[j] += gj * scale * query[i]
        d_log_scale += float(g @ z)  # z is linear in the scale, so dz/dlog(scale) = z
        num_masked += (len(cands) if name == "in_batch_softmax" else len(rows[0])) - len(cols)
    metrics = {
        "loss": loss,
        "accuracy": correct / num_examples,
        "positive_score": np.mean(pos_scores),
        "negative_score": np.mean(neg_scores) if neg_scores else 0.0,
        "logit_scale": scale,
    }
    grads = {"query": d_query, "positive": d_cands[:num_examples]}
    if "negative" in outputs:
        grads["negative"] = d_cands[num_examples:].reshape(outputs["negative"].shape)
    return metrics, grads, d_log_scale, num_masked


# ----------------------------------------------------------------------------- jitted losses (compiled once per case)


@functools.lru_cache(maxsize=None)
def jitted_value_and_grad(name, options_items, shardings=None):
    """jit(value_and_grad) of a named loss w.r.t. the embeddings and the loss params."""
    loss_fn = losses.get_loss(name)

    def f(outputs, batch, loss_params):
        return loss_fn(outputs, batch, loss_params, **dict(options_items))

    value_and_grad = jax.value_and_grad(f, argnums=(0, 2), has_aux=True)
    if shardings is None:
        return jax.jit(value_and_grad)
    return jax.jit(value_and_grad, in_shardings=shardings)


def run_loss(name, outputs, batch, options, shardings=None):
    loss_params = losses.init_loss_params(name, **options)
    fn = jitted_value_and_grad(name, tuple(sorted(options.items())), shardings)
    (loss, metrics), (d_outputs, d_params) = fn(outputs, batch, loss_params)
    return loss, metrics, d_outputs, d_params, loss_params


def assert_matches_reference(name, outputs, batch, options, loss, metrics, d_outputs, d_params, loss_params):
    log_scale = float(loss_params["log_logit_scale"]) if "log_logit_scale" in loss_params else None
    ref_metrics, ref_grads, ref_d_log_scale, num_masked = numpy_loss(name, outputs, batch, options, log_scale)
    np.testing.assert_allclose(float(loss), ref_metrics["loss"], rtol=RTOL)
    assert set(metrics) == set(ref_metrics)
    for key, value in ref_metrics.items():
        np.testing.assert_allclose(float(metrics[key]), value, rtol=RTOL, atol=ATOL, err_msg=key)
    assert set(d_outputs) == set(ref_grads)
    for key, value in ref_grads.items():
        np.testing.assert_allclose(np.asarray(d_outputs[key]), value, rtol=RTOL, atol=ATOL, err_msg=f"d {key}")
    if log_scale is not None:
        np.testing.assert_allclose(float(d_params["log_logit_scale"]), ref_d_log_scale, rtol=RTOL, atol=ATOL)
    else:
        assert d_params == {}
    return num_masked


# ----------------------------------------------------------------------------- tests

# (num_negatives, options): None = no negatives, 0 = one negative given as [B, D], K = [B, K, D].
IN_BATCH_CASES = [
    (None, {}),
    (0, {}),
    (0, {"logit_scale": 5.0}),
    (1, {"learn_logit_scale": True, "logit_scale": 10.0}),
    (3, {"learn_logit_scale": True, "logit_scale": 3.0, "margin": 0.3}),
    (2, {"margin": 0.2, "logit_scale": 2.0, "mask_duplicates": False}),
]


@pytest.mark.parametrize("num_negatives,options", IN_BATCH_CASES)
def test_in_batch_softmax_matches_numpy(num_negatives, options):
    outputs, batch = make_batch(6, num_negatives, seed=1)
    result = run_loss("in_batch_softmax", outputs, batch, options)
    num_masked = assert_matches_reference("in_batch_softmax", outputs, batch, options, *result)
    # The planted duplicates really are masked (or deliberately not).
    if options.get("mask_duplicates", True):
        assert num_masked == (2 if num_negatives is None else 4)
    else:
        assert num_masked == 0


def test_duplicate_masking_changes_the_loss():
    """Masked and unmasked losses differ on a batch with planted duplicates, and agree without them."""
    for duplicates, expect_equal in ((True, False), (False, True)):
        outputs, batch = make_batch(6, 1, seed=2, duplicates=duplicates)
        masked = float(run_loss("in_batch_softmax", outputs, batch, {"logit_scale": 2.0})[0])
        options = {"logit_scale": 2.0, "mask_duplicates": False}
        unmasked = float(run_loss("in_batch_softmax", outputs, batch, options)[0])
        assert np.isclose(masked, unmasked, rtol=1e-6) == expect_equal
    # Identical gold texts mask each other: a row's loss cannot count its twin as a negative.
    outputs, batch = make_batch(4, None, seed=3)
    outputs["positive"][3] = outputs["positive"][0]
    _, metrics, *_ = run_loss("in_batch_softmax", outputs, batch, {})
    assert float(metrics["loss"]) < float(run_loss("in_batch_softmax", outputs, batch, {"mask_duplicates": False})[0])


def test_large_logit_scale_stays_finite():
    outputs, batch = make_batch(6, 1, seed=4)
    options = {"logit_scale": 300.0}
    loss, metrics, d_outputs, _, _ = run_loss("in_batch_softmax", outputs, batch, options)
    ref_metrics, ref_grads, _, _ = numpy_loss("in_batch_softmax", outputs, batch, options)
    assert np.isfinite(float(loss)) and all(np.isfinite(np.asarray(g)).all() for g in d_outputs.values())
    np.testing.assert_allclose(float(loss), ref_metrics["loss"], rtol=1e-4, atol=1e-3)


PER_EXAMPLE_CASES = [
    (0, {}),
    (1, {"logit_scale": 4.0}),
    (3, {"learn_logit_scale": True, "logit_scale": 5.0, "margin": 0.25}),
    (3, {"logit_scale": 2.0, "mask_duplicates": False}),
]


@pytest.mark.parametrize("num_negatives,options", PER_EXAMPLE_CASES)
def test_per_example_softmax_matches_numpy(num_negatives, options):
    outputs, batch = make_batch(6, num_negatives, seed=5)
    result = run_loss("per_example_softmax", outputs, batch, options)
    num_masked = assert_matches_reference("per_example_softmax", outputs, batch, options, *result)
    # Only example 2's copy of its own gold is a duplicate within its own list.
    assert num_masked == (1 if options.get("mask_duplicates", True) else 0)


def test_per_example_loss_is_a_mean_of_independent_terms():
    """Splitting the batch and averaging gives the full-batch loss (what gradient accumulation relies on)."""
    outputs, batch = make_batch(8, 2, seed=6)
    full = float(run_loss("per_example_softmax", outputs, batch, {})[0])
    halves = []
    for part in (slice(0, 4), slice(4, 8)):
        sub_out = {k: v[part] for k, v in outputs.items()}
        sub_batch = {k: v[part] for k, v in batch.items()}
        halves.append(float(run_loss("per_example_softmax", sub_out, sub_batch, {})[0]))
    np.testing.assert_allclose(np.mean(halves), full, rtol=RTOL)
    expected = {"in_batch_softmax": True, "per_example_softmax": False, "listwise_softmax": False}
    assert {k: losses.needs_full_batch(k) for k in expected} == expected
    # Every list loss is per query: accumulation never drops negatives there.
    assert not any(losses.needs_full_batch(k) for k in losses.LOSS_SPECS if k not in expected)
    assert losses.needs_full_batch("no such loss")  # unknown names count as cross-example


@pytest.mark.parametrize("name", ["in_batch_softmax", "per_example_softmax"])
@pytest.mark.parametrize("data,model", [(8, 1), (4, 2)])
def test_sharded_loss_uses_global_batch(name, data, model):
    """Batch sharded over `data` gives the numpy global-batch values, not shard-local ones."""
    mesh = partitioning.make_mesh(data, model)
    batch_sharding = NamedSharding(mesh, PartitionSpec("data"))
    options = {"learn_logit_scale": True, "logit_scale": 4.0, "margin": 0.1}
    # B=16 on 8 shards: 2 rows per shard, so shard-local labels would point at wrong columns;
    # the planted duplicates (rows 0 and 15, negative 1 vs gold 14) span shards.
    outputs, batch = make_batch(16, 2, seed=7)
    placed_outputs = jax.device_put(outputs, batch_sharding)
    placed_batch = jax.device_put(batch, batch_sharding)
    shardings = (batch_sharding, batch_sharding, partitioning.replicated(mesh))
    result = run_loss(name, placed_outputs, placed_batch, options, shardings=shardings)
    assert placed_outputs["query"].sharding.spec == PartitionSpec("data")
    assert_matches_reference(name, outputs, batch, options, *result)

    # The same numbers as the unsharded computation.
    unsharded = run_loss(name, outputs, batch, options)
    np.testing.assert_allclose(float(result[0]), float(unsharded[0]), rtol=RTOL)
    for key in unsharded[2]:
        np.testing.assert_allclose(np.asarray(result[2][key]), np.asarray(unsharded[2][key]), rtol=RTOL, atol=ATOL)

    if name == "in_batch_softmax":
        # Sanity: shard-local labels (row r of each shard -> column r) would give a very different loss.
        cands, _ = candidates_and_texts(outputs, batch)
        logits = 4.0 * (outputs["query"].astype(np.float64) @ cands.T)
        local = np.arange(16) % (16 // data)
        wrong = np.mean(np.log(np.exp(logits).sum(1)) - logits[np.arange(16), local])
        assert abs(wrong - float(result[0])) > 0.1


def test_fingerprints_ignore_padding_and_separate_texts():
    fingerprints = jax.jit(contrastive.token_fingerprints)
    ids = np.array(
        [
            [5, 9, 2, 0, 0, 0, 0],
            [5, 9, 2, 0, 0, 0, 0],
            [5, 9, 2, 7, 0, 0, 0],  # prefix-extension of row 0
            [9, 5, 2, 0, 0, 0, 0],  # permutation of row 0
            [5, 9, 3, 0, 0, 0, 0],
            [1, 0, 0, 0, 0, 0, 0],
            [0, 0, 0, 0, 0, 0, 0],
        ],
        np.int32,
    )
    fp = np.asarray(fingerprints(ids))
    assert fp.shape == (7, 2) and fp.dtype == np.int32
    short = np.asarray(fingerprints(ids[:, :4]))
    longer = np.asarray(fingerprints(np.pad(ids, ((0, 0), (0, 9)))))
    np.testing.assert_array_equal(fp, short)  # same texts, different padding lengths
    np.testing.assert_array_equal(fp, longer)
    assert (fp[0] == fp[1]).all()
    distinct = [tuple(r) for r in fp[1:]]
    assert len(set(distinct)) == len(distinct)
    # Many random distinct texts: no collisions, and the two hashes are not copies of each other.
    rng = np.random.RandomState(0)
    many = rng.randint(1, 32000, (2000, 16)).astype(np.int32)
    many[np.arange(16)[None, :] >= rng.randint(1, 17, (2000, 1))] = 0  # right padding, random lengths
    many_fp = np.asarray(fingerprints(many))
    assert len({tuple(r) for r in many_fp}) == len({text(r) for r in many})
    assert not (many_fp[:, 0] == many_fp[:, 1]).any()  # the two hashes are independent, not copies
    # Leading batch axes are kept: [B, K, L] -> [B, K, 2].
    assert fingerprints(np.stack([ids, ids])).shape == (2, 7, 2)


def test_registry_and_errors():
    assert losses.get_loss("in_batch_softmax") is contrastive.in_batch_softmax_loss
    with pytest.raises(RankgenError, match="in_batch_softmax.*per_example_softmax"):
        losses.get_loss("listmle_typo")
    assert losses.init_loss_params("in_batch_softmax", logit_scale=20.0) == {}
    params = losses.init_loss_params("per_example_softmax", learn_logit_scale=True, logit_scale=20.0)
    np.testing.assert_allclose(float(params["log_logit_scale"]), np.log(20.0), rtol=1e-7)
    with pytest.raises(RankgenError, match="unknown options"):
        losses.init_loss_params("in_batch_softmax", logit_scal=20.0)
    with pytest.raises(RankgenError, match="positive"):
        losses.init_loss_params("in_batch_softmax", learn_logit_scale=True, logit_scale=0.0)
    # Configuration errors surface at trace time (eval_shape traces without running).
    outputs, batch = make_batch(4, None, seed=8)
    with pytest.raises(RankgenError, match="needs outputs\\['negative'\\]"):
        jax.eval_shape(contrastive.per_example_softmax_loss, outputs, batch, {})
    with pytest.raises(RankgenError, match="log_logit_scale"):
        jax.eval_shape(functools.partial(contrastive.in_batch_softmax_loss, learn_logit_scale=True), outputs, batch, {})
    with pytest.raises(RankgenError, match="positive_ids"):
        jax.eval_shape(contrastive.in_batch_softmax_loss, outputs, {}, {})
    # Without masking, ids are not needed at all.
    loss, _ = jax.jit(functools.partial(contrastive.in_batch_softmax_loss, mask_duplicates=False))(outputs, {}, {})
    assert np.isfinite(float(loss))


def _numpy_listwise(scores, labels, mask, temperature):
    losses, hits = [], []
    for s, y, m in zip(scores.astype(np.float64), labels.astype(np.float64), mask):
        y = np.where(m, np.maximum(y, 0), 0)
        if y.sum() <= 0:
            continue
        z = s[m] / temperature
        log_p = z - np.log(np.exp(z - z.max()).sum()) - z.max()
        losses.append(-(y[m] / y.sum() * log_p).sum())
        hits.append(y[m][np.argmax(s[m])] == y.max())
    return float(np.mean(losses)), float(np.mean(hits))


def test_listwise_softmax_matches_numpy():
    rng = np.random.RandomState(7)
    scores = rng.randn(5, 6).astype(np.float32) * 3
    labels = np.zeros((5, 6), np.float32)
    labels[np.arange(5), rng.randint(0, 4, 5)] = 1.0
    labels[2] = [3, 2, 0, 1, 0, 0]  # graded
    labels[4] = 0.0  # no positive: left out of the mean
    mask = np.ones((5, 6), bool)
    mask[1, 4:] = False
    mask[3, 5] = False
    for temperature in (1.0, 0.5):
        loss, metrics = jax.jit(
            lambda s, b: losses.get_loss("listwise_softmax")({"scores": s}, b, {}, temperature=temperature)
        )(scores, {"labels": labels, "candidate_mask": mask})
        want_loss, want_acc = _numpy_listwise(scores, labels, mask, temperature)
        np.testing.assert_allclose(float(loss), want_loss, rtol=1e-5)
        np.testing.assert_allclose(float(metrics["accuracy"]), want_acc, rtol=1e-6)
    # Gradient: softmax minus the normalised labels, over real candidates of rows with a positive.
    grad = jax.grad(lambda s: losses.get_loss("listwise_softmax")({"scores": s}, {"labels": labels, "candidate_mask": mask}, {})[0])(scores)
    want = np.zeros_like(scores, dtype=np.float64)
    rows = [r for r in range(5) if labels[r][mask[r]].sum() > 0]
    for r in rows:
        m = mask[r]
        z = scores[r][m].astype(np.float64)
        p = np.exp(z - z.max()) / np.exp(z - z.max()).sum()
        want[r, m] = (p - labels[r][m] / labels[r][m].sum()) / len(rows)
    np.testing.assert_allclose(np.asarray(grad), want, atol=1e-6)

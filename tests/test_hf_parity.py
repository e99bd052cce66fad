"""The Flax T5 encoder against HuggingFace's PyTorch implementation, through the import path real checkpoints use."""

import numpy as np
import pytest
import torch
from transformers import AutoModel, T5Config as HFT5Config, T5EncoderModel

from rankgen_jax.checkpoints.hf.t5 import load_hf_folder, save_hf_folder
from rankgen_jax.models.configs import HeadConfig, ModelConfig
from rankgen_jax.models.factory import build_model, init_params
from rankgen_jax.models.heads import pool
from rankgen_jax.models.t5 import T5Encoder

TOL = 1e-4

HF_CONFIGS = {
    "t5_1_0": dict(d_model=32, d_ff=64, num_layers=2, num_heads=4, d_kv=8, feed_forward_proj="relu"),
    "t5_1_1": dict(d_model=48, d_ff=80, num_layers=3, num_heads=6, d_kv=8, feed_forward_proj="gated-gelu"),
    "t5_1_1_odd_relpos": dict(
        d_model=40, d_ff=56, num_layers=2, num_heads=5, d_kv=12, feed_forward_proj="gated-gelu",
        relative_attention_num_buckets=16, relative_attention_max_distance=20,
    ),
}


def _ids(batch, length, seed, vocab=100):
    rng = np.random.RandomState(seed)
    ids = rng.randint(3, vocab, (batch, length)).astype(np.int32)
    for row in range(1, batch):  # every row but the first is padded from a random point
        ids[row, rng.randint(1, length):] = 0
    return ids


def _save_random_hf(tmp_path, name, **kw):
    torch.manual_seed(0)
    config = HFT5Config(vocab_size=100, dropout_rate=0.0, **kw)
    model = T5EncoderModel(config).eval()
    # HF's init leaves the norms at 1: perturb them so parity really tests them.
    with torch.no_grad():
        for n, p in model.named_parameters():
            if "layer_norm" in n:
                p.add_(0.1 * torch.randn_like(p))
    folder = tmp_path / name
    model.save_pretrained(folder, safe_serialization=True)
    return model, folder


def _torch_hidden(model, ids):
    with torch.no_grad():
        out = model(
            input_ids=torch.from_numpy(ids).long(),
            attention_mask=torch.from_numpy(ids != 0).long(),
            output_hidden_states=True,
        )
    return out.last_hidden_state.numpy(), [h.numpy() for h in out.hidden_states]


@pytest.mark.parametrize("name", sorted(HF_CONFIGS))
def test_encoder_matches_hf_pytorch(tmp_path, name):
    torch_model, folder = _save_random_hf(tmp_path, name, **HF_CONFIGS[name])
    model_config, params, _ = load_hf_folder(str(folder))
    assert model_config.head is None
    encoder = T5Encoder(model_config.encoder)
    worst = 0.0
    for batch, length, seed in [(3, 13, 0), (2, 40, 1)]:
        ids = _ids(batch, length, seed)
        expected_last, expected_states = _torch_hidden(torch_model, ids)
        out = encoder.apply({"params": params}, ids, output_hidden_states=True)
        assert len(out.hidden_states) == len(expected_states)
        for got, want in zip(out.hidden_states, expected_states):
            np.testing.assert_allclose(np.asarray(got), want, atol=TOL, rtol=0)
        diff = np.abs(np.asarray(out.last_hidden_state) - expected_last).max()
        assert diff < TOL
        worst = max(worst, diff)
    print(f"\nparity {name}: max abs diff of last hidden states {worst:.2e}")


@pytest.mark.parametrize(
    "head", [HeadConfig("first", -1, False), HeadConfig("mean", 24, True), HeadConfig("first_last_avg", 0, False),
             HeadConfig("last2_avg", -1, True)],
    ids=["rankgen", "st5_proj24", "first_last_avg_noproj", "last2_avg_l2"],
)
def test_rankgen_format_vectors_match(tmp_path, head):
    base, _ = _save_random_hf(tmp_path, "base", **HF_CONFIGS["t5_1_1"])
    model_config, params, _ = load_hf_folder(str(tmp_path / "base"))
    dual_config = ModelConfig(encoder=model_config.encoder, head=head)
    if head.projection_dim != 0:
        params = {**params, "projection_layer": init_params(dual_config, seed=3)["projection_layer"]}
    save_hf_folder(dual_config, params, str(tmp_path / "rankgen"), fmt="rankgen")
    hf_model = AutoModel.from_pretrained(str(tmp_path / "rankgen"), trust_remote_code=True).eval()
    ids = _ids(4, 17, 5)
    jax_vectors = np.asarray(build_model(dual_config).apply({"params": params}, ids))
    with torch.no_grad():
        torch_vectors = hf_model(
            input_ids=torch.from_numpy(ids).long(), attention_mask=torch.from_numpy(ids != 0).long()
        ).numpy()
    diff = np.abs(jax_vectors - torch_vectors).max()
    print(f"\nparity rankgen-format {head}: max abs diff of vectors {diff:.2e}")
    assert jax_vectors.shape == torch_vectors.shape == (4, head.output_dim(model_config.encoder.d_model))
    assert diff < TOL
    # And independently of our modeling file: plain T5EncoderModel + the pooling by hand.
    last, states = _torch_hidden(base, ids)
    if head.pooling == "first":
        manual = last[:, 0]
        if head.projection_dim != 0:
            manual = manual @ params["projection_layer"]["kernel"]
        np.testing.assert_allclose(jax_vectors, manual, atol=TOL, rtol=0)


def test_pool_first_last_avg_matches_numpy():
    from rankgen_jax.models.t5 import EncoderOutput

    rng = np.random.RandomState(0)
    states = [rng.randn(2, 5, 3).astype(np.float32) for _ in range(3)]
    mask = np.array([[1, 1, 1, 0, 0], [1, 1, 1, 1, 1]], bool)
    out = EncoderOutput(states[-1], tuple(states))
    for pooling, pair in [("first_last_avg", (0, 2)), ("last2_avg", (1, 2))]:
        avg = (states[pair[0]] + states[pair[1]]) / 2
        want = np.stack([avg[0, :3].mean(0), avg[1].mean(0)])
        np.testing.assert_allclose(np.asarray(pool(out, mask, pooling)), want, atol=1e-6)
    np.testing.assert_allclose(np.asarray(pool(out, mask, "first")), states[-1][:, 0], atol=0)

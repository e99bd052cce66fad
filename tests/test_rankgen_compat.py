"""The released `rankgen` package's face of RankGenEncoder: encode(inputs, vectors_type=..., return_input_ids=...)
returning {"embeddings", "input_ids"} as the released class computes them (checked against transformers running the
released-format folder), and the documented released usage (docs/inference.md) running as written."""

import re
from pathlib import Path

import numpy as np
import pytest
from test_encoder_api import ONE_DEVICE, TEXTS, folders  # noqa: F401 (folders is a fixture)

from rankgen_jax.errors import RankgenError
from rankgen_jax.inference.api import RELEASED_BATCH_SIZE, RankGenEncoder

INFERENCE_PAGE = Path(__file__).resolve().parents[1] / "docs" / "inference.md"


@pytest.fixture(scope="module")
def released_class(folders):  # noqa: F811 (the fixture above)
    """What the released RankGenEncoder.encode does, with transformers on the released-format folder: marker,
    batches of max_batch_size padded to their longest text, every tensor sliced to 512 / 128 columns."""
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    tokenizer = transformers.AutoTokenizer.from_pretrained(folders["released"])
    model = transformers.AutoModel.from_pretrained(folders["released"], trust_remote_code=True).eval()

    def encode(inputs, vectors_type, max_batch_size):
        marker, limit = ("pre ", 512) if vectors_type == "prefix" else ("suffi ", 128)
        texts = [marker + text for text in ([inputs] if isinstance(inputs, str) else inputs)]
        embeddings, input_ids = [], []
        for start in range(0, len(texts), max_batch_size):
            batch = tokenizer(texts[start : start + max_batch_size], return_tensors="pt", padding=True)
            batch = {name: tensor[:, :limit] for name, tensor in batch.items()}
            with torch.inference_mode():
                embeddings.append(model(**batch))
            input_ids.extend(batch["input_ids"].tolist())
        return torch.cat(embeddings).numpy(), input_ids

    return encode


@pytest.mark.parametrize("batch_size", [None, 4])
def test_released_form_matches_the_released_computation(folders, released_class, batch_size):  # noqa: F811
    # max_batch_size: the released constructor's name for batch_size.
    encoder = RankGenEncoder(folders["released"], devices=ONE_DEVICE, max_batch_size=batch_size)
    for vectors_type in ("prefix", "suffix"):
        out = encoder.encode(TEXTS, vectors_type=vectors_type, return_input_ids=True)
        want, want_ids = released_class(TEXTS, vectors_type, batch_size or RELEASED_BATCH_SIZE)
        assert set(out) == {"embeddings", "input_ids"}
        # Rows padded to the longest of their batch, the long text cut at the limit without its EOS.
        assert out["input_ids"] == want_ids
        assert isinstance(out["embeddings"], np.ndarray) and out["embeddings"].dtype == np.float32
        np.testing.assert_allclose(out["embeddings"], want, atol=2e-5, rtol=1e-5, err_msg=vectors_type)
        # Today's form gives the same vectors as a plain array.
        np.testing.assert_allclose(encoder.encode(TEXTS, vectors_type), out["embeddings"], atol=1e-6)
    lengths = {len(row) for row in encoder.encode(TEXTS, vectors_type="suffix", return_input_ids=True)["input_ids"]}
    assert lengths == ({128} if batch_size is None else {128, max(len(r) for r in want_ids[4:])})


def test_released_form_strings_torch_and_bad_input(folders, released_class, capsys):  # noqa: F811
    torch = pytest.importorskip("torch")
    encoder = RankGenEncoder(folders["released"], devices=ONE_DEVICE)
    one = encoder.encode(TEXTS[0])  # a string, vectors_type "prefix" by default
    want, want_ids = released_class(TEXTS[0], "prefix", RELEASED_BATCH_SIZE)
    assert one["embeddings"].shape == (1, 32) and one["input_ids"] == []
    np.testing.assert_allclose(one["embeddings"], want, atol=2e-5, rtol=1e-5)
    as_torch = encoder.encode([TEXTS[0]], vectors_type="prefix", verbose=True, return_input_ids=True,
                              return_tensors="pt")
    assert isinstance(as_torch["embeddings"], torch.Tensor) and as_torch["embeddings"].dtype == torch.float32
    np.testing.assert_allclose(as_torch["embeddings"].numpy(), want, atol=2e-5, rtol=1e-5)
    assert as_torch["input_ids"] == want_ids
    assert "encode prefix" in capsys.readouterr().err  # verbose: a progress bar
    with pytest.raises(RankgenError, match="vectors_type must be 'prefix' or 'suffix'"):
        encoder.encode(TEXTS, vectors_type="query")
    with pytest.raises(RankgenError, match="return_tensors must be one of"):
        encoder.encode(TEXTS, vectors_type="prefix", return_tensors="tf")
    with pytest.raises(RankgenError, match="not both"):
        encoder.encode(TEXTS, "prefix", vectors_type="suffix")
    with pytest.raises(RankgenError, match="max_length and progress belong to encode"):
        encoder.encode(TEXTS, vectors_type="prefix", max_length=32)
    with pytest.raises(RankgenError, match=r"encode inputs\[1\]: expected a string"):
        encoder.encode(["a", 3], vectors_type="prefix")
    with pytest.raises(RankgenError, match="the released form"):
        encoder.encode(TEXTS[0], "prefix")


def test_released_constructor_names(folders):  # noqa: F811
    with pytest.raises(RankgenError, match="batch_size=4 and max_batch_size=8 disagree"):
        RankGenEncoder(folders["released"], devices=ONE_DEVICE, batch_size=4, max_batch_size=8)
    with pytest.raises(RankgenError, match=r"model_size must be one of \['base', 'large', 'xl'\]"):
        RankGenEncoder(folders["released"], devices=ONE_DEVICE, model_size="small")
    with pytest.raises(RankgenError, match="model_size='xl' means d_model 2048, but this model has d_model 32"):
        RankGenEncoder(folders["released"], devices=ONE_DEVICE, model_size="xl")
    assert RankGenEncoder(folders["released"], devices=ONE_DEVICE, max_batch_size=4).batch_size == 4


def test_documented_released_usage_runs_as_written(folders):  # noqa: F811
    section = INFERENCE_PAGE.read_text(encoding="utf-8").split("### The released `rankgen` API", 1)[1]
    block = re.search(r"\n\n((?:    .*\n|\n)+?)\n(?! )", section).group(1)
    code = "\n".join(line[4:] for line in block.splitlines())
    assert 'RankGenEncoder("path/to/rankgen-t5-xl-all")' in code and "from rankgen_jax import" in code
    scope = {}
    exec(code.replace("path/to/rankgen-t5-xl-all", folders["released"]), scope)
    assert scope["prefix_vectors"]["embeddings"].shape == (1, 32) and scope["scores"].shape == (1, 1)
    encoder = RankGenEncoder(folders["released"], devices=ONE_DEVICE)
    want = encoder.encode(["This is a prefix sentence."], "prefix") @ encoder.encode(
        ["This is a suffix sentence."], "suffix").T
    np.testing.assert_allclose(scope["scores"], want, rtol=1e-5, atol=1e-6)


def test_documented_generator_usage_runs_with_the_documented_offline_lm(folders, tmp_path):  # noqa: F811
    """The page's generator block, with the causal LM its next block says how to make offline."""
    pytest.importorskip("torch")
    section = INFERENCE_PAGE.read_text(encoding="utf-8").split("The generator, over any local HF causal LM", 1)[1]
    # An indented block may hold blank lines between its indented ones.
    blocks = re.findall(r"\n\n((?:    .*\n)(?:    .*\n|\n(?=    ))*)", section)
    generator_code = "\n".join(line[4:] for line in blocks[0].splitlines())
    lm_command = blocks[1].strip()
    assert "RankGenGenerator(rankgen_encoder, \"path/to/causal_lm\")" in generator_code
    assert lm_command.startswith('python -c "') and "build_tiny_gpt2('tiny_gpt2')" in lm_command
    lm_code = lm_command[len('python -c "'):-1].replace("'tiny_gpt2'", repr(str(tmp_path / "tiny_gpt2")))
    scope = {}
    exec(lm_code.replace("print(", "lm_dir = ("), scope)
    scope["rankgen_encoder"] = RankGenEncoder(folders["released"], devices=ONE_DEVICE)
    exec(generator_code.replace("path/to/causal_lm", scope["lm_dir"]), scope)
    texts, scores = scope["texts"], scope["scores"]
    assert len(texts) == len(scores) == 1 and 1 <= len(texts[0]) <= 2 and all(isinstance(t, str) for t in texts[0])
    assert np.all(np.isfinite(scores[0])) and list(scores[0]) == sorted(scores[0], reverse=True)

"""`rankgen-jax import` / `export-hf` end to end: bit-exact round trips, the T5X fixture in PyTorch, clear errors."""

import json
import os
import shutil
import stat
import subprocess
import sys

import numpy as np
import pytest
import torch
from safetensors.numpy import load_file
from transformers import AutoModel, T5Config as HFT5Config, T5EncoderModel

from conftest import T5X_FIXTURE
from rankgen_jax.checkpoints import native
from rankgen_jax.checkpoints.convert import describe_model, export_layout
from rankgen_jax.checkpoints.hf.t5 import save_hf_folder
from rankgen_jax.cli.main import main
from rankgen_jax.models.configs import BertConfig, HeadConfig, ModelConfig, t5_config
from rankgen_jax.models.factory import build_model, init_params
from rankgen_jax.models.t5 import T5Encoder

TOL = 1e-4


def run_cli(capsys, *args):
    code = main([str(a) for a in args])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def assert_one_line_error(code, err, *fragments):
    assert code == 2
    lines = [l for l in err.strip().splitlines() if l.startswith("error:")]
    assert len(lines) == 1, err
    for fragment in fragments:
        assert fragment in lines[0], lines[0]


def assert_same_tensors(folder_a, folder_b):
    a, b = load_file(str(folder_a / "model.safetensors")), load_file(str(folder_b / "model.safetensors"))
    assert sorted(a) == sorted(b)
    for key in a:
        assert a[key].dtype == b[key].dtype and np.array_equal(a[key], b[key]), key


@pytest.fixture(scope="module")
def hf_t5_folder(tmp_path_factory, spiece_model):
    torch.manual_seed(0)
    model = T5EncoderModel(HFT5Config(vocab_size=1024, d_model=32, d_ff=48, num_layers=2, num_heads=4, d_kv=8,
                                      feed_forward_proj="gated-gelu"))
    folder = tmp_path_factory.mktemp("hf") / "t5"
    model.save_pretrained(folder, safe_serialization=True)
    shutil.copyfile(spiece_model, folder / "spiece.model")
    return folder


def test_help_lists_subcommands(capsys):
    with pytest.raises(SystemExit) as e:
        main(["--help"])
    assert e.value.code == 0
    out = capsys.readouterr().out
    assert "import" in out and "export-hf" in out
    for sub in ("import", "export-hf"):
        with pytest.raises(SystemExit) as e:
            main([sub, "--help"])
        assert e.value.code == 0 and "--out" in capsys.readouterr().out


def test_help_lists_every_command_in_order(capsys):
    with pytest.raises(SystemExit):
        main(["--help"])
    commands = [line.split()[0] for line in capsys.readouterr().out.splitlines()
                if line.startswith("    ") and not line.startswith("     ")]
    assert commands == ["import", "export-hf", "train", "score", "split-data", "generate-negatives",
                        "merge-negatives", "cache-tasks", "books-beir", "pipeline", "cl-drd", "distillation-demo",
                        "retrieval-example",
                        "recipe-example", "demo-curve", "index", "search", "bm25", "evaluate", "mine-negatives",
                        "suffix-negatives", "suffix-benchmark", "score-candidates", "encode", "generate",
                        "generation-metrics", "generation-sweep", "sweep", "report", "perspectives", "mpts",
                        "negatives-claim", "generation-claim", "compile", "smoke"]


def test_hf_import_export_is_bit_exact(tmp_path, capsys, hf_t5_folder):
    code, out, err = run_cli(capsys, "import", "--from", "hf", "--path", hf_t5_folder, "--out", tmp_path / "ckpt")
    assert code == 0, err
    assert out.startswith("imported a T5 encoder (2 layers, d_model 32) to ")
    assert native.spiece_path(tmp_path / "ckpt") is not None
    code, out, err = run_cli(capsys, "export-hf", "--checkpoint", tmp_path / "ckpt", "--out", tmp_path / "hf",
                             "--format", "t5-encoder")
    assert code == 0, err
    assert out.rstrip().endswith("(T5EncoderModel)")
    assert_same_tensors(hf_t5_folder, tmp_path / "hf")
    assert (tmp_path / "hf" / "spiece.model").read_bytes() == (hf_t5_folder / "spiece.model").read_bytes()
    # A bare encoder has no head to write in the RankGen format.
    code, _, err = run_cli(capsys, "export-hf", "--checkpoint", tmp_path / "ckpt", "--out", tmp_path / "rg")
    assert_one_line_error(code, err, "export it with --format t5-encoder")


T5_TINY = t5_config("tiny", vocab_size=64)
BERT_TINY = BertConfig(vocab_size=64, d_model=32, d_ff=64, num_layers=2, num_heads=4)


@pytest.mark.parametrize("config,fmt,model,layout", [
    (ModelConfig(encoder=T5_TINY, head=None), "t5-encoder", "T5 encoder (2 layers, d_model 128)", "T5EncoderModel"),
    (ModelConfig(encoder=T5_TINY), "rankgen", "T5 dual encoder (2 layers, d_model 128)",
     "RankGen format, modeling_rankgen.py"),
    (ModelConfig(encoder=T5_TINY), "t5-encoder", "T5 dual encoder", "T5EncoderModel with sentence-transformers files"),
    (ModelConfig(encoder=T5_TINY, head=HeadConfig(pooling="last2_avg")), "t5-encoder", "T5 dual encoder",
     "T5EncoderModel, the encoder alone"),
    (ModelConfig(encoder=BERT_TINY, shared_towers=False), "rankgen", "BERT-family dual encoder",
     "BERT-family model with sentence-transformers files; a sentence-transformers Router, one route per tower "
     "(query_0_Transformer/, document_0_Transformer/)"),
    (ModelConfig(encoder=T5_TINY, shared_towers=False), "rankgen",
     "T5 dual encoder (2 layers, d_model 128, separate query and document towers)",
     "RankGen format, modeling_rankgen.py; one folder per tower, query_encoder/ and document_encoder/"),
    (ModelConfig(encoder=T5_TINY, kind="cross_encoder"), "rankgen", "T5 cross encoder (ranker) (2 layers",
     "ranker format, modeling_ranker.py"),
    (ModelConfig(encoder=T5_TINY, kind="cross_encoder"), "t5-encoder", "T5 cross encoder (ranker)",
     "T5EncoderModel, the encoder alone"),
    (ModelConfig(encoder=BERT_TINY), "rankgen", "BERT-family dual encoder (2 layers, d_model 32)",
     "BERT-family model with sentence-transformers files"),
    (ModelConfig(encoder=BERT_TINY, kind="cross_encoder"), "t5-encoder", "BERT-family cross encoder (ranker)",
     "ranker format, modeling_ranker.py"),
])
def test_import_and_export_messages_name_what_was_written(config, fmt, model, layout):
    assert describe_model(config).startswith(model)
    assert export_layout(config, fmt) == layout


def test_rankgen_format_round_trip_and_autoload(tmp_path, capsys, spiece_model):
    config = ModelConfig(encoder=t5_config("tiny", vocab_size=1024), head=HeadConfig("first", -1, False))
    params = init_params(config, seed=4)
    save_hf_folder(config, params, str(tmp_path / "released"), fmt="rankgen", spiece_model=spiece_model)
    code, out, _ = run_cli(capsys, "import", "--from", "hf", "--path", tmp_path / "released", "--out", tmp_path / "ckpt")
    assert code == 0 and out.startswith("imported a T5 dual encoder (2 layers, d_model 128) to ")
    assert native.load_model_config(tmp_path / "ckpt") == config
    code, out, _ = run_cli(capsys, "export-hf", "--checkpoint", tmp_path / "ckpt", "--out", tmp_path / "again")
    assert code == 0 and out.rstrip().endswith("(RankGen format, modeling_rankgen.py)")
    assert_same_tensors(tmp_path / "released", tmp_path / "again")
    hf_config = json.loads((tmp_path / "again" / "config.json").read_text())
    assert hf_config["architectures"] == ["T5EncoderWithProjection"]
    assert hf_config["auto_map"]["AutoModel"] == "modeling_rankgen.T5EncoderWithProjection"
    ids = np.random.RandomState(0).randint(3, 1024, (3, 10)).astype(np.int32)
    ids[1, 4:] = 0
    hf_model = AutoModel.from_pretrained(str(tmp_path / "again"), trust_remote_code=True).eval()
    with torch.no_grad():
        got = hf_model(input_ids=torch.from_numpy(ids).long(), attention_mask=torch.from_numpy(ids != 0).long()).numpy()
    want = np.asarray(build_model(config).apply({"params": params}, ids))
    assert np.abs(got - want).max() < TOL


@pytest.fixture(scope="module")
def t5x_import(tmp_path_factory):
    out = tmp_path_factory.mktemp("t5x") / "ckpt"
    assert main(["import", "--from", "t5x", "--path", str(T5X_FIXTURE), "--out", str(out),
                 "--pooling", "mean", "--l2_normalize"]) == 0
    return out


def test_t5x_fixture_imports_runs_and_exports(tmp_path, capsys, t5x_import):
    config, params = native.restore_params(t5x_import)
    assert config.encoder.mlp_activation == "relu" and config.encoder.d_model == 4
    assert config.head == HeadConfig("mean", 768, True)
    ids = np.random.RandomState(1).randint(3, 32128, (4, 9)).astype(np.int32)
    ids[2, 5:] = 0
    jax_vectors = np.asarray(build_model(config).apply({"params": params}, ids))
    assert jax_vectors.shape == (4, 768) and np.allclose(np.linalg.norm(jax_vectors, axis=1), 1.0, atol=1e-5)

    assert run_cli(capsys, "export-hf", "--checkpoint", t5x_import, "--out", tmp_path / "rankgen")[0] == 0
    hf_model = AutoModel.from_pretrained(str(tmp_path / "rankgen"), trust_remote_code=True).eval()
    torch_ids, torch_mask = torch.from_numpy(ids).long(), torch.from_numpy(ids != 0).long()
    with torch.no_grad():
        torch_vectors = hf_model(input_ids=torch_ids, attention_mask=torch_mask).numpy()
    vec_diff = np.abs(torch_vectors - jax_vectors).max()

    assert run_cli(capsys, "export-hf", "--checkpoint", t5x_import, "--out", tmp_path / "enc",
                   "--format", "t5-encoder")[0] == 0
    encoder = T5EncoderModel.from_pretrained(str(tmp_path / "enc")).eval()
    with torch.no_grad():
        torch_hidden = encoder(input_ids=torch_ids, attention_mask=torch_mask).last_hidden_state.numpy()
    encoder_params = {k: v for k, v in params.items() if k != "projection_layer"}
    jax_hidden = np.asarray(T5Encoder(config.encoder).apply({"params": encoder_params}, ids).last_hidden_state)
    hidden_diff = np.abs(torch_hidden - jax_hidden).max()
    print(f"\nT5X fixture: max abs diff vectors {vec_diff:.2e}, hidden states {hidden_diff:.2e}")
    assert vec_diff < TOL and hidden_diff < TOL


def test_bad_inputs_give_one_line_errors(tmp_path, capsys, t5x_import, hf_t5_folder):
    missing = tmp_path / "nope"
    code, _, err = run_cli(capsys, "import", "--from", "hf", "--path", missing, "--out", tmp_path / "o1")
    assert_one_line_error(code, err, str(missing))
    (tmp_path / "empty").mkdir()
    code, _, err = run_cli(capsys, "import", "--from", "t5x", "--path", tmp_path / "empty", "--out", tmp_path / "o2")
    assert_one_line_error(code, err, "not a T5X checkpoint")
    code, _, err = run_cli(capsys, "import", "--from", "hf", "--path", tmp_path / "empty", "--out", tmp_path / "o3")
    assert_one_line_error(code, err, "config.json")
    code, _, err = run_cli(capsys, "export-hf", "--checkpoint", tmp_path / "empty", "--out", tmp_path / "o4")
    assert_one_line_error(code, err, "not a rankgen_jax checkpoint")

    gpt2 = tmp_path / "gpt2"
    gpt2.mkdir()
    (gpt2 / "config.json").write_text(json.dumps({"model_type": "gpt2", "architectures": ["GPT2LMHeadModel"]}))
    code, _, err = run_cli(capsys, "import", "--from", "hf", "--path", gpt2, "--out", tmp_path / "o5")
    assert_one_line_error(code, err, "GPT2")

    broken = tmp_path / "broken_t5x"
    shutil.copytree(T5X_FIXTURE, broken)
    for p in [broken, *broken.rglob("*")]:
        p.chmod(p.stat().st_mode | stat.S_IWUSR)
    shutil.rmtree(broken / "target.encoder.layers_1.mlp.wo.kernel")
    code, _, err = run_cli(capsys, "import", "--from", "t5x", "--path", broken, "--out", tmp_path / "o6")
    assert_one_line_error(code, err, "layers_1")

    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "keep.txt").write_text("x")
    code, _, err = run_cli(capsys, "export-hf", "--checkpoint", t5x_import, "--out", tmp_path / "full")
    assert_one_line_error(code, err, "not empty", "--overwrite")
    assert (tmp_path / "full" / "keep.txt").exists()
    code, _, err = run_cli(capsys, "import", "--from", "hf", "--path", hf_t5_folder, "--out", tmp_path / "full")
    assert_one_line_error(code, err, "not empty")

    # A checkpoint whose config says another model size than its parameters.
    wrong = tmp_path / "wrong_size"
    shutil.copytree(t5x_import, wrong)
    config = json.loads((wrong / "model_config.json").read_text())
    config["encoder"]["d_model"] = 8
    (wrong / "model_config.json").write_text(json.dumps(config))
    code, _, err = run_cli(capsys, "export-hf", "--checkpoint", wrong, "--out", tmp_path / "o7")
    assert_one_line_error(code, err, "do not fit", "model wants (8,)")


def test_console_script_exit_code(tmp_path):
    exe = shutil.which("rankgen-jax", path=str(__import__("pathlib").Path(sys.executable).parent))
    assert exe is not None
    proc = subprocess.run([exe, "import", "--from", "t5x", "--path", str(tmp_path / "missing"), "--out",
                           str(tmp_path / "o")], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines()[-1].startswith("error:") and "missing" in proc.stderr


def test_importing_the_cli_leaves_process_flags_alone():
    # The core sets no XLA flags (the CPU plug-in's launcher does, for its process); importing the CLI starts no jax.
    code = ("import os, sys\n"
            "import rankgen_jax.cli.main as cli\n"
            "print(os.environ.get('XLA_FLAGS'), 'jax' in sys.modules)\n"
            "cli.main(['report', 'no_such_workdir'])\n"
            "print(os.environ.get('XLA_FLAGS'))\n")
    env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
    proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines() == ["None False", "None"]
    assert proc.stderr.startswith("error: no_such_workdir: no results.json or metrics.jsonl")


def test_every_gin_command_says_how_to_bind_gin_settings(capsys):
    from rankgen_jax.cli.main import GIN_COMMANDS

    for command in GIN_COMMANDS:
        with pytest.raises(SystemExit):
            main([command, "--help"])
        assert "--gin.Name.param=value" in " ".join(capsys.readouterr().out.split()), command


def test_books_beir_writes_the_folder_on_its_own(tmp_path, capsys):
    """The books BEIR folder without training anything: the same files build_books_collection writes."""
    from rankgen_jax.data.beir_books import BooksCollectionConfig, build_books_collection
    from rankgen_jax.experiments.retrieval_example import bundled_books

    assert main(["books-beir", "--out", str(tmp_path / "cli"), "--passages_per_book", "5", "--dev_books", "1"]) == 0
    summary = json.loads(capsys.readouterr().out.splitlines()[-1])
    assert (summary["train_queries"], summary["dev_queries"], summary["test_queries"]) == (20, 5, 10)
    build_books_collection(bundled_books(), tmp_path / "lib", BooksCollectionConfig(passages_per_book=5, dev_books=1))
    for name in ("corpus.jsonl", "queries.jsonl", "qrels/train.tsv", "qrels/dev.tsv", "qrels/test.tsv"):
        assert (tmp_path / "cli" / name).read_bytes() == (tmp_path / "lib" / name).read_bytes(), name

"""Bad inputs: each gives one clear line (RankgenError; the CLI prints `error: ...` and exits 2, no
traceback) naming the file / line / field, or a counted skip that names the file.

Where each class of bad input is tested (this file holds the ones no other test covered):

| class                               | tests                                                                  |
|-------------------------------------|------------------------------------------------------------------------|
| missing file / folder               | test_documents::test_missing_path_is_a_clear_error,                    |
|                                     | test_cli::test_bad_inputs_give_one_line_errors (import),               |
|                                     | test_list_training::test_bad_records_are_skipped_and_counted,          |
|                                     | test_retrieval_files, test_dense_index::test_load_index_errors,        |
|                                     | test_inference::test_load_errors; here: test_unreadable_input_files    |
| empty file                          | test_documents::test_every_bad_input_is_skipped_and_counted,           |
|                                     | test_documents::test_require_documents_empty_folder; here: same test   |
| binary file                         | test_documents::test_every_bad_input_is_skipped_and_counted,           |
|                                     | test_documents::test_binary_jsonl_file; here: test_unreadable_input_files (score, encode, index, train lists) |
| non-UTF-8 file                      | test_documents (latin-1 .txt and bytes in .jsonl); here: same test     |
| too-short files / documents         | test_examples::test_short_documents_give_no_examples,                  |
|                                     | test_documents::test_require_documents_min_words,                      |
|                                     | test_seqio_tasks (too-short book); here: test_too_short_documents_for_training |
| malformed JSONL lines               | test_documents, test_retrieval_files (also TSV, qrels and run lines),  |
|                                     | test_list_training::test_bad_records_are_skipped_and_counted,          |
|                                     | test_evaluation::test_score_file_unigram_labelled_unlabelled_and_malformed, |
|                                     | test_encoder_api, test_generation, test_generative_negatives::test_bad_lines_are_counted_and_skipped |
| wrong field types in JSONL          | test_documents ({"text": 42}), test_retrieval_files (ids, titles),     |
|                                     | test_list_training (labels); here: test_wrong_field_types_are_counted  |
| gin typos                           | test_trainer::test_config_errors_are_clear (bindings, missing file);   |
|                                     | here: test_gin_typo_in_a_file_names_file_and_line                      |
| gin type errors / syntax            | here: test_gin_type_errors_name_the_field                              |
| checkpoint of another model size    | test_cli::test_bad_inputs_give_one_line_errors (export-hf: config and  |
|                                     | arrays disagree), test_fault_injection::test_no_restorable_checkpoint_... |
|                                     | (another optimizer); here: test_resume_with_another_model_size         |
| export-hf over a non-empty folder   | test_cli::test_bad_inputs_give_one_line_errors,                        |
|                                     | test_hf_convert::test_error_out_dir_not_empty                          |
| T5X checkpoint missing an array     | test_cli::test_bad_inputs_give_one_line_errors (real fixture),         |
|                                     | test_t5x_import::test_missing_array_folder_names_parameter,            |
|                                     | test_missing_chunk_names_parameter                                     |
| dense index built by another model  | here: test_search_with_another_model                                   |
| resume with other settings          | here: test_a_workdir_is_one_run_in_one_folder (model, data, loss:      |
|                                     | refused, nothing written; num_steps: resumed, noted),                  |
|                                     | test_fault_injection::test_no_restorable_checkpoint_... (optimizer)    |
| workdir via a symlink then `..`     | here: test_a_workdir_is_one_run_in_one_folder                          |
| workdir that is a file, or an       | here: test_a_workdir_that_is_not_a_run_is_refused                      |
| imported checkpoint                 |                                                                        |
| folder where a file belongs, output | here: test_paths_given_where_files_belong_get_errors                   |
| into a missing folder, pickle-only  |                                                                        |
| LM folder                           |                                                                        |
| unquoted gin string                 | here: test_gin_type_errors_name_the_field                              |
| skipped lines' reasons (score)      | here: test_wrong_field_types_are_counted; test_evaluation              |
| code planted in the working folder  | test_security::test_no_module_from_the_working_folder_runs             |
| metrics of replayed steps           | test_metrics_io::test_a_restart_step_sets_replayed_rows_aside_...,     |
|                                     | test_trainer::test_sigkill_then_resume_reproduces_losses               |
"""

import dataclasses
import json
import shutil
from pathlib import Path

import jax
import pytest

from rankgen_jax.checkpoints import native
from rankgen_jax.cli.main import in_flags, main
from rankgen_jax.errors import RankgenError
from rankgen_jax.models.configs import RANKGEN_HEAD, ModelConfig, T5Config
from rankgen_jax.testing import random_params

from test_trainer import TINY, TINY_MODEL

SMALL = ModelConfig(encoder=T5Config(vocab_size=1000, d_model=32, d_ff=64, num_layers=1, num_heads=2, d_kv=16),
                    head=RANKGEN_HEAD)
NARROW = ModelConfig(encoder=T5Config(vocab_size=1000, d_model=16, d_ff=32, num_layers=1, num_heads=2, d_kv=8),
                     head=RANKGEN_HEAD)


def run_cli(capsys, *args) -> tuple[int, str]:
    """(exit code, stderr); in process, main() lets anything but a RankgenError escape, so a crash fails here."""
    code = main([str(a) for a in args])
    return code, capsys.readouterr().err


def one_error_line(code: int, err: str) -> str:
    assert code == 2, err
    lines = [line for line in err.splitlines() if line.startswith("error:")]
    assert len(lines) == 1, err
    return lines[0]


@pytest.fixture(scope="module")
def models(tmp_path_factory, spiece_model) -> dict:
    """Tiny dual encoders with a tokenizer: two of one width (other weights), one narrower."""
    root = tmp_path_factory.mktemp("bad_inputs_models")
    out = {}
    for name, config, seed in (("a", SMALL, 1), ("a_other_weights", SMALL, 2), ("narrow", NARROW, 3)):
        native.save_params(root / name, config, random_params(config, seed), vocab=spiece_model)
        out[name] = root / name
    return out


# --- unreadable files, per command ----------------------------------------------------------------

CONTENTS = {
    "missing": None,
    "empty": b"",
    "binary": b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR\x00\x01\xff",
    "non_utf8": '{"text": "caf\u00e9 cr\u00e8me", "prefix": "caf\u00e9", "suffix": "cr\u00e8me"}\n'.encode("latin-1"),
}


def _command(name: str, path, tmp_path, models, spiece_model) -> list:
    if name == "score":
        return ["score", "--model", models["a"], "--input", path, "--output", tmp_path / "out.jsonl", "--no_progress"]
    if name == "encode":
        return ["encode", "--model", models["a"], "--input", path, "--side", "prefix", "--output", tmp_path / "o.npy"]
    if name == "index":
        return ["index", "--model", models["a"], "--corpus", path, "--out", tmp_path / "index"]
    return ["train", f"--workdir={tmp_path / 'run'}", *TINY_MODEL, "--gin.t5_config.vocab_size=1000",
            "--gin.DataConfig.source=@ListsData()", f"--gin.ListsData.vocab='{spiece_model}'",
            f"--gin.ListsData.train_file='{path}'", f"--gin.ListsData.eval_file='{path}'",
            "--gin.ListsData.continuation_length=8",
            "--gin.ModelConfig.kind='cross_encoder'", "--gin.LossConfig.name='listmle'"]


@pytest.mark.parametrize("content", list(CONTENTS))
@pytest.mark.parametrize("command", ["score", "encode", "index", "train_lists"])
def test_unreadable_input_files(tmp_path, capsys, models, spiece_model, command, content):
    path = tmp_path / f"{content}.jsonl"
    if CONTENTS[content] is not None:
        path.write_bytes(CONTENTS[content])
    code, err = run_cli(capsys, *_command(command, path, tmp_path, models, spiece_model))
    # Every command fails with one error line naming the file; `score` skips and counts the bad
    # lines first, then fails because nothing was left to score, leaving no empty output behind.
    line = one_error_line(code, err)
    assert str(path) in line
    if command == "score" and content != "missing":
        assert "nothing to score" in line and not (tmp_path / "out.jsonl").exists()
        assert ("skipped" in err) == (content != "empty"), err
    assert not (tmp_path / "run" / "checkpoints").exists()


def test_wrong_field_types_are_counted(tmp_path, capsys, models):
    path = tmp_path / "typed.jsonl"
    lines = [{"prefix": 42, "candidates": ["fine"]}, {"prefix": "fine", "candidates": "not a list"},
             {"prefix": "a prefix", "candidates": ["one", "two"], "label": 1},
             {"prefix": "p", "candidates": ["one", 2]}, {"prefix": "p", "candidates": ["x"], "label": "0"}]
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    code, err = run_cli(capsys, "score", "--model", models["a"], "--input", path, "--output", tmp_path / "o.jsonl",
                        "--no_progress")
    assert code == 0
    assert (f"note: skipped 4 line(s) of {path}: 1 no string prefix (line 1); 2 candidates not a non-empty list of "
            "strings (line 2, 4); 1 label not an index into the candidates (line 5)") in err
    assert len((tmp_path / "o.jsonl").read_text().splitlines()) == 1
    corpus = tmp_path / "corpus.jsonl"
    corpus.write_text(json.dumps({"id": "1", "text": ["not", "a", "string"]}) + "\n")
    line = one_error_line(*run_cli(capsys, "index", "--model", models["a"], "--corpus", corpus,
                                   "--out", tmp_path / "index"))
    assert f"{corpus}: no usable passage" in line and "1 missing or empty text (line 1)" in line


def test_too_short_documents_for_training(tmp_path, capsys, spiece_model):
    books = tmp_path / "books"
    books.mkdir()
    for name in ("a.txt", "b.txt"):
        (books / name).write_text("Too short to make an example.")
    line = one_error_line(*run_cli(
        capsys, "train", f"--workdir={tmp_path / 'run'}", *TINY_MODEL, "--gin.t5_config.vocab_size=1000",
        "--gin.DataConfig.source=@BooksData()", f"--gin.BooksData.corpus='{books}'",
        f"--gin.BooksData.vocab='{spiece_model}'"))
    assert str(books) in line and "long enough" in line


# --- gin ------------------------------------------------------------------------------------------


@pytest.mark.parametrize("binding,fragment", [
    ("TrainerConfig.num_steps='abc'", "TrainerConfig.num_steps = 'abc': expected int, got str"),
    ("DataConfig.batch_size=8.5", "DataConfig.batch_size = 8.5: expected int, got float"),
    ("DataConfig.batch_size=[8]", "DataConfig.batch_size = [8]: expected int, got list"),
    ("TrainerConfig.async_checkpoints='no'", "TrainerConfig.async_checkpoints = 'no': expected bool, got str"),
    ("OptimizerConfig.learning_rate='fast'", "OptimizerConfig.learning_rate = 'fast': expected float, got str"),
    ("LossConfig.logit_scale='x'", "LossConfig.logit_scale = 'x': expected float, got str"),
    ("t5_config.d_model='big'", "T5Config.d_model = 'big': expected int, got str"),
    ("RandomData.vocab_size='big'", "RandomData.vocab_size = 'big': expected int, got str"),
    ("TrainerConfig.num_steps=None", "TrainerConfig.num_steps = None: expected int"),
    ("TrainerConfig.log_every=0", "TrainerConfig.log_every must be >= 1, got 0"),
    ("TrainerConfig.checkpoint_every=0", "TrainerConfig.checkpoint_every must be >= 1, got 0"),
    ("TrainerConfig.encoder_overrides={'dropout': 0.0}", "encoder_overrides: unknown encoder field(s) ['dropout']"),
    ("TrainerConfig.num_steps=(3", "unclosed bracket or string in binding --gin.TrainerConfig.num_steps=(3"),
    ("DataConfig.batch_size=abc", "gin config: abc is not a value gin can read (binding --gin.DataConfig.batch_size=abc)"
                                  ": quote a string"),
])
def test_gin_type_errors_name_the_field(tmp_path, capsys, binding, fragment):
    line = one_error_line(*run_cli(capsys, "train", f"--workdir={tmp_path}", *TINY, f"--gin.{binding}"))
    assert fragment in line
    assert not (tmp_path / "checkpoints").exists()


def test_gin_typo_in_a_file_names_file_and_line(tmp_path, capsys):
    gin_file = tmp_path / "run.gin"
    gin_file.write_text("TrainerConfig.num_steps = 3\nTrainerConfig.log_evry = 1\n")
    line = one_error_line(*run_cli(capsys, "train", f"--workdir={tmp_path / 'run'}", *TINY, f"--gin_file={gin_file}"))
    assert "doesn't have a parameter named 'log_evry'" in line and f"({gin_file}, line 2)" in line
    gin_file.write_text("TrainerConfig.num_steps = (3\n")
    line = one_error_line(*run_cli(capsys, "train", f"--workdir={tmp_path / 'run'}", *TINY, f"--gin_file={gin_file}"))
    assert f"unclosed bracket or string in gin file {gin_file}" in line
    gin_file.write_bytes(b"\xff\xfe\x00 not text")
    line = one_error_line(*run_cli(capsys, "train", f"--workdir={tmp_path / 'run'}", *TINY, f"--gin_file={gin_file}"))
    assert f"gin file {gin_file}: cannot read it as UTF-8 text" in line


# --- checkpoints and indexes of another model -------------------------------------------------------


def test_resume_with_another_model_size(tmp_path, capsys):
    """A workdir whose model_config.json says another size than its saved steps (the run's settings agree with
    model_config.json, the arrays do not): one error, nothing renamed."""
    from rankgen_jax.runtime import partitioning
    from rankgen_jax.train import checkpointing
    from rankgen_jax.train.compiled import build_step_functions
    from rankgen_jax.train.optimizers import OptimizerConfig, make_optimizer
    from rankgen_jax.train.step import StepOptions

    # A saved step of the tiny model, written without compiling a train step.
    config = ModelConfig(encoder=T5Config(vocab_size=128, d_model=128, d_ff=512, num_layers=2, num_heads=4, d_kv=32),
                         head=RANKGEN_HEAD)
    mesh = partitioning.make_mesh(-1, 1)
    tx, schedule = make_optimizer(OptimizerConfig(name="adamw", learning_rate=0.001))
    setup = build_step_functions(config, StepOptions(), tx, schedule, {}, mesh,
                                 partitioning.rules_by_name("standard"), seed=0)
    other_size = dataclasses.replace(config, encoder=dataclasses.replace(config.encoder, d_model=64))
    native.save_model_config(tmp_path, other_size)
    (tmp_path / "config.gin").write_text("")  # as train writes it: this folder is a training run
    manager = native.step_manager(tmp_path, writer=True)
    with jax.set_mesh(mesh):
        checkpointing.save(manager, setup.init(), next_batch_index=2)
    manager.wait_until_finished()
    manager.close()

    line = one_error_line(*run_cli(capsys, "train", f"--workdir={tmp_path}", *TINY,
                                   "--gin.TrainerConfig.num_steps=4", "--gin.t5_config.d_model=64"))
    assert f"no checkpoint in {tmp_path}/checkpoints restores (step 0: " in line
    assert "model_config.json" in line
    assert sorted(p.name for p in (tmp_path / "checkpoints").iterdir()) == ["0"]


def test_search_with_another_model(tmp_path, capsys, models):
    corpus = tmp_path / "corpus.jsonl"
    corpus.write_text("".join(json.dumps({"id": str(i), "text": f"passage number {i} about the sea"}) + "\n"
                              for i in range(6)))
    queries = tmp_path / "queries.tsv"
    queries.write_text("q1\tthe sea\n")
    code, err = run_cli(capsys, "index", "--model", models["a"], "--corpus", corpus, "--out", tmp_path / "index")
    assert code == 0, err
    # Other vector width: refused before encoding anything.
    line = one_error_line(*run_cli(capsys, "search", "--model", models["narrow"], "--index", tmp_path / "index",
                                   "--queries", queries))
    assert "gives 16-dimensional vectors" in line and "32" in line and str(models["a"]) in line
    # Same width, other weights: searched, with a note naming both models.
    code, err = run_cli(capsys, "search", "--model", models["a_other_weights"], "--index", tmp_path / "index",
                        "--queries", queries, "--output", tmp_path / "hits.jsonl")
    assert code == 0, err
    assert f"was built with {models['a']}, searching with {models['a_other_weights']}" in err
    # Copied elsewhere, the index and its own model still search without a note.
    shutil.copytree(tmp_path / "index", tmp_path / "moved")
    code, err = run_cli(capsys, "search", "--model", models["a"], "--index", tmp_path / "moved", "--queries", queries,
                        "--output", tmp_path / "hits2.jsonl")
    assert code == 0 and "note:" not in err
    # Without --output, a TREC run goes to stdout: `qid Q0 docid rank score tag`, ranks from 1.
    assert main(["search", "--model", str(models["a"]), "--index", str(tmp_path / "moved"), "--queries", str(queries),
                 "--k", "3", "--format", "trec", "--run_tag", "mine"]) == 0
    rows = [line.split() for line in capsys.readouterr().out.splitlines()]
    assert [(r[0], r[1], r[3], r[5]) for r in rows] == [("q1", "Q0", str(rank), "mine") for rank in (1, 2, 3)]
    assert len({r[2] for r in rows}) == 3


# --- safe and truthful runs: a workdir is one run in one folder; paths get errors, not tracebacks ----------------


def _tree(folder: Path) -> dict[str, tuple[int, int]]:
    """Every file under folder: relative path -> (size, mtime in ns), to show that nothing was written."""
    return {str(p.relative_to(folder)): (p.stat().st_size, p.stat().st_mtime_ns)
            for p in sorted(folder.rglob("*")) if p.is_file()}


def test_a_workdir_is_one_run_in_one_folder(tmp_path, capsys):
    """Through `lnk/../run` (lnk a symlink): every file in the folder the OS opens. A rerun with other model or data
    settings is refused before compiling, naming each difference, and writes nothing; a longer num_steps resumes,
    and each export's card reads the settings of the start that trained its step."""
    (tmp_path / "elsewhere" / "deep").mkdir(parents=True)
    (tmp_path / "lnk").symlink_to(tmp_path / "elsewhere" / "deep")
    workdir = f"{tmp_path / 'lnk'}/../run"  # the OS: elsewhere/run; text alone: tmp_path/run
    real = tmp_path / "elsewhere" / "run"
    common = [f"--workdir={workdir}", *TINY, "--gin.TrainerConfig.checkpoint_every=2"]
    code, err = run_cli(capsys, "train", *common, "--gin.TrainerConfig.num_steps=2")
    assert code == 0, err
    assert not (tmp_path / "run").exists(), "part of the run went to the textually normalised path"
    for name in ("model_config.json", "run_config.json", "config.gin", "operative_config.gin", "metrics.jsonl",
                 "checkpoints/2", "operative_configs/from_step_0.gin"):
        assert (real / name).exists(), name
    before = _tree(real)

    for binding, named in (("--gin.t5_config.num_layers=3", "ModelConfig.encoder.num_layers 2 -> 3"),
                           ("--gin.DataConfig.batch_size=16", "DataConfig.batch_size 8 -> 16"),
                           ("--gin.LossConfig.logit_scale=2.0", "LossConfig.logit_scale 1.0 -> 2.0")):
        line = one_error_line(*run_cli(capsys, "train", *common, "--gin.TrainerConfig.num_steps=4", binding))
        assert f"{real} holds a run with other settings than these ({named}; recorded -> now)" in line, line
        assert f"--gin.TrainerConfig.init_checkpoint={real}" in line and "TrainerConfig.num_steps" in line
        assert _tree(real) == before, f"{binding}: the refused run wrote or changed files"

    code, err = run_cli(capsys, "train", *common, "--gin.TrainerConfig.num_steps=4")
    assert code == 0, err
    assert f"resuming from {real}/checkpoints/2" in err
    assert f"note: resuming {real} with changed settings: TrainerConfig.num_steps 2 -> 4 (recorded -> now)" in err
    assert json.loads((real / "run_config.json").read_text())["trainer"]["num_steps"] == 4
    assert "TrainerConfig.num_steps = 4" in (real / "config.gin").read_text()
    assert "TrainerConfig.num_steps = 2" in (real / "operative_configs" / "from_step_0.gin").read_text()
    assert "TrainerConfig.num_steps = 4" in (real / "operative_configs" / "from_step_2.gin").read_text()
    for step, num_steps in ((2, 2), (4, 4)):
        out = tmp_path / f"export_{step}"
        code, err = run_cli(capsys, "export-hf", "--checkpoint", workdir, "--out", out, "--step", step)
        assert code == 0, err
        card = (out / "README.md").read_text()
        assert f"this export is step {step}." in card and f"TrainerConfig.num_steps = {num_steps}" in card
        other = 4 if num_steps == 2 else 2
        assert f"TrainerConfig.num_steps = {other}" not in card


def test_a_workdir_that_is_not_a_run_is_refused(tmp_path, capsys, models):
    afile = tmp_path / "afile"
    afile.write_text("keep me")
    line = one_error_line(*run_cli(capsys, "train", f"--workdir={afile}", *TINY))
    assert line == f"error: --workdir {afile}: is a file; a workdir is a folder (created when missing)"
    assert afile.read_text() == "keep me"
    # The same from the library: it names its argument, not a flag (the CLI's words are its own).
    from rankgen_jax.train import loop

    with pytest.raises(RankgenError, match=r"^`workdir` .*afile: is a file") as raised:
        loop.train(afile)
    assert "--" not in str(raised.value)
    # The main job (no --gin_file) refuses it the same way, before making anything.
    line = one_error_line(*run_cli(capsys, "train", f"--workdir={afile}"))
    assert line == f"error: --workdir {afile}: is a file; the job's workdir is a folder (created when missing)"
    # A checkpoint from `import` (or any checkpoint not written by train) is a starting point, not a run to resume.
    imported = tmp_path / "imported"
    shutil.copytree(models["a"], imported)
    native.save_provenance(imported, {"imported_from": "/models/t5x_tiny", "source_format": "t5x"})
    before = _tree(imported)
    line = one_error_line(*run_cli(capsys, "train", f"--workdir={imported}", *TINY))
    assert line == (f"error: --workdir {imported}: is a checkpoint imported from /models/t5x_tiny, not a training run "
                    f"to resume; to train from it, pass --gin.TrainerConfig.init_checkpoint={imported} and a new "
                    "--workdir")
    assert _tree(imported) == before


def test_paths_given_where_files_belong_get_errors(tmp_path, capsys):
    good = tmp_path / "v.jsonl"
    good.write_text(json.dumps({"prefix": "a b c", "candidates": ["a b", "x y"], "label": 0}) + "\n")
    line = one_error_line(*run_cli(capsys, "score", "--method", "unigram", "--input", good,
                                   "--output", tmp_path / "nope" / "o.jsonl"))
    assert line == f"error: --output {tmp_path / 'nope' / 'o.jsonl'}: folder {tmp_path / 'nope'} does not exist"
    line = one_error_line(*run_cli(capsys, "score", "--method", "unigram", "--input", good, "--output", tmp_path))
    assert line == f"error: --output {tmp_path}: is a folder; expected a file name"
    line = one_error_line(*run_cli(capsys, "score", "--method", "unigram", "--input", tmp_path))
    assert line == f"error: --input {tmp_path}: is a folder; expected a file"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["v.jsonl"]
    # An LM folder with pickled weights only: refused before torch would unpickle anything.
    lm = tmp_path / "lm"
    lm.mkdir()
    (lm / "config.json").write_text(json.dumps({"model_type": "gpt2"}))
    (lm / "pytorch_model.bin").write_bytes(b"\x80\x04not really a pickle")
    line = one_error_line(*run_cli(capsys, "score", "--method", "lm_loglik", "--lm", lm, "--input", good))
    assert line == (f"error: causal LM {lm}: has only pytorch_model.bin (pickle), which is not read for safety; re-save it "
                    "with safetensors: model.save_pretrained(out_dir, safe_serialization=True)")


def test_the_command_line_says_library_names_as_its_flags():
    """The library quotes the argument and gin names it declares in backticks; the CLI shows its own flag for each
    and leaves other backticked words (a file's field, an undeclared name) alone."""
    message = ("`workdir` /r: is a checkpoint; set `TrainerConfig.init_checkpoint`=/r and use a new `workdir` "
               "(`batch_size` is no flag here; the `checkpoint` file)")
    names = ("workdir", "TrainerConfig.init_checkpoint", "batch_size")
    flag_of = {"workdir": "--workdir", "gin_file": "--gin_file", "checkpoint": "--checkpoint"}
    assert in_flags(message, names, flag_of, gin=True) == (
        "--workdir /r: is a checkpoint; set --gin.TrainerConfig.init_checkpoint=/r and use a new --workdir "
        "(batch_size is no flag here; the `checkpoint` file)")
    assert in_flags(message, names, {}, gin=False) == (
        "workdir /r: is a checkpoint; set TrainerConfig.init_checkpoint=/r and use a new workdir "
        "(batch_size is no flag here; the `checkpoint` file)")

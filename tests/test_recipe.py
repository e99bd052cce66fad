"""The RankGen recipe: its gins resolve to the paper's data and settings, and `split-data` cuts the LM's half and the
prefix file exactly as training cuts the examples."""

import json

import pytest

pytest.importorskip("seqio")

from rankgen_jax.cli.main import run_command  # noqa: E402
from rankgen_jax.data.documents import read_documents  # noqa: E402
from rankgen_jax.data.examples import ExampleConfig, make_examples  # noqa: E402
from rankgen_jax.data.sentences import split_sentences  # noqa: E402
from rankgen_jax.experiments.gin_runs import experiment_configurables  # noqa: E402
from rankgen_jax.experiments.recipe_example import RecipeFolder  # noqa: E402
from rankgen_jax.testing import BOTCHAN  # noqa: E402
from rankgen_jax.train.gin_parsing import parse_gin  # noqa: E402

# The paper's examples (§2.2): every sentence starts a 256-word prefix, continuations of 10-128 words, one InBook
# negative from the same document.
PAPER_EXAMPLES = ExampleConfig(prefix_words=256, min_continuation_words=10, max_continuation_words=128,
                               prefix_stride_sentences=1)
# gin file, T5 size, global batch, steps (None: the CPU recipe's few)
RECIPES = [
    ("rankgen_t5_xl_paper.gin", "xl", 1536, 100_000),
    ("tpu/rankgen_xl_v3_256.gin", "xl", 1536, 100_000),
    ("tpu/rankgen_xl_v3_128.gin", "xl", 1536, 100_000),
    ("rankgen_t5_large_paper.gin", "large", 4096, 100_000),
    ("tpu/rankgen_large_v3_128.gin", "large", 4096, 100_000),
    ("rankgen_t5_base_paper.gin", "base", 4096, 100_000),
    ("tpu/rankgen_base_v3_32.gin", "base", 4096, 100_000),
    ("rankgen_t5_tiny_recipe.gin", "tiny", 8, None),
]
PATHS = ["rankgen_data_paths.pg19 = '/data/pg19'", "rankgen_data_paths.folder = '/data/docs'",
         "rankgen_data_paths.generative_jsonl = {'pg19': '/data/pg19.jsonl', 'folder': '/data/docs.jsonl'}"]


def _parse(files, bindings=()):
    # As `train` and `compile` parse: the seqio tasks' module is found from what the files include.
    parse_gin(files, list(bindings), experiment_configurables)


@pytest.mark.parametrize("gin_file, size, batch_size, steps", RECIPES)
def test_recipe_gins_resolve_to_the_papers_data(gin_file, size, batch_size, steps):
    import gin

    from rankgen_jax.data.seqio.tasks import task_spec
    from rankgen_jax.data.source_configs import DataConfig
    from rankgen_jax.train.config import LossConfig, TrainerConfig
    from rankgen_jax.train.optimizers import OptimizerConfig

    _parse([gin_file], PATHS)
    data = DataConfig()
    # Not the books' token windows: the seqio task of (p, c, g) triples (§2.2).
    assert data.source.kind == "seqio" and data.source.with_negative
    assert (data.prefix_length, data.source.continuation_length, data.batch_size) == (512, 128, batch_size)
    spec = task_spec(data.source.task)
    assert spec.negatives == "both" and spec.reads_generative and not spec.reads_documents
    assert spec.example_config == PAPER_EXAMPLES
    # One document per batch (§2.2: "all minibatch elements are sampled from the same document").
    assert spec.group_size == batch_size and not spec.mixes_documents
    assert LossConfig().name == "in_batch_softmax"
    optimizer = OptimizerConfig()
    assert (optimizer.name, optimizer.learning_rate, optimizer.schedule) == ("adafactor", 2e-3, "constant")
    assert gin.query_parameter("t5_config.size") == size
    if steps is not None:
        assert TrainerConfig().num_steps == steps


def _documents(folder, count=6):
    """Six documents of Botchan, 700 to 1,200 words each, as files of a folder."""
    words = BOTCHAN.read_text(encoding="utf-8").split()
    folder.mkdir()
    for n in range(count):
        start = 3000 + 1500 * n
        (folder / f"part_{n}.txt").write_text(" ".join(words[start : start + 700 + 100 * n]), encoding="utf-8")
    return folder


def test_split_data_cuts_the_lm_half_and_the_prefix_file_as_training_does(tmp_path, capsys):
    from rankgen_jax.data.seqio.tasks import scan_task

    folder = _documents(tmp_path / "docs")
    gin_args = ["--gin_file", "rankgen_t5_tiny_recipe.gin", f"--gin.rankgen_data_paths.folder='{folder}'"]
    out = tmp_path / "split"
    summary = run_command(["split-data", "--task", "rankgen_folder_inbook", "--out_dir", str(out), *gin_args])
    # Independently: the training documents (all but the last held out) cut with the paper's settings.
    docs = sorted(read_documents(folder), key=lambda d: d.id)[:-1]
    expected = {d.id: make_examples(d, PAPER_EXAMPLES) for d in docs}
    assert all(expected.values())
    lm_lines = (out / "lm_train.txt").read_text(encoding="utf-8").splitlines()
    prefixes = [json.loads(line) for line in (out / "prefixes.jsonl").read_text(encoding="utf-8").splitlines()]
    # The recipe example finds split-data's prefix file where split-data writes it.
    assert RecipeFolder(tmp_path).prefixes("train") == out / "prefixes.jsonl"
    lm_docs, negative_docs = summary["lm_half"]["documents"], summary["negatives_half"]["documents"]
    # Whole documents, each in one half, every training document in one.
    assert sorted(lm_docs + negative_docs) == sorted(expected) and not set(lm_docs) & set(negative_docs)
    assert lm_lines == [f"{e.prefix} {e.continuation}" for d in lm_docs for e in expected[d]]
    assert prefixes == [{"id": f"{d}#{k}", "doc_id": d, "prefix": e.prefix, "continuation": e.continuation}
                        for d in negative_docs for k, e in enumerate(expected[d])]
    # About half the examples each: the halves differ by at most one document's examples.
    assert abs(len(lm_lines) - len(prefixes)) <= max(len(v) for v in expected.values())
    # The paper's stride: consecutive examples of a document start their prefixes one sentence apart.
    for d in negative_docs:
        sentences = split_sentences(next(doc.text for doc in docs if doc.id == d))
        starts = [e.prefix_span[0] for e in expected[d]]
        assert starts == sorted(starts) and starts[1] - starts[0] == 1
        assert all(len(e.prefix.split()) <= 256 and 10 <= len(e.continuation.split()) <= 128 for e in expected[d])
        assert expected[d][0].prefix == " ".join(sentences[slice(*expected[d][0].prefix_span)])
    assert json.loads((out / "split.json").read_text())["example_config"]["prefix_stride_sentences"] == 1

    # generate-negatives adds a "generative_negative" to each record (here by hand); the training task reads them
    # as (p, c, g) examples grouped by document, a document's leftovers pooled with the others'.
    negatives = tmp_path / "negatives.jsonl"
    negatives.write_text("".join(json.dumps({**r, "generative_negative": "He went home at once."}) + "\n"
                                 for r in prefixes), encoding="utf-8")
    _parse(["rankgen_t5_tiny_recipe.gin"], [f"rankgen_data_paths.folder = '{folder}'",
                                             f"rankgen_data_paths.generative_jsonl = {{'folder': '{negatives}'}}"])
    scan = scan_task("rankgen_folder_both", "train")
    group = 8
    triples = sum(len(expected[d]) for d in negative_docs[:-1])  # its last document: validation
    whole = sum(len(expected[d]) // group * group for d in negative_docs[:-1])
    # Whole same-document groups, then the leftovers pooled into whole mixed groups: all but the pool's remainder.
    assert scan.examples == triples // group * group and scan.pooled_examples == scan.examples - whole

    # The validation split goes whole to the prefix file: the LM must not learn it.
    held = run_command(["split-data", "--task", "rankgen_folder_inbook", "--out_dir", str(tmp_path / "val"),
                        "--split", "validation", *gin_args])
    assert held["lm_half"]["examples"] == 0 and not (tmp_path / "val" / "lm_train.txt").exists()
    last = sorted(read_documents(folder), key=lambda d: d.id)[-1]
    assert held["negatives_half"]["documents"] == [last.id]
    assert held["negatives_half"]["examples"] == len(make_examples(last, PAPER_EXAMPLES))
    capsys.readouterr()


def test_split_data_refuses_a_task_without_documents_and_a_lone_document(tmp_path):
    from rankgen_jax.errors import RankgenError

    folder = _documents(tmp_path / "docs", count=2)
    paths = [f"--gin.rankgen_data_paths.folder='{folder}'",
             f"--gin.rankgen_data_paths.generative_jsonl={{'folder': '{tmp_path / 'g.jsonl'}'}}"]
    with pytest.raises(RankgenError, match="reads no documents"):
        run_command(["split-data", "--task", "rankgen_folder_generative", "--out_dir", str(tmp_path / "a"), *paths])
    # Two documents, one held out: one left, which the LM's half takes; none for the negatives.
    with pytest.raises(RankgenError, match="no document left for the generative negatives' half"):
        run_command(["split-data", "--task", "rankgen_folder_inbook", "--out_dir", str(tmp_path / "b"),
                     "--gin_file", "recipes/rankgen_paper_data.gin", *paths])

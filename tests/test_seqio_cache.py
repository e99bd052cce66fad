"""RankGen tasks through seqio's Beam cache (`rankgen-jax cache-tasks`), and training read from the cache."""

import json
import logging
from collections import Counter
from pathlib import Path

import numpy as np
import pytest

tf = pytest.importorskip("tensorflow")
seqio = pytest.importorskip("seqio")
pytest.importorskip("apache_beam")
pytest.importorskip("crcmod", reason="Beam's TFRecord sink needs a CRC32C package (apache-beam[tfrecord]: crcmod)")

from rankgen_jax.cli.main import main  # noqa: E402 - after the optional-package checks
from rankgen_jax.data.documents import EMPTY_FILE  # noqa: E402
from rankgen_jax.data.seqio import tasks as st  # noqa: E402
from rankgen_jax.data.seqio.source import SeqioTriples  # noqa: E402
from rankgen_jax.data.source_configs import DataConfig, SeqioData
from rankgen_jax.data.sources import make_sources  # noqa: E402
from rankgen_jax.errors import RankgenError  # noqa: E402
from rankgen_jax.testing import word_book  # noqa: E402
from rankgen_jax.train.metric_writers import read_metrics  # noqa: E402

TASK = "rankgen_folder_inbook"
GROUP = 8
LENGTHS = {"query_ids": 64, "positive_ids": 32, "negative_ids": 32}


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> Path:
    """Six small books (the last held out) and an empty file that is skipped and counted."""
    folder = tmp_path_factory.mktemp("cache_books")
    for n in range(6):
        (folder / f"book_{n}.txt").write_text(word_book("abcdef"[n] * 3, 100, n), encoding="utf-8")
    (folder / "0_empty.txt").write_text("", encoding="utf-8")
    return folder


def _task_bindings(corpus) -> list[str]:
    # One document per block: the five training blocks are spread over the three source shards.
    return [f"--gin.rankgen_data_paths.folder='{corpus}'", f"--gin.rankgen_task_options.group_size={GROUP}",
            "--gin.rankgen_task_options.prefix_words=40", "--gin.rankgen_task_options.min_continuation_words=8",
            "--gin.rankgen_task_options.max_continuation_words=24",
            "--gin.rankgen_task_options.shuffle_block_documents=1"]


@pytest.fixture(scope="module")
def cached_folder(corpus, tmp_path_factory) -> Path:
    """The folder task cached by two Beam worker processes."""
    out = tmp_path_factory.mktemp("seqio_cache")
    code = main(["cache-tasks", f"--tasks={TASK}", f"--output_cache_dir={out}", "--source_shards=3",
                 "--output_shards=4", "--pipeline_options=--runner=DirectRunner,--direct_num_workers=2,"
                 "--direct_running_mode=multi_processing", *_task_bindings(corpus)])
    assert code == 0
    seqio.add_global_cache_dirs([str(out)])
    return out


@pytest.fixture
def cache(cached_folder, corpus) -> Path:
    """The cache, with the task's bindings again (every test starts with none) for the uncached reference reads."""
    import gin

    gin.parse_config([b[len("--gin."):] for b in _task_bindings(corpus)])
    return cached_folder


def _groups(examples) -> list[tuple]:
    """Consecutive runs of GROUP rows, each as (doc_ids, the rows' ids)."""
    assert len(examples) % GROUP == 0
    out = []
    for i in range(0, len(examples), GROUP):
        rows = examples[i : i + GROUP]
        out.append((tuple(r["doc_id"] for r in rows), tuple(r[k].tobytes() for r in rows for k in st.ID_FEATURES)))
    return out


def _read(split, use_cached, shard_info=None):
    """One epoch of the task's examples (trimmed to LENGTHS, keeping the last token), with their doc_ids."""
    task = seqio.get_mixture_or_task(TASK)
    ds = task.get_dataset(LENGTHS, split=split, use_cached=use_cached, shuffle=False, seed=0, shard_info=shard_info,
                          num_epochs=1)
    return list(ds.as_numpy_iterator())


def _as_batch(rows) -> dict[str, np.ndarray]:
    """Rows as the trainer's batch: right-padded with the T5 pad id 0."""
    out = {}
    for key, length in LENGTHS.items():
        out[key] = np.zeros((len(rows), length), np.int32)
        for i, row in enumerate(rows):
            out[key][i, : len(row[key])] = row[key]
    return out


def _same(a, b) -> bool:
    return all(np.array_equal(a[k], b[k]) for k in LENGTHS)


@pytest.mark.parametrize("split", ["train", "validation"])
def test_the_cache_holds_the_uncached_groups_whole(cache, split):
    cached, uncached = _groups(_read(split, True)), _groups(_read(split, False))
    assert len(cached) > 1
    assert all(len(set(doc_ids)) == 1 for doc_ids, _ in cached)  # every cached group is one document's
    assert Counter(cached) == Counter(uncached)  # the same groups, in Beam's order
    task_dir = cache / TASK
    ours = json.loads((task_dir / f"rankgen_stats.{split}.json").read_text())
    scan = st.scan_task(TASK, split)
    assert ours["examples"] == scan.examples == GROUP * len(cached) and ours["groups"] == len(cached)
    assert ours["group_size"] == GROUP and ours["source_shards"] == 3
    assert ours["skipped"] == scan.stats.skipped == {EMPTY_FILE: 1}  # counted once, not once per shard
    seqio_stats = json.loads((task_dir / f"stats.{split}.json").read_text())
    assert seqio_stats["examples"] == len(cached)  # seqio counts records: whole groups
    assert seqio_stats["query_ids_max_tokens"] > LENGTHS["query_ids"]  # the cache keeps full lengths (trimmed later)
    assert len(list(task_dir.glob(f"{split}.tfrecord-*-of-00004"))) == 4 and (task_dir / "COMPLETED").exists()
    # The vocabulary the ids were made with, checked when training reads them.
    current = st.vocabulary_fingerprints(seqio.get_mixture_or_task(TASK))
    assert ours["vocabularies"] == current and set(current) >= set(LENGTHS)
    st.check_cached_vocabularies(TASK, ours["vocabularies"], current)
    other = {**current, "positive_ids": "0" * 64}
    with pytest.raises(RankgenError, match=r"tokenised with another vocabulary than the task has now "
                                           r"\(features \['positive_ids'\]\); rebuild it with"):
        st.check_cached_vocabularies(TASK, ours["vocabularies"], other)


def test_per_host_reads_are_disjoint_whole_groups_that_cover_the_cache(cache):
    everything = Counter(_groups(_read("train", True)))
    hosts = [_groups(_read("train", True, seqio.ShardInfo(h, 2))) for h in range(2)]
    assert all(hosts) and sum(map(Counter, hosts), Counter()) == everything
    assert not set(hosts[0]) & set(hosts[1])
    for h in range(2):  # each host's local batch (B / hosts rows) is one whole group of its own files
        source = SeqioTriples(TASK, "train", 2 * GROUP, LENGTHS, shard_info=seqio.ShardInfo(h, 2), use_cached=True)
        mine = _read("train", True, seqio.ShardInfo(h, 2))
        for index in range(len(mine) // GROUP):
            rows = mine[index * GROUP : (index + 1) * GROUP]
            assert len({r["doc_id"] for r in rows}) == 1
            assert _same(source.batch(index), _as_batch(rows))


def test_resume_from_the_cache_equals_an_uninterrupted_run(cache):
    rows = _read("train", True)
    epoch = len(rows) // GROUP
    uninterrupted = SeqioTriples(TASK, "train", GROUP, LENGTHS, use_cached=True)
    sequential = [uninterrupted.batch(i) for i in range(epoch + 3)]  # into the second epoch: the repeat too
    for i in range(epoch + 3):  # batch i is the cached stream's group i mod epoch: one document
        group = rows[(i % epoch) * GROUP : (i % epoch + 1) * GROUP]
        assert len({r["doc_id"] for r in group}) == 1 and _same(sequential[i], _as_batch(group))
    restarted = SeqioTriples(TASK, "train", GROUP, LENGTHS, use_cached=True)
    for index in (epoch + 1, epoch + 2, 5, 6, 0):  # a resume past an epoch, sequential, a jump back, the start
        assert _same(restarted.batch(index), sequential[index])


def test_train_a_few_steps_from_the_cache(cache, corpus, tmp_path, capsys):
    code = main(["train", f"--workdir={tmp_path}", "--gin_file=models/t5_1_1_tiny.gin",
                 "--gin.t5_config.vocab_size=8064", "--gin.DataConfig.source=@SeqioData()",
                 f"--gin.SeqioData.task='{TASK}'", f"--gin.SeqioData.seqio_cache_dir='{cache}'",
                 f"--gin.DataConfig.batch_size={GROUP}", "--gin.DataConfig.prefix_length=64",
                 "--gin.SeqioData.continuation_length=32", "--gin.TrainerConfig.num_steps=3",
                 "--gin.TrainerConfig.log_every=1", "--gin.TrainerConfig.eval_every=3",
                 "--gin.TrainerConfig.eval_batches=1", "--gin.OptimizerConfig.name='adamw'",
                 "--gin.OptimizerConfig.learning_rate=1e-3"])
    assert code == 0, capsys.readouterr().err
    records = read_metrics(tmp_path / "metrics.jsonl")
    assert [r["step"] for r in records if "train/loss" in r] == [1, 2, 3]
    assert all(np.isfinite(r["train/loss"]) for r in records if "train/loss" in r)


def test_reading_an_uncached_task_or_a_missing_cache_is_a_clear_error(cache, tmp_path):
    with pytest.raises(RankgenError, match=r"seqio_cache_dir='/no/such/cache': no such folder"):
        make_sources(DataConfig(SeqioData(task=TASK, seqio_cache_dir="/no/such/cache")))
    empty = tmp_path / "empty_cache"
    empty.mkdir()
    with pytest.raises(RankgenError, match=r"task 'rankgen_wiki_inbook' is not cached in any seqio cache folder "
                                           r".*rankgen-jax cache-tasks --tasks rankgen_wiki_inbook"):
        make_sources(DataConfig(SeqioData(task="rankgen_wiki_inbook", seqio_cache_dir=str(empty)), batch_size=GROUP))
    with pytest.raises(RankgenError, match=r"cached in groups of 8: each of the 1 hosts. 12 rows"):
        SeqioTriples(TASK, "train", 12, LENGTHS, use_cached=True)


def test_cache_tasks_refuses_bad_requests_before_beam_starts(corpus, tmp_path, capsys):
    out = str(tmp_path / "c")
    assert main(["cache-tasks", "--tasks=rankgen_nope", f"--output_cache_dir={out}"]) == 2
    assert "'rankgen_nope' not a registered RankGen task" in capsys.readouterr().err
    assert main(["cache-tasks", f"--tasks={TASK}", f"--output_cache_dir={out}",
                 "--pipeline_options=--runner=PrismRunner"]) == 2
    assert "the Prism runner downloads its binary" in capsys.readouterr().err
    assert main(["cache-tasks", "--tasks=rankgen_pg19_inbook", f"--output_cache_dir={out}"]) == 2
    assert "no PG19 documents set" in capsys.readouterr().err
    assert not Path(out, "rankgen_pg19_inbook").exists()


def test_the_cache_pipeline_keeps_seqio_log_lines_but_not_its_whole_example_dumps(caplog):
    from absl import logging as absl_logging

    from rankgen_jax.data.seqio.beam_cache import _quiet_example_dumps

    _quiet_example_dumps()
    _quiet_example_dumps()  # a worker set up twice filters once
    with caplog.at_level("INFO", logger="absl"):
        # The two lines seqio's PreprocessTask logs, through absl as it does.
        absl_logging.info("Processing shard: %s", "shard-0")
        absl_logging.info("Example [%d] = %s", 1, {"query_ids": list(range(5))})
    assert [r.getMessage() for r in caplog.records] == ["Processing shard: shard-0"]
    assert sum(f.__name__ == "_is_not_an_example_dump" for f in logging.getLogger("absl").filters) == 1

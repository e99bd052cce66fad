"""`rankgen-jax index` memory and sharded throughput (`python -m benchmarks.index_memory`).

Builds a random-init T5 1.1 RankGen dual encoder (default `tiny`) with the
project's demo SentencePiece vocabulary, and two corpora of passages of the
bundled books (`benchmarks.encode.corpus_passages`: runs of whole sentences,
3 to ~150 words), the large one `scale` (default 10) times the small one, as
MS MARCO-style TSV (`id<TAB>text`). Then runs `rankgen-jax index` (flat index)
as child processes, each measured by the kernel (os.wait4's ru_maxrss: the
peak resident memory of that process alone) and by wall clock:

1. the small corpus, one process;
2. the large corpus, one process (shard 0 of 1);
3. the large corpus as 2 shards, 2 processes at once (shards 0 and 1 of 2).

The index streams its corpus (retrieval.dense_index), so the peak RSS of 2
should stay within 1.2x of 1's; what still grows is the FAISS flat index
(4 x dim bytes a passage: `flat_index_mib`) and the duplicate-id check (8
bytes a passage). Throughput is passages / wall seconds of the whole command
(start-up, model load and compiles included, as a host would see it); with 2
processes, the wall time until both are done. Both processes share this
machine's cores, so on a machine with few cores 2 shards cannot be faster
than 1: the figure says what splitting costs or gains here, not across hosts.
Numbers, not pass/fail; on a shared machine they are noisy.

The flat dict `run()` returns (also written as JSON by `main`):

  size, dim, batch_size, cpu_count                  the settings and the machine
  small_passages, large_passages                    corpus sizes
  small_peak_rss_mib, large_peak_rss_mib            peak RSS of `index` on each
  rss_ratio                                         large / small (target at most 1.2)
  flat_index_mib                                    the large corpus's FAISS flat index (passages x dim x 4 bytes)
  one_process_seconds, one_process_passages_per_second     the large corpus, 1 process
  two_process_seconds, two_process_passages_per_second     the large corpus, 2 shards at once
  two_process_peak_rss_mib                          the larger of the 2 processes' peaks
  two_over_one                                      two_process / one_process passages per second
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from benchmarks.report import write_json
from rankgen_jax.resources import REPO_ROOT

RSS_TARGET = 1.2


def build_model(out: Path, size: str = "tiny", seed: int = 0) -> tuple[str, int]:
    """(checkpoint folder, vector dimension) of a random-init T5 1.1 RankGen dual encoder."""
    from rankgen_jax.checkpoints import native
    from rankgen_jax.models.configs import RANKGEN_HEAD, ModelConfig, t5_config
    from rankgen_jax.models.factory import init_params
    from rankgen_jax.resources import DEMO_VOCAB

    # The demo vocabulary has 8000 pieces; 8064 rounds that up to a multiple of 128.
    config = ModelConfig(encoder=t5_config(size, vocab_size=8064), head=RANKGEN_HEAD)
    native.save_params(out, config, init_params(config, seed=seed), vocab=str(DEMO_VOCAB), overwrite=True)
    return str(out), int(config.encoder.d_model)


def write_corpus(path: Path, num_passages: int, seed: int = 0) -> str:
    """A TSV corpus of num_passages passages of the bundled books, ids `book-0000042`."""
    from benchmarks.encode import corpus_passages

    with path.open("w", encoding="utf-8") as f:
        for i, text in enumerate(corpus_passages(num_passages, seed=seed)):
            f.write(f"book-{i:07d}\t{text}\n")
    return str(path)


def _index_command(model: str, corpus: str, out: Path, batch_size: int, shard_index: int = 0,
                   num_shards: int = 1) -> list[str]:
    return [sys.executable, "-m", "rankgen_jax.cli.main", "index", "--model", model, "--corpus", corpus,
            "--out", str(out), "--batch_size", str(batch_size), "--num_shards", str(num_shards),
            "--shard_index", str(shard_index), "--no_progress"]


def run_indexes(commands: list[list[str]]) -> tuple[float, list[float]]:
    """Start the commands at once; (wall seconds until all are done, each one's peak RSS in MiB).

    Peak RSS is ru_maxrss of os.wait4 on each child (KiB on Linux): that process's own peak, across any
    exec it makes (`rankgen-jax-cpu` executes the command line; exec keeps the process).
    """
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO_ROOT), os.environ.get("PYTHONPATH")]))}
    start = time.perf_counter()
    children = [subprocess.Popen(command, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
                for command in commands]
    peaks = {}
    for child in children:
        # Read stderr first: a full pipe would stall the child.
        err = child.stderr.read()
        _, status, usage = os.wait4(child.pid, 0)
        child.returncode = os.waitstatus_to_exitcode(status)
        if child.returncode != 0:
            raise RuntimeError(f"{' '.join(child.args)} failed ({child.returncode}):\n{err[-2000:]}")
        peaks[child.pid] = usage.ru_maxrss / 1024
    return time.perf_counter() - start, [peaks[c.pid] for c in children]


def run(small: int = 2000, scale: int = 10, size: str = "tiny", batch_size: int = 64,
        workdir: str | None = None) -> dict:
    """Build the model and corpora (under workdir, default a temporary folder) and time the indexes; see the doc."""
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(workdir or tmp)
        root.mkdir(parents=True, exist_ok=True)
        model, dim = build_model(root / "model", size)
        large = small * scale
        small_corpus = write_corpus(root / "small.tsv", small)
        large_corpus = write_corpus(root / "large.tsv", large)
        _, (small_rss,) = run_indexes([_index_command(model, small_corpus, root / "small_index", batch_size)])
        one_seconds, (large_rss,) = run_indexes([_index_command(model, large_corpus, root / "large_index",
                                                                batch_size)])
        two_seconds, two_rss = run_indexes([_index_command(model, large_corpus, root / f"large_shards/s{s}",
                                                           batch_size, s, 2) for s in range(2)])
    return {
        "size": size, "dim": dim, "batch_size": batch_size, "cpu_count": os.cpu_count(),
        "small_passages": small, "large_passages": large,
        "small_peak_rss_mib": round(small_rss, 1), "large_peak_rss_mib": round(large_rss, 1),
        "rss_ratio": round(large_rss / small_rss, 3),
        "flat_index_mib": round(large * dim * 4 / 2**20, 1),
        "one_process_seconds": round(one_seconds, 2),
        "one_process_passages_per_second": round(large / one_seconds, 1),
        "two_process_seconds": round(two_seconds, 2),
        "two_process_passages_per_second": round(large / two_seconds, 1),
        "two_process_peak_rss_mib": round(max(two_rss), 1),
        "two_over_one": round(one_seconds / two_seconds, 3),
    }


def summary(row: dict) -> str:
    """A few readable lines of a run() result."""
    met = "met" if row["rss_ratio"] <= RSS_TARGET else "not met"
    return "\n".join([
        f"`rankgen-jax index`, T5 1.1 {row['size']} RankGen encoder (dim {row['dim']}), flat index, batch "
        f"{row['batch_size']}, {row['cpu_count']} cores",
        f"  peak RSS: {row['small_passages']} passages {row['small_peak_rss_mib']:.0f} MiB, {row['large_passages']} "
        f"passages {row['large_peak_rss_mib']:.0f} MiB: {row['rss_ratio']:.2f}x (target at most {RSS_TARGET}x: {met}; "
        f"the large flat index itself is {row['flat_index_mib']:.1f} MiB)",
        f"  {row['large_passages']} passages, 1 process: {row['one_process_seconds']:.1f} s, "
        f"{row['one_process_passages_per_second']:.0f} passages/s; 2 shards in 2 processes at once: "
        f"{row['two_process_seconds']:.1f} s, {row['two_process_passages_per_second']:.0f} passages/s "
        f"({row['two_over_one']:.2f}x; peak RSS {row['two_process_peak_rss_mib']:.0f} MiB each at most)",
    ])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--small", type=int, default=2000, help="passages of the small corpus (default 2000)")
    parser.add_argument("--scale", type=int, default=10, help="the large corpus is this many times larger (default 10)")
    parser.add_argument("--size", default="tiny", help="T5 1.1 size (default tiny)")
    parser.add_argument("--batch_size", type=int, default=64)
    parser.add_argument("--workdir", help="keep the model, corpora and indexes here (default: a temporary folder)")
    parser.add_argument("--out", default="runs/bench/index_memory.json")
    args = parser.parse_args(argv)
    row = run(args.small, args.scale, args.size, args.batch_size, args.workdir)
    print(summary(row))
    write_json(args.out, row)
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Generation benchmark (`python -m benchmarks.generation`): time per generation and the re-ranking share.

Builds a tiny random GPT-2 and a tiny random RankGen encoder (testing_models),
then decodes Botchan prefixes with RankGen beam search (B=2, N=10, L=20),
over-generate-and-rerank (N=20, B=1, L=max) and plain nucleus sampling, all
with a 115-token budget. Each case runs in its own subprocess so its peak RSS
is its own. A first, untimed pass (its time is `first_pass_seconds`,
compilation included) is followed by compiling every candidate shape the
RankGen encoder can meet, so the timed pass (another seed) measures the
steady state of a long run. The
models are tiny, so the numbers measure the plumbing (Python, batching, JAX
dispatch), not what a 1.5B LM and a 1.2B RankGen would cost; numbers, not
pass/fail. With --device cuda --lm_size medium --rankgen_size base (as
`benchmarks.gpu` runs it) the LM is a random-init GPT-2 of medium size (24 layers,
width 1024; the tiny BPE vocabulary of 400 pieces, so its output layer is far
smaller than GPT-2's 50k-word one) on the GPU and the encoder a random T5 1.1 of
that size: the re-ranking share then speaks to real model sizes.
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

CASES = [
    {"name": "beam B=2 N=10 L=20", "strategy": "beam", "beam_size": 2, "num_samples": 10, "rerank_length": 20},
    {"name": "rerank N=20 (B=1, L=max)", "strategy": "rerank", "beam_size": 1, "num_samples": 20, "rerank_length": 115},
    {"name": "nucleus (no rerank)", "strategy": "nucleus", "beam_size": 1, "num_samples": 1, "rerank_length": 115},
]


def compile_candidate_shapes(model, batch_size: int = 64) -> None:
    """Encode dummy candidates at every padded (rows, length) shape, so the timed pass measures no compilation.

    The shapes follow LoadedModel.encode's bucketing (powers of two, 16 to 128
    tokens for suffixes); should that change, this only warms up less.
    """
    long_text = " ".join(["word"] * 512)
    for length in (16, 32, 64, 128):
        # max_length=length cuts every row to exactly that bucket.
        rows = 1
        while rows <= batch_size:
            model.encode([long_text] * rows, side="suffix", max_length=length, batch_size=batch_size)
            rows *= 2


# GPT-2 shapes by name: (layers, heads, width).
LM_SIZES = {"tiny": (2, 2, 32), "medium": (24, 16, 1024)}


def run_case(case: dict, lm_dir: str, model_dir: str, prefixes: int, threads: int, device: str = "cpu") -> dict:
    """Time one case in this process; returns its row of the table."""
    import torch

    from rankgen_jax.lm.generation import RankGenReranker, SearchSettings, generate
    from rankgen_jax.inference.encoder import load_model
    from rankgen_jax.lm.scoring import load_causal_lm
    from rankgen_jax.testing import botchan_prefixes

    torch.set_num_threads(threads)
    lm = load_causal_lm(lm_dir, device)
    reranker = RankGenReranker(load_model(model_dir)) if case["strategy"] != "nucleus" else None
    texts = botchan_prefixes(prefixes, words=40)
    settings = dict(beam_size=case["beam_size"], num_samples=case["num_samples"],
                    rerank_length=case["rerank_length"], max_new_tokens=115, max_batch_rows=64)
    began = time.perf_counter()
    generate(lm, texts, case["strategy"], SearchSettings(seed=0, **settings), reranker=reranker)
    first_pass = time.perf_counter() - began
    if reranker is not None:
        compile_candidate_shapes(reranker.model)
        shapes_before = len(reranker.model.compiled_shapes)
    began = time.perf_counter()
    results = generate(lm, texts, case["strategy"], SearchSettings(seed=1, **settings), reranker=reranker)
    wall = time.perf_counter() - began
    generating = sum(r.seconds_generate for r in results)
    reranking = sum(r.seconds_rerank for r in results)
    return {
        **case,
        "prefixes": prefixes,
        "seconds_per_generation": wall / prefixes,
        "rerank_share": reranking / (generating + reranking) if generating + reranking > 0 else 0.0,
        "seconds_generate": generating,
        "seconds_rerank": reranking,
        "mean_new_tokens": sum(r.new_tokens for r in results) / prefixes,
        "first_pass_seconds": first_pass,
        "shapes_compiled_while_timed": len(reranker.model.compiled_shapes) - shapes_before if reranker else 0,
        "peak_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
        "torch_threads": threads,
        "device": device,
    }


def build_models(root: Path, lm_size: str = "tiny", rankgen_size: str = "tiny") -> tuple[str, str]:
    """A random GPT-2 and RankGen model (with its SentencePiece vocabulary) of the named sizes under root."""
    from rankgen_jax.checkpoints import native
    from rankgen_jax.models.configs import RANKGEN_HEAD, ModelConfig, t5_config
    from rankgen_jax.testing import build_tiny_gpt2, build_tiny_rankgen, random_params, train_tiny_vocab

    layers, heads, width = LM_SIZES[lm_size]
    lm_dir = build_tiny_gpt2(root / "gpt2", n_layer=layers, n_head=heads, n_embd=width)
    spiece = train_tiny_vocab(root / "spiece.model")
    if rankgen_size == "tiny":
        return lm_dir, build_tiny_rankgen(root / "rankgen", spiece)
    config = ModelConfig(encoder=t5_config(rankgen_size, vocab_size=1000), head=RANKGEN_HEAD)
    native.save_params(root / "rankgen", config, random_params(config, seed=1), vocab=spiece)
    return lm_dir, str(root / "rankgen")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--case", help=argparse.SUPPRESS)  # child mode: one case as JSON
    parser.add_argument("--lm", help=argparse.SUPPRESS)
    parser.add_argument("--model", help=argparse.SUPPRESS)
    parser.add_argument("--prefixes", type=int, default=8, help="prefixes decoded per case (default 8)")
    parser.add_argument("--threads", type=int, default=1, help="torch threads (default 1)")
    parser.add_argument("--device", default="cpu", help="torch device of the LM (default cpu)")
    parser.add_argument("--lm_size", default="tiny", choices=sorted(LM_SIZES))
    parser.add_argument("--rankgen_size", default="tiny", help="T5 1.1 size of the RankGen encoder (default tiny)")
    parser.add_argument("--only", choices=[c["strategy"] for c in CASES], help="run this strategy's case alone")
    parser.add_argument("--out", default="runs/bench/generation.json")
    args = parser.parse_args(argv)
    if args.case:
        print(json.dumps(run_case(json.loads(args.case), args.lm, args.model, args.prefixes, args.threads,
                                  args.device)))
        return 0
    rows = []
    with tempfile.TemporaryDirectory(prefix="bench_generation_") as tmp:
        print(f"building the {args.lm_size} GPT-2 and {args.rankgen_size} RankGen models ...", flush=True)
        lm_dir, model_dir = build_models(Path(tmp), args.lm_size, args.rankgen_size)
        for case in [c for c in CASES if args.only in (None, c["strategy"])]:
            proc = subprocess.run(
                [sys.executable, "-m", "benchmarks.generation", "--case", json.dumps(case), "--lm", lm_dir,
                 "--model", model_dir, "--prefixes", str(args.prefixes), "--threads", str(args.threads),
                 "--device", args.device],
                capture_output=True, text=True)
            if proc.returncode != 0:
                print(f"{case['name']}: failed\n{proc.stderr[-2000:]}", flush=True)
                continue
            rows.append(json.loads(proc.stdout.strip().splitlines()[-1]))
    print(f"\n{'case':<26} {'s / generation':>14} {'re-rank share':>13} {'new tokens':>10} "
          f"{'first pass s':>12} {'peak RSS MiB':>12}")
    for row in rows:
        print(f"{row['name']:<26} {row['seconds_per_generation']:>14.3f} {row['rerank_share']:>13.1%} "
              f"{row['mean_new_tokens']:>10.1f} {row['first_pass_seconds']:>12.2f} {row['peak_rss_mib']:>12.0f}")
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps({"max_new_tokens": 115, "top_p": 0.9, "results": rows}, indent=2) + "\n")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""One CL-DRD iteration at MS MARCO scale: per-example rates measured here, and the arithmetic for a TPU slice and a
GPU (`python -m benchmarks.cl_drd_cost [--out FILE.json]`).

The paper's models at their sizes (random weights; speed does not depend on them): the student TAS-B, two
DistilBERT towers (6 layers, d 768, ff 3072, [CLS]); the teacher a BERT-base cross encoder (12 layers). Lengths:
MS MARCO passages average about 80 wordpieces (capped at 256, length-bucketed as `index` does), queries about 10
(capped at 30), a teacher pair 10 + 80 + 3.

Measured on this machine (float32, all its cores), each after a warm-up call, median of `repeats`:
- encode: the student's document tower on [64, 80] passages (passages/s);
- teacher: the cross encoder on [64, 93] pairs (pairs/s);
- train: the project's train_step (lambdarank_mrr, rank_source "retrieval", AdamW) on lists of L = 30 passages of
  80 tokens and a 10-token query, 2 lists a step (lists/s).
Each rate times the stage's analytic model FLOPs per example (models.flops: 2 x weights x tokens plus attention;
a train step 3x its forwards) gives the FLOP/s this machine reached. One iteration (8.84M passages encoded, 502,939
training queries x 200 candidates scored by the teacher, their exact top-200 search, and the epochs of training on
lists of 30) is then its FLOPs over a device's bf16 peak at an assumed model-FLOPs utilisation (MFU). The search
is a flat inner product, 2 Q N D FLOPs, at the same utilisation (an IVF-PQ index does far less).
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import numpy as np

MSMARCO = {"passages": 8_841_823, "train_queries": 502_939, "depth": 200, "list_size": 30, "dev_queries": 6_980,
           "passage_tokens": 80, "query_tokens": 10, "pair_tokens": 93, "dim": 768}
EPOCHS = {"iteration 1": 4, "iteration 2": 2, "iteration 3": 2}
# Dense bf16 peaks (vendors' figures) of the devices the arithmetic is done for.
DEVICES = {"one NVIDIA H200 (989 TFLOP/s bf16)": 989e12, "TPU v4-32 slice (16 chips x 275 TFLOP/s)": 16 * 275e12,
           "TPU v5e-16 slice (16 chips x 197 TFLOP/s)": 16 * 197e12}
MFU = 0.4


def _median_seconds(fn, repeats: int) -> float:
    fn()  # compile / warm up
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def measure(repeats: int = 3) -> dict:
    import flax.linen as nn
    import jax
    import jax.numpy as jnp

    from rankgen_jax.models.configs import BertConfig, HeadConfig, ModelConfig
    from rankgen_jax.models.factory import build_model
    from rankgen_jax.models.flops import encoder_forward_flops
    from rankgen_jax.runtime import partitioning
    from rankgen_jax.testing import random_params
    from rankgen_jax.train.compiled import build_step_functions
    from rankgen_jax.train.optimizers import OptimizerConfig, make_optimizer
    from rankgen_jax.train.step import StepOptions

    distilbert = BertConfig(variant="distilbert", d_model=768, d_ff=3072, num_layers=6, num_heads=12,
                            has_pooler=False, type_vocab_size=0)
    bert = BertConfig(d_model=768, d_ff=3072, num_layers=12, num_heads=12)
    student = ModelConfig(encoder=distilbert, head=HeadConfig(pooling="first", projection_dim=0),
                          shared_towers=False)
    teacher = ModelConfig(encoder=bert, head=HeadConfig(pooling="first", projection_dim=0), kind="cross_encoder")
    rng = np.random.default_rng(0)
    p, q, pair, lists = MSMARCO["passage_tokens"], MSMARCO["query_tokens"], MSMARCO["pair_tokens"], 2
    out = {"devices": jax.device_count(), "platform": jax.default_backend()}

    model, params = build_model(student), random_params(student, 0)
    encode = jax.jit(lambda prm, ids: model.apply({"params": prm}, ids, tower="document"))
    ids = jnp.asarray(rng.integers(1000, 30000, (64, p)), jnp.int32)
    seconds = _median_seconds(lambda: jax.block_until_ready(encode(params, ids)), repeats)
    out["encode_passages_per_second"] = 64 / seconds
    out["encode_flops_per_passage"] = encoder_forward_flops(distilbert, p, 0)

    ranker, ranker_params = build_model(teacher), random_params(teacher, 1)
    score = jax.jit(lambda prm, ids: ranker.apply({"params": prm}, ids))
    pairs = jnp.asarray(rng.integers(1000, 30000, (64, 1, pair)), jnp.int32)
    seconds = _median_seconds(lambda: jax.block_until_ready(score(ranker_params, pairs)), repeats)
    out["teacher_pairs_per_second"] = 64 / seconds
    out["teacher_flops_per_pair"] = encoder_forward_flops(bert, pair, 1)

    # One device: the rates are per device, and the step's 2 lists cannot be split over more.
    mesh = partitioning.make_mesh(1, 1)
    rules = partitioning.STANDARD_RULES
    tx, schedule = make_optimizer(OptimizerConfig(name="adamw", learning_rate=3e-6))
    options = StepOptions("lambdarank_mrr", (("rank_source", "retrieval"),))
    fns = build_step_functions(student, options, tx, schedule, {}, mesh, rules, seed=0)
    size = MSMARCO["list_size"]
    batch = {"query_ids": rng.integers(1000, 30000, (lists, q)).astype(np.int32),
             "candidate_ids": rng.integers(1000, 30000, (lists, size, p)).astype(np.int32),
             "candidate_mask": np.ones((lists, size), np.int32),
             "labels": np.tile(np.concatenate([1 / np.arange(1, 6), np.zeros(12), -np.ones(13)]), (lists, 1))
             .astype(np.float32),
             "student_ranks": np.tile(np.arange(1, size + 1), (lists, 1)).astype(np.float32)}
    with jax.set_mesh(mesh), nn.logical_axis_rules(list(rules)):
        holder = {"state": fns.init()}
        placed = jax.device_put(batch, fns.batch_sharding)

        def step():
            holder["state"], metrics = fns.train_step(holder["state"], placed)
            jax.block_until_ready(metrics["loss"])

        seconds = _median_seconds(step, repeats)
    out["train_lists_per_second"] = lists / seconds
    out["train_flops_per_list"] = 3 * (size * encoder_forward_flops(distilbert, p, 0)
                                       + encoder_forward_flops(distilbert, q, 0))
    for stage, per in (("encode", "passage"), ("teacher", "pair"), ("train", "list")):
        rate = out[f"{stage}_{'passages' if per == 'passage' else per + 's'}_per_second"]
        out[f"{stage}_gflops_per_second_here"] = rate * out[f"{stage}_flops_per_{per}"] / 1e9
    return out


def arithmetic(rates: dict) -> dict:
    """One iteration's counts, FLOPs and hours: here (measured rates) and on each device at MFU."""
    m = MSMARCO
    pairs = m["train_queries"] * m["depth"]
    stages = {
        "encode the corpus (8.84M passages)": (m["passages"], rates["encode_flops_per_passage"],
                                               rates["encode_passages_per_second"]),
        "teacher scores (502,939 queries x 200)": (pairs, rates["teacher_flops_per_pair"],
                                                   rates["teacher_pairs_per_second"]),
    }
    search_flops = 2.0 * m["train_queries"] * m["passages"] * m["dim"]
    rows = {}
    for name, (count, flops, rate) in stages.items():
        rows[name] = {"count": count, "flops": count * flops, "hours_here": count / rate / 3600}
    rows["exact top-200 search (flat, 2 Q N D)"] = {"count": m["train_queries"], "flops": search_flops,
                                                    "hours_here": None}
    for iteration, epochs in EPOCHS.items():
        count = epochs * m["train_queries"]
        rows[f"training, {iteration} ({epochs} epochs of lists of 30)"] = {
            "count": count, "flops": count * rates["train_flops_per_list"],
            "hours_here": count / rates["train_lists_per_second"] / 3600}
    for row in rows.values():
        row["hours"] = {device: row["flops"] / (peak * MFU) / 3600 for device, peak in DEVICES.items()}
    data_flops = sum(r["flops"] for n, r in rows.items() if not n.startswith("training"))
    totals = {}
    for iteration in EPOCHS:
        train_row = next(r for n, r in rows.items() if iteration in n)
        flops = data_flops + train_row["flops"]
        totals[iteration] = {"flops": flops, "hours": {d: flops / (peak * MFU) / 3600 for d, peak in DEVICES.items()}}
    return {"rows": rows, "totals": totals, "mfu": MFU, "devices": DEVICES}


def markdown(rates: dict, cost: dict) -> str:
    devices = list(cost["devices"])
    lines = ["| stage | examples | FLOPs | hours here (measured rate) | " + " | ".join(f"hours, {d}" for d in devices)
             + " |", "|---|---:|---:|---:|" + "---:|" * len(devices)]
    for name, row in cost["rows"].items():
        here = "-" if row["hours_here"] is None else f"{row['hours_here']:,.0f}"
        lines.append(f"| {name} | {row['count']:,} | {row['flops']:.2e} | {here} | "
                     + " | ".join(f"{row['hours'][d]:.2f}" for d in devices) + " |")
    for iteration, total in cost["totals"].items():
        lines.append(f"| **one {iteration}, all stages** | | {total['flops']:.2e} | | "
                     + " | ".join(f"**{total['hours'][d]:.2f}**" for d in devices) + " |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--out", help="also write the rates and the arithmetic to this JSON file")
    args = parser.parse_args(argv)
    rates = measure(args.repeats)
    cost = arithmetic(rates)
    print(json.dumps(rates, indent=1))
    print(markdown(rates, cost))
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        with open(args.out, "w", encoding="utf-8") as f:
            json.dump({"rates": rates, "cost": cost}, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

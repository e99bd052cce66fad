"""`make bench` plumbing: the JAX and PyTorch train-step cases run at toy shapes, and the report renders."""

import json

import numpy as np
import pytest

from benchmarks import bench
from benchmarks.report import render_markdown


@pytest.fixture(scope="module")
def toy_rows():
    case = bench.BenchCase("tiny", batch=8, prefix_length=16, continuation_length=8, steps=2)
    return {fw: bench.run_case(bench.BenchCase(**{**case.__dict__, "framework": fw})) for fw in ("jax", "torch")}


@pytest.mark.slow  # about a minute: MiniLM's 30k-word embedding compiled in JAX and built in PyTorch
def test_the_demo_step_runs_on_both_sides_with_the_same_work():
    """The MiniLM case (the demo's step: mean pooling, L2, logit scale 20) at toy shapes, JAX and PyTorch."""
    case = bench.BenchCase("L6", batch=8, prefix_length=8, continuation_length=8, with_negative=False, steps=1,
                           encoder="minilm")
    rows = {fw: bench.run_case(bench.BenchCase(**{**case.__dict__, "framework": fw})) for fw in ("jax", "torch")}
    for row in rows.values():
        assert row["step_seconds"] > 0 and np.isfinite(row["loss"])
        # Random init, unit vectors at scale 20: the loss starts near log(batch), far from the 0 a broken head gives.
        assert 0.5 < row["loss"] < 10
    assert rows["jax"]["train_gflops_per_second"] * rows["jax"]["step_seconds"] == pytest.approx(
        rows["torch"]["train_gflops_per_second"] * rows["torch"]["step_seconds"])


def test_cases_run_with_or_without_the_cpu_plugin():
    base = {"PATH": "/bin", "RANKGEN_KERNEL_PLUGIN": "rankgen_jax_cpu", "GLIBC_TUNABLES": "glibc.malloc.hugetlb=1",
            "XLA_FLAGS": "--xla_force_host_platform_device_count=8 --xla_cpu_experimental_ynn_fusion_type="}
    plain = bench.case_environment(bench.BenchCase(cpu_plugin=False), base)
    assert plain == {"PATH": "/bin", "XLA_FLAGS": "--xla_force_host_platform_device_count=8"}
    assert bench.case_environment(bench.BenchCase(framework="torch"), base) == plain
    with_plugin = bench.case_environment(bench.BenchCase(), plain)
    assert with_plugin["RANKGEN_KERNEL_PLUGIN"] == "rankgen_jax_cpu"
    assert "--xla_cpu_experimental_ynn_fusion_type=" in with_plugin["XLA_FLAGS"].split()


def test_both_frameworks_time_the_same_work(toy_rows):
    jax_row, torch_row = toy_rows["jax"], toy_rows["torch"]
    for row in (jax_row, torch_row):
        assert row["step_seconds"] > 0 and row["first_step_seconds"] > 0 and np.isfinite(row["loss"])
        assert row["best_step_seconds"] <= row["step_seconds"]
        # The matmul peak is read beside the timed steps, in the case's own process.
        assert len(row["peak_readings"]) == 2 and min(row["peak_readings"]) > 0
    # (8 rows: the test process has 8 fake devices.) Same analytical work on both sides: tokens and FLOPs per step are equal, so the rates scale with 1/time.
    for key in ("tokens_per_second", "train_gflops_per_second"):
        assert jax_row[key] * jax_row["step_seconds"] == pytest.approx(torch_row[key] * torch_row["step_seconds"])
    # tokens / seconds * seconds rounds: exact equality held only for some timings.
    assert jax_row["tokens_per_second"] * jax_row["step_seconds"] == pytest.approx(8 * (16 + 8 + 8), rel=1e-12)


def test_percent_of_peak_is_jax_median_round_against_the_peak_read_beside_it(toy_rows):
    def jax_row(seconds, readings):
        return {**toy_rows["jax"], "size": "small", "step_seconds": seconds, "train_gflops_per_second": 240.0 / seconds,
                "peak_readings": readings}

    def rounds():  # fresh rows: judge_peak writes into them
        # a is the faster step but, against the machine's speed at the time, the lower figure; its
        # lower ratio (0.95) comes from PyTorch being faster still in it.
        return [{"jax": jax_row(4.0, [80.0, 75.0]), "torch": toy_rows["torch"], "ratio": 0.95},  # 60 / 80: 75.0%
                {"jax": jax_row(4.4, [70.0, 72.0]), "torch": toy_rows["torch"], "ratio": 1.10},  # 54.5 / 72: 75.8%
                {"jax": jax_row(4.2, [90.0, 60.0]), "torch": toy_rows["torch"], "ratio": 1.00}]  # 57.1 / 90: 63.5%

    def judged(rounds, floor):
        train = {"peers": [bench.summarize_rounds("small", 16, rounds)], "gradcache": [], "gradcache_rss_1536_over_64": None}
        bench.judge_peak(train, floor)
        return train

    two = judged(rounds()[:2], floor=0.0)["peers"][0]
    assert two["jax_over_torch"] == 0.95 and two["jax"]["step_seconds"] == 4.0
    assert two["jax_for_peak"]["step_seconds"] == 4.0  # of two rounds, the lower %, not the slower step
    three = judged(rounds(), floor=0.0)
    assert three["peers"][0]["jax_over_torch"] == 1.0 and three["peers"][0]["jax_for_peak"]["step_seconds"] == 4.0
    # Both readings beside b were low (a slow spell); the run's median reading is the bar instead: 54.5 / 74 = 73.7%.
    floored = judged(rounds(), floor=74.0)["peers"][0]
    assert floored["jax_for_peak"]["step_seconds"] == 4.4 and floored["jax_for_peak"]["of_peak"] == 240.0 / 4.4 / 74.0
    assert [r["jax"]["peak_gflops"] for r in floored["rounds"]] == [80.0, 74.0, 90.0]
    assert sorted(bench.all_peak_readings(three)) == sorted(
        [80.0, 75.0, 70.0, 72.0, 90.0, 60.0, *3 * toy_rows["torch"]["peak_readings"]])
    report = {"machine": bench.machine_description(), "matmul_peak_gflops": 90.0, "matmul_peak_median": 74.0,
              "train": judged(rounds(), floor=74.0), "seconds": 60.0, "encode": None, "data": None}
    text = render_markdown(json.loads(json.dumps(report)))
    assert ("- small: JAX reaches **73.7%** of the matmul peak read beside its own timed steps (target 75%: not met): "
            "the median of its 3 rounds by that figure (of an even count, the lower), each against the higher of "
            "the readings just before and just after its steps, or the run's median reading (74.0) if that is higher: "
            "75.0% (4.000 s; peak 80.0 / 75.0), 73.7% (4.400 s; peak 70.0 / 72.0), 63.5% (4.200 s; peak 90.0 / 60.0). "
            "Against the run's highest reading (90.0 GFLOP/s) the same round is at 60.6%. JAX's median rate over "
            "its 3 rounds against the median of the run's readings (74.0 GFLOP/s), which pairs no step with a "
            "reading: 77.2%.") in text
    # The unpaired figure: the median of the rates 60, 54.5 and 57.1 GFLOP/s over the median reading.
    assert floored["jax_median_of_median_peak"] == pytest.approx(240.0 / 4.2 / 74.0)
    assert two["jax_median_of_median_peak"] is None  # no readings in the run: no figure, not a division by zero


def test_report_renders_every_section(toy_rows, tmp_path):
    jax_row, torch_row = dict(toy_rows["jax"]), dict(toy_rows["torch"])  # judge_peak writes into rows
    xla_row = {**jax_row, "cpu_plugin": False, "step_seconds": jax_row["step_seconds"] * 1.25}
    rounds = [{"jax": jax_row, "jax_xla": xla_row, "torch": torch_row, "ratio": 1.5}]
    train = {"peers": [{"encoder": "t5", **bench.summarize_rounds("tiny", 8, rounds), "round_ratios": [1.4, 1.5, 1.6]}],
             "gradcache": [{**toy_rows["jax"], "batch": 64, "num_chunks": 2}, {**toy_rows["jax"], "batch": 1536, "num_chunks": 48}],
             "gradcache_rss_1536_over_64": 1.03}
    bench.judge_peak(train, floor=0.0)
    report = {"machine": bench.machine_description(), "matmul_peak_gflops": 300.0, "train": train, "seconds": 60.0,
              "encode": None, "data": None, "matmul_peak_measurements": [290.0, 300.0], "matmul_peak_lowest": 250.0}
    text = render_markdown(json.loads(json.dumps(report)))
    assert ("before and after the train steps: 290.0 and 300.0, and beside each case's timed steps; the highest "
            "of them all): **300.0 GFLOP/s**. The readings ranged from 250.0 to 300.0 GFLOP/s (20% apart).") in text
    report["matmul_peak_lowest"] = 180.0
    assert "(67% apart): the machine's speed moved during the run" in render_markdown(report)
    assert "T5 1.1 tiny batch 8: JAX / PyTorch = **1.50x** (target 1.3x: met). Median of 3 interleaved rounds: 1.40, 1.50, 1.60." in text
    assert f"| T5 1.1 tiny | 8 | {jax_row['step_seconds']:.3f} | {xla_row['step_seconds']:.3f} | **1.25x** | 1.25 |" in text
    assert "batch 1536 / batch 64: **1.03x** (target at most 1.2x: met)" in text
    assert text.count("Not run, or failed") == 3  # encode, data and cache sections say so rather than vanish
    cache = {"task": "rankgen_folder_inbook", "cache_copies": 4, "cache_documents": 28, "shuffle_block_documents": 2,
             "source_shards": 8, "beam_examples": 12288, "beam_groups": 384, "batch_size": 32, "prefix_length": 256,
             "continuation_length": 128, "beam_1_worker_seconds": 40.0, "beam_1_worker_examples_per_second": 307.2,
             "beam_2_workers_seconds": 25.0, "beam_2_workers_examples_per_second": 491.52, "beam_2_vs_1_workers": 1.6,
             "seqio_examples_per_second": 2000.0, "cached_examples_per_second": 9000.0, "cached_vs_uncached_read": 4.5,
             "synthetic_step_seconds": 0.5, "synthetic_step_seconds_best": 0.49, "real_step_seconds": 0.51,
             "real_step_seconds_best": 0.5, "real_vs_synthetic_paired": 0.02, "cached_step_seconds": 0.52,
             "cached_step_seconds_best": 0.5, "cached_vs_synthetic_paired": 0.06, "step_seconds_spread": 0.1}
    text = render_markdown(json.loads(json.dumps({**report, "data_cache": cache})))
    assert "| Beam, DirectRunner, 2 worker processes | 25.0 | 492 |" in text
    assert ("2 Beam workers vs 1: **1.60x** the speed; reading the cache is **4.5x** building uncached. Cached-data step "
            "time vs synthetic: **+6.0%** paired per round (rounds differ by up to 10%), target within 5%: not met.") in text

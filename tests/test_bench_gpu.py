"""`make bench-gpu` plumbing (benchmarks.gpu) at a tiny size on CPU, so that the GPU command never rots.

The figures here are CPU figures of a toy model: only the plumbing is checked (both frameworks
time the same work, the derived MFU and ratios follow from the rows, the report renders).
The tests that run the cases take one to four minutes on two cores (three bf16 compiles on
eight fake devices): they are marked slow, and `make test-all` runs them.
"""

import dataclasses
import json
import time

import pytest

from benchmarks import gpu
from benchmarks.report import marked_sections, replace_section

TINY = gpu.Settings(sizes=("tiny",), prefix_length=16, continuation_length=8, batch=8, gradcache_batch=16, steps=1,
                    device="cpu", precision="bfloat16", torch_compile=False, matmul_size=128, encode_passages=16,
                    encode_batch=8, rerank_prefixes=1, lm_size="tiny", budget_s=600)


@pytest.fixture(scope="module")
def report():
    deadline = time.time() + 600
    jax_side = gpu.run_jax(TINY, deadline)
    batches = {r["size"]: r["batch"] for r in jax_side["train"] if r["num_chunks"] == 1}
    report = {"settings": dataclasses.asdict(TINY), "date": "today", "jax": jax_side,
              "torch": gpu.run_torch(TINY, deadline, batches), "rerank": None, "seconds": 1.0}
    gpu.derive(report)
    return json.loads(json.dumps(report))


@pytest.mark.slow
def test_both_frameworks_time_the_same_step(report):
    (plain, cached), (peer,) = report["jax"]["train"], report["torch"]["train"]
    assert (plain["num_chunks"], cached["num_chunks"], cached["batch"]) == (1, 2, 16)
    assert peer["batch"] == plain["batch"] == 8 and peer["sdpa"] and peer["precision"] == "bfloat16"
    for row in (plain, cached, peer):
        assert row["step_seconds"] > 0 and len(row["peak_readings"]) == 2 and min(row["peak_readings"]) > 0
        # Work per step: batch x (prefix + positive + negative) tokens, on either side.
        assert row["tokens_per_second"] * row["step_seconds"] == pytest.approx(row["batch"] * (16 + 8 + 8))
        assert row["mfu_measured_peak"] == pytest.approx(
            row["model_tflops_per_step"] / row["step_seconds"] / max(row["peak_readings"]))
        assert row["mfu_nominal"] is None  # no nominal figure for a CPU
    assert report["ratios"]["train_tiny"] == pytest.approx(plain["tokens_per_second"] / peer["tokens_per_second"])
    assert report["ratios"]["gradcache_over_plain_tiny"] == pytest.approx(
        cached["tokens_per_second"] / plain["tokens_per_second"])
    encodes = {r["framework"]: r for side in ("jax", "torch") for r in report[side]["encode"]}
    assert encodes["jax"]["passages"] == encodes["torch"]["passages"] == 16
    assert encodes["jax"]["vector_dtype"] == encodes["torch"]["vector_dtype"].replace("torch.", "") == "float32"


@pytest.mark.slow
def test_report_renders_and_keeps_other_sections(report):
    text = gpu.render(report)
    assert "| jax | tiny | 8 | plain |" in text and "| jax | tiny | 16 | GradCache x2 |" in text
    assert "| torch | tiny | 8 | plain |" in text and "Re-ranking share: not run, or failed." in text
    doc = replace_section("# Benchmarks\n\nCPU tables\n", gpu.SECTION, text)
    assert doc.startswith("# Benchmarks\n\nCPU tables\n\n<!-- gpu benchmark: start -->")
    again = replace_section(doc, gpu.SECTION, "new")
    assert again.count("benchmark: start") == 1 and "new" in again and "GradCache x2" not in again
    assert marked_sections(again + "more") == ["<!-- gpu benchmark: start -->\nnew\n<!-- gpu benchmark: end -->"]


def test_a_case_past_the_deadline_is_recorded_as_skipped():
    side = gpu.run_torch(TINY, time.time() - 1, {"tiny": 8})
    assert side["train"] == [{"framework": "torch", "size": "tiny", "skipped": "time budget"}]
    assert "skipped: time budget" in gpu.render({"settings": dataclasses.asdict(TINY), "date": "d", "torch": side,
                                                 "seconds": 0.0})


def test_gradcache_chunks_split_evenly_into_chunks_that_fit():
    assert gpu.gradcache_chunks(1536, 200) == 8  # 192 rows each
    assert gpu.gradcache_chunks(1536, 1536) == 1
    assert gpu.gradcache_chunks(1536, 100) == 16  # 96
    assert gpu.gradcache_chunks(16, 8) == 2


@pytest.mark.slow
def test_the_whole_command_runs(tmp_path):
    """benchmarks.gpu's main as `make bench-gpu` runs it (three processes, the re-ranking one too), tiny, on CPU."""
    args = [f"--{k}={' '.join(v) if isinstance(v, tuple) else v}" for k, v in dataclasses.asdict(TINY).items()]
    args = [a for a in args if not a.startswith("--sizes")] + ["--sizes", "tiny"]
    assert gpu.main([*args, "--out", str(tmp_path / "gpu.json"), "--report", str(tmp_path / "bench.md")]) == 0
    report = json.loads((tmp_path / "gpu.json").read_text())
    assert report["rerank"]["results"][0]["rerank_share"] > 0
    assert "<!-- gpu benchmark: start -->" in (tmp_path / "bench.md").read_text()

"""generation-sweep: the paper's App. A.3 grid expands to its configurations; a tiny grid runs, reports MAUVE over the
seeds and time, and resumes."""

import json

import pytest

from rankgen_jax.cli.main import run_command
from rankgen_jax.errors import RankgenError
from rankgen_jax.experiments.generation_sweep import GenerationConfig, grid_configs, read_generation_grid
from rankgen_jax.testing import botchan_prefixes, build_tiny_gpt2

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def test_paper_grid_is_appendix_a3():
    grid = read_generation_grid("generation/grid_paper_a3.json")
    assert grid["rerank_lengths"] == [5, 10, 20, 50, "max"] and grid["max_new_tokens"] == 128
    assert grid["samples"] == [[1, 1], [1, 5], [1, 10], [2, 5], [1, 20], [2, 10], [4, 5], [1, 40], [2, 20]]
    assert len(grid["seeds"]) == 5 and grid["top_p"] == 0.9  # the paper's five runs, nucleus p = 0.9
    configs = grid_configs(grid)
    # 5 lengths x 8 re-ranked [B, N] + one plain sample (B = N = 1 at any L), and full re-ranking at new N.
    assert GenerationConfig(None, 1, 1) in configs and sum(c.beam_size == c.num_samples == 1 for c in configs) == 1
    assert GenerationConfig(20, 2, 10) in configs  # the paper's best
    full = {c.num_samples for c in configs if c.rerank_length is None and c.beam_size == 1}
    assert full == {1, 5, 10, 20, 40, 60, 80}
    assert len(configs) == 5 * 8 + 1 + 2  # 60 and 80 samples are new; 1, 5, 10, 20, 40 at L = max are there
    assert GenerationConfig(None, 2, 10).name == "Lmax_B2_N10"


def test_grid_file_errors(tmp_path):
    path = tmp_path / "g.json"
    for body, message in (({"samples": [[1, 2]]}, "'seeds'"), ({"seeds": [0]}, "no configuration"),
                          ({"seeds": [0], "rerank_lengths": [0], "samples": [[1, 2]]}, "rerank_lengths"),
                          ({"seeds": [0], "rerank_lengths": [5], "samples": [[1]]}, "samples"),
                          ({"seeds": [0], "full_rerank_samples": [2], "beam": 3}, "keys among")):
        path.write_text(json.dumps(body))
        with pytest.raises(RankgenError, match=message):
            read_generation_grid(str(path))
    with pytest.raises(RankgenError, match="no such grid file"):
        read_generation_grid(str(tmp_path / "missing.json"))


@pytest.fixture(scope="module")
def lm_dir(tmp_path_factory, one_torch_thread):
    return build_tiny_gpt2(tmp_path_factory.mktemp("gpt2_sweep"), n_positions=512)


def test_tiny_grid_reports_mauve_over_seeds_and_time_and_resumes(lm_dir, tmp_path):
    pytest.importorskip("mauve")
    from rankgen_jax.eval.generation_metrics import MauveSettings, mauve_report
    from rankgen_jax.lm.scoring import load_causal_lm

    texts = botchan_prefixes(24)
    source = tmp_path / "prefixes.jsonl"
    source.write_text("".join(json.dumps({"prefix": texts[i], "continuation": texts[i + 12] + " And so"}) + "\n"
                              for i in range(12)), encoding="utf-8")
    grid = tmp_path / "grid.json"
    grid.write_text(json.dumps({"rerank_lengths": [4, "max"], "samples": [[1, 1], [2, 2]], "seeds": [0, 1],
                                "max_new_tokens": 10, "prefixes": 10}))
    argv = ["generation-sweep", "--grid", str(grid), "--lm", lm_dir, "--input", str(source), "--workdir",
            str(tmp_path / "run"), "--reranker", "unigram", "--reference_field", "continuation", "--mauve_model",
            lm_dir, "--no_progress"]
    result = run_command(argv)
    rows = result["rows"]
    assert list(rows) == ["Lmax_B1_N1", "L4_B2_N2", "Lmax_B2_N2"]
    for name, row in rows.items():
        assert row["seeds"] == 2 and len(row["mauve_runs"]) == 2 and 0 < row["mauve"] <= 1
        assert row["seconds_per_generation"] > 0 and row["mean_new_tokens"] <= 10
        runs = [[json.loads(line) for line in (tmp_path / "run" / name / f"seed{s}.jsonl").read_text().splitlines()]
                for s in (0, 1)]
        assert [len(r) for r in runs] == [10, 10]  # the grid's first 10 prefixes
        want = mauve_report(runs, MauveSettings(lm_dir, "continuation"), load_causal_lm(lm_dir))
        assert row["mauve"] == pytest.approx(want["mauve"]) and row["mauve_std"] == pytest.approx(want["mauve_std"])
    assert rows["Lmax_B1_N1"]["rerank_share"] == 0.0 and rows["L4_B2_N2"]["rerank_share"] > 0
    table = (tmp_path / "run" / "generation_grid.md").read_text()
    assert "| L4_B2_N2 | 4 | 2 | 2 | 4 |" in table and "±" in table
    # A rerun keeps every finished seed and only recomputes the metrics.
    stamps = {p: p.stat().st_mtime_ns for p in (tmp_path / "run").glob("*/seed*.jsonl")}
    again = run_command(argv)
    assert {p: p.stat().st_mtime_ns for p in stamps} == stamps
    assert again["rows"]["L4_B2_N2"]["mauve"] == pytest.approx(rows["L4_B2_N2"]["mauve"])
    with pytest.raises(RankgenError, match="needs --model"):
        run_command(argv[:argv.index("--reranker")] + ["--no_progress"])

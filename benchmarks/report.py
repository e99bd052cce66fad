"""docs/benchmarks.md from the JSON report `make bench` writes (benchmarks.bench)."""

from __future__ import annotations

import json
import re
from pathlib import Path

# The speed-ups the JAX train step is meant to reach: JAX's tokens/s over the PyTorch peer's at
# the peer cases (T5 1.1 tiny at batch 32: 1.3x; small at batch 16: at least as fast).
TARGETS = {"tiny": 1.3, "small": 1.0}
PEAK_TARGET = 0.75  # fraction of the measured matmul peak at T5 1.1 small


def write_json(path: str | Path, data: dict) -> None:
    """Write a benchmark result as indented JSON (creating its folder) and say where."""
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    Path(path).write_text(json.dumps(data, indent=2) + "\n")
    print(f"wrote {path}")


def _markers(name: str) -> tuple[str, str]:
    return f"<!-- {name} benchmark: start -->", f"<!-- {name} benchmark: end -->"


def replace_section(text: str, name: str, body: str) -> str:
    """`text` with its marked `name` section set to body (appended, marked, where it has none)."""
    start, end = _markers(name)
    block = f"{start}\n{body.rstrip()}\n{end}\n"
    if start in text and end in text:
        return text[: text.index(start)] + block + text[text.index(end) + len(end):].lstrip("\n")
    return text.rstrip("\n") + ("\n\n" if text.strip() else "") + block


def marked_sections(text: str) -> list[str]:
    """The marked sections of text, markers included (what a rewrite of the rest keeps)."""
    pattern = r"<!-- (\S+) benchmark: start -->.*?<!-- \1 benchmark: end -->"
    return [m.group(0) for m in re.finditer(pattern, text, re.S)]


def _table(header: list[str], rows: list[list[str]]) -> list[str]:
    return ["| " + " | ".join(header) + " |", "|" + "---|" * len(header), *("| " + " | ".join(r) + " |" for r in rows)]


def _mode(row: dict) -> str:
    return f"GradCache x{row['num_chunks']} (chunk {row['batch'] // row['num_chunks']})" if row["num_chunks"] > 1 else "plain"


def _setting_note(report: dict) -> str:
    """What a run that was not the full one left out."""
    setting = report.get("setting", "quick" if report.get("quick") else "full")
    return {"full": "", "quick": " (quick run: tiny cases only)",
            "smoke": " (smoke run: every process at toy shapes for one step; the numbers mean nothing)"}[setting]


def model_name(row: dict) -> str:
    """The encoder a row or peer case timed: `T5 1.1 tiny`, or `MiniLM-L6` (the demo's step)."""
    return "MiniLM-L6" if row.get("encoder") == "minilm" else f"T5 1.1 {row['size']}"


def _peak_readings(report: dict) -> str:
    """', before and after the train steps: a and b; ...' where both were measured."""
    readings = report.get("matmul_peak_measurements")
    if not readings or len(readings) < 2:
        return ""
    return (f", before and after the train steps: {readings[0]:.1f} and {readings[1]:.1f}, and beside each "
            "case's timed steps; the highest of them all")


# Readings further apart than this within one run mean the machine's speed moved (other work on
# the host): a shared machine has read 182-305 GFLOP/s within 40 s while its steps held within 8%.
STEADY_PEAK_SPREAD = 1.25


def _peak_spread(report: dict) -> str:
    """' The readings ranged from a to b ...' with a warning when they are far apart; '' if unknown."""
    lowest, highest = report.get("matmul_peak_lowest"), report["matmul_peak_gflops"]
    if not lowest:
        return ""
    line = f" The readings ranged from {lowest:.1f} to {highest:.1f} GFLOP/s ({highest / lowest - 1:.0%} apart)"
    if highest / lowest <= STEADY_PEAK_SPREAD:
        return line + "."
    return (line + ": the machine's speed moved during the run, so a % of peak below depends on which readings "
            "fell beside the steps about as much as on the steps; compare the steps' own times and the JAX / "
            "PyTorch ratios, which were timed side by side.")


def _of_peak_note(pair: dict, report: dict) -> str:
    """The small case's % of peak line: JAX's median round against the peak read beside it."""
    chosen, run_peak = pair["jax_for_peak"], report["matmul_peak_gflops"]
    frac = chosen["of_peak"]
    rounds = [r["jax"] for r in pair["rounds"]]
    each = ", ".join(f"{row['of_peak']:.1%} ({row['step_seconds']:.3f} s; peak "
                     f"{' / '.join(f'{p:.1f}' for p in row['peak_readings'])})" for row in rounds)
    return (f"- small: JAX reaches **{frac:.1%}** of the matmul peak read beside its own timed steps "
            f"(target {PEAK_TARGET:.0%}: {'met' if frac >= PEAK_TARGET else 'not met'}): the median of its "
            f"{len(rounds)} rounds by that figure (of an even count, the lower), each against the higher of the "
            f"readings just before and just after its steps, or the run's median reading "
            f"({report['matmul_peak_median']:.1f}) if that is higher: {each}. Against the run's highest reading "
            f"({run_peak:.1f} GFLOP/s) the same round is at {chosen['train_gflops_per_second'] / run_peak:.1%}."
            f"{_median_of_median(pair, report)}")


def _median_of_median(pair: dict, report: dict) -> str:
    """' JAX's median rate ... against the run's median reading: x%.' where the report has it."""
    frac = pair.get("jax_median_of_median_peak")
    if frac is None:
        return ""
    return (f" JAX's median rate over its {len(pair['rounds'])} rounds against the median of the run's "
            f"readings ({report['matmul_peak_median']:.1f} GFLOP/s), which pairs no step with a reading: {frac:.1%}.")


def render_markdown(report: dict) -> str:
    """The whole benchmarks page: machine, commands, then one table per benchmark."""
    machine, peak = report["machine"], report["matmul_peak_gflops"]
    lines = [
        "# Benchmarks",
        "",
        "Written by `make bench` (`python -m benchmarks.bench`); do not edit by hand. How the",
        "numbers were reached and what moved them: [the performance notes](performance/cpu-step.md).",
        "",
        f"- Date: {machine['date']}{_setting_note(report)}; "
        f"total time {report.get('seconds', 0) / 60:.1f} min.",
        f"- Machine: {machine['cpu']}, {machine['cores']} cores, {machine['memory_gib']:.0f} GiB, no accelerator.",
        f"- Software: Python {machine['python']}, jax {machine['jax']} (jaxlib {machine['jaxlib']}), flax {machine['flax']}, "
        f"torch {machine['torch']}, transformers {machine['transformers']}, numpy {machine['numpy']}.",
        f"- XLA_FLAGS: `{machine['xla_flags']}`; GLIBC_TUNABLES of the JAX processes: "
        f"`{machine.get('glibc_tunables') or 'none'}` (the PyTorch peer runs with glibc's defaults).",
        f"- fp32 matmul peak measured in the run (numpy, 2048^3, best of 5{_peak_readings(report)}): **{peak:.1f} GFLOP/s**."
        f"{_peak_spread(report)}",
        "",
        "## Train step: JAX against the PyTorch / HuggingFace peer",
        "",
        "RankGen step (prefix 256 + continuation 128 + negative 128 tokens, random ids, in-batch",
        "softmax over continuations and negatives, AdamW, fp32, 2 threads). PyTorch: HF",
        "`T5EncoderModel` with the same config, first-token pooling, bias-free projection",
        "(`benchmarks/torch_peer.py`). Median of the timed steps after one warm-up step; each",
        "process runs one framework, and (JAX, PyTorch) pairs run in interleaved rounds, the",
        "table showing the round with the median ratio (of an even count, the lower);",
        "GFLOP/s are analytical (3x the forward matmul FLOPs) over the median step time. \"beside\":",
        "against the higher of two peak readings taken in the same process just before and just after",
        "the timed steps, or the run's median reading if that is higher; \"run\": against the highest",
        "reading of the whole run. The demo's step (MiniLM-L6): batch 32, prefix 128 + continuation 128, no",
        "negative, mean pooling, L2 and logit scale 20 on both sides (HF `BertModel` for PyTorch). JAX runs",
        "with the CPU plug-in (`rankgen_jax_cpu`); the next section has it without.",
        "",
    ]
    train = report["train"]
    rows = []
    for pair in train["peers"]:
        for framework in ("jax", "torch"):
            r = pair[framework]
            rows.append([framework, model_name(r), str(r["batch"]), f"{r['step_seconds']:.3f}", f"{r['tokens_per_second']:,.0f}",
                         f"{r['train_gflops_per_second']:.1f}", f"{r['of_peak']:.1%}",
                         f"{r['train_gflops_per_second'] / peak:.1%}", f"{r['peak_rss_mib']:,.0f}"])
    lines += _table(["framework", "model", "batch", "s/step", "tokens/s", "GFLOP/s", "of peak (beside)",
                     "of peak (run)", "peak RSS MiB"], rows)
    lines += [""]
    for pair in train["peers"]:
        target = TARGETS.get(pair["size"])
        verdict = f" (target {target:.1f}x: {'met' if pair['jax_over_torch'] >= target else 'not met'})" if target else ""
        rounds = pair.get("round_ratios", [pair["jax_over_torch"]])
        spread = f" Median of {len(rounds)} interleaved rounds: {', '.join(f'{r:.2f}' for r in rounds)}." if len(rounds) > 1 else ""
        lines.append(f"- {model_name(pair)} batch {pair['batch']}: JAX / PyTorch = **{pair['jax_over_torch']:.2f}x**"
                     f"{verdict}.{spread}")
        if pair["size"] == "small":
            lines.append(_of_peak_note(pair, report))
    lines += _plugin_section(train["peers"])
    lines += ["", "## GradCache memory", "",
              "Tiny T5 1.1, chunks of 32 examples; peak RSS of the whole process (the model, optimizer state,",
              "compiled code and batch included).", ""]
    rows = [[str(r["batch"]), _mode(r), f"{r['step_seconds']:.3f}", f"{r['tokens_per_second']:,.0f}",
             f"{r['peak_rss_mib']:,.0f}"] for r in train["gradcache"]]
    lines += _table(["batch", "mode", "s/step", "tokens/s", "peak RSS MiB"], rows)
    if train.get("gradcache_rss_1536_over_64"):
        ratio = train["gradcache_rss_1536_over_64"]
        lines += ["", f"- Peak RSS at batch 1536 / batch 64: **{ratio:.2f}x** (target at most 1.2x: "
                      f"{'met' if ratio <= 1.2 else 'not met'}). Loss and gradients equal plain backprop: "
                      "`tests/test_train_step.py`."]
    lines += _encode_section(report.get("encode"))
    lines += _data_section(report.get("data"))
    lines += _cache_section(report.get("data_cache"))
    return "\n".join(lines) + "\n"


def _plugin_section(peers: list[dict]) -> list[str]:
    """Each peer case's JAX step with the CPU plug-in and with XLA alone, from the same interleaved rounds."""
    measured = [pair for pair in peers if "cpu_plugin_speedup" in pair]
    lines = ["", "## The CPU plug-in", ""]
    if not measured:
        return lines + ["Not measured in this run."]
    lines += ["The JAX step of each case above with the CPU plug-in (`rankgen-jax-cpu`: the C++ kernels, glibc malloc",
              "on huge pages, the XLA flag without YNNPACK fusions) and without it (XLA alone, glibc's defaults), each",
              "process in turn within every round; medians over the rounds, and the median of the rounds' ratios.", ""]
    rows = [[model_name(pair), str(pair["batch"]), f"{pair['jax_step_seconds']:.3f}", f"{pair['jax_xla_step_seconds']:.3f}",
             f"**{pair['cpu_plugin_speedup']:.2f}x**", ", ".join(f"{r:.2f}" for r in pair["cpu_plugin_speedups"])]
            for pair in measured]
    return lines + _table(["model", "batch", "s/step with the plug-in", "s/step XLA alone", "speed-up",
                           "rounds"], rows)


def _encode_section(row: dict | None) -> list[str]:
    lines = ["", "## Encoding for retrieval (`rankgen-jax index` path)", ""]
    if not row:
        return lines + ["Not run, or failed (see the output of `make bench`)."]
    lines += [
        f"Random-init T5 1.1 {row['size']} RankGen encoder, {row['num_texts']:,} passages of the bundled books "
        f"({row['mean_tokens']:.0f} tokens on average, max {row['max_length']}), batch {row['batch_size']}, "
        f"`{row.get('side', row.get('kind'))}` inputs. JAX: `dense_index.encode_all` (length buckets); PyTorch: the exported folder "
        f"through `AutoModel(trust_remote_code)`, batches sorted by length and padded to their longest row, "
        f"{row['torch_threads']} threads. Fastest of {row['repeats']} passes each, tokenising included.",
        "",
    ]
    lines += _table(["framework", "seconds", "sentences/s", "tokens/s", "padding waste"], [
        ["jax", f"{row['jax_seconds']:.2f}", f"{row['jax_sentences_per_second']:,.0f}",
         f"{row['jax_tokens_per_second']:,.0f}", f"{row['jax_padding_waste']:.1%}"],
        ["torch", f"{row['torch_seconds']:.2f}", f"{row['torch_sentences_per_second']:,.0f}",
         f"{row['torch_tokens_per_second']:,.0f}", f"{row['torch_padding_waste']:.1%}"],
    ])
    ratio = row["jax_over_torch"]
    return lines + [
        "",
        f"- JAX / PyTorch sentences/s = **{ratio:.2f}x** (target at least 1.0x: {'met' if ratio >= 1.0 else 'not met'}); "
        f"vectors agree to {row['max_abs_diff']:.1e} (largest entry {row['max_abs_vector']:.2f}).",
        f"- JAX compile: {row['jax_compile_seconds']:.1f} s for {row['jax_compiled_shapes']} shapes, outside the timed "
        f"passes ({row['jax_shapes_compiled_while_timed']} compiled while timed).",
    ]


def _data_section(row: dict | None) -> list[str]:
    lines = ["", "## Input pipeline", ""]
    if not row:
        return lines + ["Not run, or failed (see the output of `make bench`)."]
    lines += [
        f"Sources alone at the train step's shapes (batch {row['batch_size']}, prefix {row['prefix_length']}, "
        f"continuation {row['continuation_length']} + negative), then the T5 1.1 {row['size']} train step fed three "
        f"ways in {row['rounds']} interleaved rounds of {row['steps']} steps: synthetic batches already on the device, "
        "seqio batches through the trainer's prefetch thread (`train.loop.prefetch_batches`, as the train loop), and random "
        "batches through the same thread.",
        "",
    ]
    lines += _table(["source", "examples/s", "headroom over the step"], [
        [f"seqio `{row['task']}`", f"{row['seqio_examples_per_second']:,.0f}", f"{row['seqio_headroom']:.0f}x"],
        *([["in-memory examples (`make demo`)", f"{row['examples_examples_per_second']:,.0f}",
            f"{row['examples_headroom']:.0f}x"]] if "examples_examples_per_second" in row else []),
        ["random", f"{row['random_examples_per_second']:,.0f}", ""],
        ["train step consumption", f"{row['synthetic_examples_per_second']:,.1f}", ""],
    ])
    lines += [""]
    lines += _table(["step fed by", "s/step (mean)", "s/step (best round)", "vs synthetic"], [
        ["synthetic (on device)", f"{row['synthetic_step_seconds']:.3f}", f"{row['synthetic_step_seconds_best']:.3f}", ""],
        ["seqio via prefetch", f"{row['real_step_seconds']:.3f}", f"{row['real_step_seconds_best']:.3f}",
         f"{row['real_vs_synthetic']:+.1%}"],
        ["random via prefetch", f"{row['prefetch_random_step_seconds']:.3f}",
         f"{row['prefetch_random_step_seconds_best']:.3f}", f"{row['prefetch_random_vs_synthetic']:+.1%}"],
    ])
    # The paired ratio (median over rounds of each round's ratio) cancels load that drifts between rounds.
    paired = row["real_vs_synthetic_paired"]
    return lines + ["", f"- Real-data step time vs synthetic: **{paired:+.1%}** paired per round "
                        f"({row['real_vs_synthetic']:+.1%} on means; rounds differ by up to {row['step_seconds_spread']:.0%}), "
                        f"target within 5%: {'met' if abs(paired) <= 0.05 else 'not met'}. The random source through "
                        f"the same prefetch thread: {row['prefetch_random_vs_synthetic_paired']:+.1%}. First seqio batch "
                        f"{row['seqio_first_batch_seconds']:.1f} s."]


def _cache_section(row: dict | None) -> list[str]:
    lines = ["", "## Beam cache (`rankgen-jax cache-tasks`) and training from it", ""]
    if not row:
        return lines + ["Not run, or failed (see the output of `make bench`; it needs the beam extra)."]
    lines += [
        f"Task `{row['task']}` over the bundled books copied {row['cache_copies']} times ({row['cache_documents']} "
        f"documents, blocks of {row['shuffle_block_documents']}, {row['source_shards']} source shards); both splits, "
        f"{row['beam_examples']:,} examples in {row['beam_groups']:,} groups of {row['batch_size']}. Beam wall time runs "
        "from pipeline start to the merged stats (worker start-up included); the reads are one process each, as the "
        f"trainer reads (batch {row['batch_size']}, prefix {row['prefix_length']}, continuation "
        f"{row['continuation_length']} + negative).",
        "",
    ]
    lines += _table(["what", "seconds", "examples/s"], [
        ["Beam, DirectRunner, 1 worker", f"{row['beam_1_worker_seconds']:.1f}",
         f"{row['beam_1_worker_examples_per_second']:,.0f}"],
        ["Beam, DirectRunner, 2 worker processes", f"{row['beam_2_workers_seconds']:.1f}",
         f"{row['beam_2_workers_examples_per_second']:,.0f}"],
        ["building the task uncached (1 process)", "", f"{row['seqio_examples_per_second']:,.0f}"],
        ["reading the cache (1 process)", "", f"{row['cached_examples_per_second']:,.0f}"],
    ])
    lines += [""]
    lines += _table(["step fed by", "s/step (mean)", "s/step (best round)", "vs synthetic (paired)"], [
        ["synthetic (on device)", f"{row['synthetic_step_seconds']:.3f}", f"{row['synthetic_step_seconds_best']:.3f}", ""],
        ["uncached seqio via prefetch", f"{row['real_step_seconds']:.3f}", f"{row['real_step_seconds_best']:.3f}",
         f"{row['real_vs_synthetic_paired']:+.1%}"],
        ["cached seqio via prefetch", f"{row['cached_step_seconds']:.3f}", f"{row['cached_step_seconds_best']:.3f}",
         f"{row['cached_vs_synthetic_paired']:+.1%}"],
    ])
    paired = row["cached_vs_synthetic_paired"]
    return lines + ["", f"- 2 Beam workers vs 1: **{row['beam_2_vs_1_workers']:.2f}x** the speed; reading the cache is "
                        f"**{row['cached_vs_uncached_read']:.1f}x** building uncached. Cached-data step time vs "
                        f"synthetic: **{paired:+.1%}** paired per round (rounds differ by up to "
                        f"{row['step_seconds_spread']:.0%}), target within 5%: {'met' if abs(paired) <= 0.05 else 'not met'}."]

"""Ahead-of-time TPU compilation: names, HBM and step-time arithmetic everywhere; real compiles with libtpu.

The compile tests need libtpu (tpu_scripts/aot_venv.sh makes .venv-aot with
it); they catch sharding regressions that only show with TPU layouts.
"""

import importlib.util
import json

import flax.linen as nn
import jax
import jax.numpy as jnp
import pytest
from jax.sharding import PartitionSpec

from rankgen_jax.cli.main import build_parser, main
from rankgen_jax.tpu import aot
from rankgen_jax.runtime import partitioning
from rankgen_jax.data.source_configs import BooksData, DataConfig, ListsData, RandomData
from rankgen_jax.errors import RankgenError
from rankgen_jax.models.batch_layout import CANDIDATE_LISTS, TRIPLES, BatchLayout
from rankgen_jax.train.gin_parsing import parse_gin

GIB = 1024**3

needs_libtpu = pytest.mark.skipif(
    importlib.util.find_spec("libtpu") is None,
    reason="libtpu not installed: run tpu_scripts/aot_venv.sh, then .venv-aot/bin/python -m pytest tests/test_aot.py",
)

# A tiny T5 with every feature whose sharding differs on TPU: FSDP over data, a
# model axis, scanned and rematerialised layers, bf16, GradCache chunks.
TINY_GIN = ["models/t5_1_1_tiny.gin"]
TINY_BINDINGS = [
    "t5_config.dtype='bfloat16'",
    "t5_config.scan_layers=True",
    "t5_config.remat=True",
    "DataConfig.source=@RandomData()",
    "DataConfig.batch_size=32",
    "DataConfig.prefix_length=64",
    "RandomData.continuation_length=32",
    "OptimizerConfig.name='adafactor'",
    "OptimizerConfig.schedule='constant'",
    "TrainerConfig.num_steps=1000",
    "TrainerConfig.axis_rules='fsdp'",
    "TrainerConfig.mesh_model=2",
    "TrainerConfig.num_chunks=2",
]


# --- without libtpu ------------------------------------------------------------------------


@pytest.mark.parametrize("name, grid", [
    ("v3-8", "v3:2x2"), ("v3-32", "v3:4x4"), ("v3-64", "v3:4x8"), ("v3-128", "v3:8x8"), ("v3-2048", "v3:32x32"),
    ("v2-8", "v2:2x2"), ("v4-8", "v4:2x2x1"), ("v4-16", "v4:2x2x2"), ("v4-64", "v4:2x4x4"), ("v4-128", "v4:4x4x4"),
    ("v4-256", "v4:4x4x8"), ("v5p-8", "v5p:2x2x1"), ("v5litepod-8", "v5e:2x4"), ("v5e-16", "v5e:4x4"),
    ("v5litepod-256", "v5e:16x16"), ("v5e-1", "v5e:1x1"), ("v6e-64", "v6e:8x8"),
])
def test_accelerator_types_map_to_chip_grids(name, grid):
    assert aot.parse_topology(name).libtpu_name == grid


@pytest.mark.parametrize("grid, chips, accelerator", [
    ("v3:8x8", 64, "v3-128"), ("v3:2x2", 4, "v3-8"), ("v4:4x4x4", 64, "v4-128"), ("v5e:16x16", 256, "v5litepod-256"),
    ("v5e:2x4", 8, "v5litepod-8"), ("v5p:2x2x1", 4, "v5p-8"),
])
def test_chip_grids_pass_through(grid, chips, accelerator):
    topology = aot.parse_topology(grid)
    assert (topology.libtpu_name, topology.chips, topology.accelerator_type) == (grid, chips, accelerator)
    assert aot.parse_topology(accelerator).libtpu_name == grid


@pytest.mark.parametrize("name, message", [
    ("v3-100", "power of two"), ("v3-7", "power of two"), ("v9-8", "unknown TPU generation"),
    ("tpu", "expected an accelerator type"), ("v3:0x4", "positive"), ("v3:8", "expected an accelerator type"),
])
def test_bad_topology_names_are_clear_errors(name, message):
    with pytest.raises(RankgenError, match=message):
        aot.parse_topology(name)


def test_hbm_and_peak_per_device():
    # v3: 2 TensorCores per chip, each its own jax device with half the chip's 32 GiB and 123 TFLOP/s.
    hbm, peak, per_chip = aot.device_specs(aot.parse_topology("v3-128"), 128)
    assert (hbm, peak, per_chip) == (16 * GIB, 61.5e12, 2)
    # v4 (megacore) and v5e: one device per chip.
    assert aot.device_specs(aot.parse_topology("v4-128"), 64) == (32 * GIB, 275e12, 1)
    assert aot.device_specs(aot.parse_topology("v5e:2x4"), 8) == (16 * GIB, 197e12, 1)
    assert aot.device_specs(aot.parse_topology("v5p-8"), 4)[0] == 95 * GIB
    with pytest.raises(RankgenError, match="split evenly"):
        aot.device_specs(aot.parse_topology("v3-8"), 6)


def test_implied_step_time_arithmetic():
    # 1.23e14 FLOPs at half of a v3 core's 61.5 TFLOP/s: 4 s.
    assert aot.step_time_seconds(1.23e14, 61.5e12, 0.5) == pytest.approx(4.0)
    # The paper's ~2 days for 100k XL steps is 1.728 s a step.
    assert aot.days_for_steps(1.728, 100_000) == pytest.approx(2.0)
    with pytest.raises(RankgenError, match="utilization"):
        aot.step_time_seconds(1.0, 1.0, 1.5)


# The paper's runs: gin file, topology, global batch, mesh.
PAPER_CONFIGS = [
    ("tpu/rankgen_xl_v3_256.gin", "v3-256", 1536, {"replica": 1, "data": 256, "model": 1}),
    ("tpu/rankgen_xl_v3_128.gin", "v3-128", 1536, {"replica": 1, "data": 128, "model": 1}),
    ("tpu/rankgen_large_v3_128.gin", "v3-128", 4096, {"replica": 1, "data": 128, "model": 1}),
    ("tpu/rankgen_base_v3_32.gin", "v3-32", 4096, {"replica": 1, "data": 32, "model": 1}),
]


@pytest.mark.parametrize("gin_file, topology, batch_size, mesh", PAPER_CONFIGS)
def test_paper_configs_parse(gin_file, topology, batch_size, mesh):
    from rankgen_jax.train.config import TrainerConfig

    from rankgen_jax.experiments.gin_runs import experiment_configurables

    # As `train` parses it: the recipe's data bind the seqio tasks' options, which the library alone does not know.
    parse_gin([gin_file], [], experiment_configurables)
    data, trainer = DataConfig(), TrainerConfig()
    assert (data.batch_size, data.prefix_length, data.source.continuation_length, data.source.with_negative) == (
        batch_size, 512, 128, True)
    assert trainer.num_steps == 100_000 and trainer.mesh_model == mesh["model"]


def _flops(f, *args):
    return aot.jaxpr_matmul_flops(jax.make_jaxpr(f)(*args).jaxpr)


def test_matmul_flops_count_every_scan_iteration():
    x, w = jnp.ones((8, 16)), jnp.ones((16, 16))
    one = 2 * 8 * 16 * 16

    def scanned(x, w):
        return jax.lax.scan(lambda c, _: (c @ w, None), x, None, length=10)[0]

    def unrolled(x, w):
        for _ in range(10):
            x = x @ w
        return x

    assert _flops(scanned, x, w) == _flops(unrolled, x, w) == 10 * one
    assert _flops(jax.jit(scanned), x, w) == 10 * one  # through a nested jit
    assert _flops(lambda x, w: jax.lax.cond(x[0, 0] > 0, lambda: x @ w @ w, lambda: x @ w), x, w) == 2 * one


def test_matmul_flops_count_remat_recomputation():
    x, w = jnp.ones((8, 16)), jnp.ones((16, 16))
    one = 2 * 8 * 16 * 16

    def loss(w, x):
        return jnp.sum(jnp.tanh(x @ w) @ w)

    plain = _flops(jax.grad(loss), w, x)
    remat = _flops(jax.grad(jax.checkpoint(loss)), w, x)
    assert plain == 5 * one  # 2 forward; backward: both weight gradients and the gradient into tanh
    assert remat == plain + one  # the first matmul runs again in the backward pass


@pytest.mark.parametrize("remat", [False, True])
def test_model_flops_are_the_steps_matmuls_without_recomputation(monkeypatch, remat):
    """models.flops (a formula) against the matmuls of the traced step (an independent count)."""
    from rankgen_jax.ops import dispatch
    from rankgen_jax.models.configs import HeadConfig, ModelConfig, t5_config
    from rankgen_jax.models.factory import build_model, init_params
    from rankgen_jax.models.flops import train_step_model_flops
    from rankgen_jax.train.step import StepOptions, compute_grads

    monkeypatch.setattr(dispatch, "active_kernels", lambda: None)  # a kernel plug-in hides its matmuls
    encoder = t5_config("tiny", vocab_size=128, dtype="float32", remat=remat)
    config = ModelConfig(encoder=encoder, head=HeadConfig("first", -1, False))
    batch = {"query_ids": jnp.ones((4, 32), jnp.int32), "positive_ids": jnp.ones((4, 16), jnp.int32),
             "negative_ids": jnp.ones((4, 16), jnp.int32)}
    jaxpr = jax.make_jaxpr(lambda p: compute_grads(build_model(config), StepOptions(), p, {}, batch, None))(
        init_params(config))
    ratio = aot.jaxpr_matmul_flops(jaxpr.jaxpr) / train_step_model_flops(
        encoder, {k: v.shape for k, v in batch.items()}, encoder.d_model)
    # Without remat the step's matmuls are the model's plus the scores and the position-bias lookup
    # (0.1% here); remat re-runs each layer's forward in the backward pass: a quarter more.
    assert (1.0 <= ratio < 1.002) if not remat else (1.2 < ratio < 1.34)


def test_batch_shapes_follow_data_config():
    triples = BatchLayout("dual_encoder", TRIPLES)
    data = DataConfig(BooksData(continuation_length=128), batch_size=16, prefix_length=512)
    assert aot.batch_shapes(data, triples) == {
        "query_ids": (16, 512), "positive_ids": (16, 128), "negative_ids": (16, 128)}
    no_negative = DataConfig(BooksData(continuation_length=4, with_negative=False), batch_size=4, prefix_length=8)
    assert set(aot.batch_shapes(no_negative, triples)) == {"query_ids", "positive_ids"}
    with pytest.raises(RankgenError, match="triples"):
        aot.batch_shapes(DataConfig(ListsData()), BatchLayout("cross_encoder", CANDIDATE_LISTS))
    with pytest.raises(RankgenError, match="triples"):
        aot.batch_shapes(DataConfig(RandomData()), BatchLayout("dual_encoder", CANDIDATE_LISTS))


def test_fsdp_rules_shard_activations_over_batch_and_params_over_embed():
    rules = list(partitioning.rules_by_name("fsdp"))
    activations = PartitionSpec(("replica", "data"), None, None)
    assert nn.logical_to_mesh_axes(("batch", "length", "embed"), rules) == activations
    assert nn.logical_to_mesh_axes(("embed", "mlp"), rules) == PartitionSpec("data", "model")


def test_missing_libtpu_is_a_clear_error(monkeypatch):
    monkeypatch.setattr(aot, "libtpu_available", lambda: False)
    with pytest.raises(RankgenError, match="libtpu is not installed.*aot_venv.sh"):
        aot.topology_devices(aot.parse_topology("v3-8"))


def _report(**memory) -> dict:
    mem = {"argument_bytes": GIB, "output_bytes": GIB, "alias_bytes": GIB, "temp_bytes": 2 * GIB,
           "generated_code_bytes": 0, "total_bytes": 3 * GIB, "hbm_bytes": 16 * GIB, "fits": True, **memory}
    return {"topology": "v3:8x8", "accelerator_type": "v3-128", "devices": 128, "device_kind": "TPU v3", "chips": 64,
            "hosts": 16, "mesh": {"replica": 1, "data": 128, "model": 1}, "axis_rules": "fsdp", "num_chunks": 12,
            "accum_steps": 1, "encoder": {"d_model": 2048, "num_layers": 24, "dtype": "bfloat16", "remat": True,
                                          "scan_layers": True},
            "params": 1_228_000_000, "batch": {"query_ids": [1536, 512]}, "memory": mem, "flops_per_device": 1e14,
            "model_flops_per_device": 8e13, "compiler_flops_per_device": 4e11, "peak_flops_per_device": 61.5e12,
            "num_steps": 100000, "timing": {"0.4": {"step_seconds": 4.07, "days": 4.7, "mfu_step_seconds": 3.25,
                                                   "mfu_days": 3.76}}, "compile_seconds": 100.0}


def test_format_report_lines():
    text = aot.format_report(_report())
    assert "argument 1.00 GiB + output 1.00 GiB - alias 1.00 GiB + temp 2.00 GiB = 3.00 GiB" in text
    assert "of 16.00 GiB HBM: fits" in text
    assert "at 40% of peak: 4.07 s/step, 4.7 days for 100000 steps; at 40% MFU: 3.25 s/step, 3.76 days" in text
    assert "model 8e+13 (6 N T + attention); compiled 1e+14 (matmuls, loops counted, re-forwards included: 1.25x" in text
    assert "DOES NOT FIT" in aot.format_report(_report(fits=False))


def test_mfu_the_papers_step_time_implies():
    # The XL recipe's model FLOPs on a v3-256 (the compile report: 3.305e13 per device, 256 devices) at the paper's
    # 100k steps in 2 days, against 128 chips of 123 TFLOP/s: about 31%.
    step = 2 * 86400 / 100_000
    assert step == pytest.approx(1.728)
    assert aot.implied_utilization(3.305e13 * 256, 128 * 123e12, step) == pytest.approx(0.311, abs=0.001)
    assert aot.implied_utilization(3.305e13, 61.5e12, step) == pytest.approx(0.311, abs=0.001)  # per device alike
    report = {**_report(), "implied_by_step_seconds": {"step_seconds": step, "days": 2.0, "mfu": 0.311,
                                                       "compiled_utilization": 0.393}}
    assert "at 1.728 s/step (2 days for 100000 steps): MFU 31.1%, compiled FLOPs at 39.3% of peak" in (
        aot.format_report(report))
    with pytest.raises(RankgenError, match="step seconds"):
        aot.implied_utilization(1.0, 1.0, 0.0)


def test_compile_subcommand_flags():
    args = build_parser().parse_args(["compile", "--topology", "v3-128", "--gin_file", "a.gin",
                                      "--gin_file", "b.gin", "--json", "out.json", "--utilization", "0.5"])
    assert (args.topology, args.gin_file, args.json) == ("v3-128", ["a.gin", "b.gin"], "out.json")
    assert args.utilization == [0.5] and args.hlo_out is None
    assert build_parser().parse_args(["compile", "--topology", "v3-8", "--gin_file", "a.gin"]).utilization == [0.4, 0.6]
    with pytest.raises(SystemExit):
        build_parser().parse_args(["compile", "--gin_file", "a.gin"])  # --topology is required


def test_compile_exits_with_an_error_when_buffers_exceed_hbm(monkeypatch, tmp_path, capsys):
    # The compiler accepted the program, but argument + output - alias + temp + code is more than the chip has.
    monkeypatch.setattr(aot, "compile_train_step", lambda *a, **k: _report(total_bytes=17 * GIB, fits=False))
    out = tmp_path / "report.json"
    with pytest.raises(RankgenError, match="17.00 GiB .* exceeds the 16.00 GiB of HBM of a TPU v3 device"):
        aot.run_compile("v3-128", json_out=str(out))
    assert "DOES NOT FIT" in capsys.readouterr().out
    assert json.loads(out.read_text())["memory"]["fits"] is False
    # Through the command line: the same report, then the error as one line and exit status 2.
    out.unlink()
    assert main(["compile", "--topology", "v3-128", "--gin_file", "models/t5_1_1_tiny.gin", "--json", str(out)]) == 2
    captured = capsys.readouterr()
    assert "DOES NOT FIT" in captured.out
    assert captured.err.startswith("error: does not fit v3:8x8 with mesh") and captured.err.count("\n") == 1
    assert "per-device memory 17.00 GiB" in captured.err and "compile --plan" in captured.err
    assert json.loads(out.read_text())["memory"]["fits"] is False


def test_a_step_the_compiler_refuses_still_gets_its_report_and_what_to_change(monkeypatch, tmp_path):
    refused = {key: value for key, value in _report().items() if key not in ("params", "memory", "timing")}
    refused.update(error="RESOURCE_EXHAUSTED: Ran out of memory on HBM, the total memory required for HLO "
                         "temporaries (16.87G) exceeds available HBM (15.48G).",
                   memory={"fits": False, "hbm_bytes": 16 * GIB, "needed_bytes": aot._needed_bytes(
                       "temporaries (16.87G) exceeds available HBM (15.48G)")})
    refused["encoder"] = {**refused["encoder"], "remat": False}
    monkeypatch.setattr(aot, "compile_train_step", lambda *a, **k: refused)
    out = tmp_path / "report.json"
    with pytest.raises(RankgenError) as caught:
        aot.run_compile("v3-128", json_out=str(out))
    message = str(caught.value)
    assert "global batch 1536, num_chunks 12, remat False, axis_rules 'fsdp'" in message
    assert "raise TrainerConfig.num_chunks" in message and "remat = True" in message and "axis_rules = 'fsdp'" not in \
        message.split("To fit it:")[1]
    assert json.loads(out.read_text())["memory"]["needed_bytes"] == int(16.87 * GIB)


def test_plan_settings_try_gins_own_first_then_each_group_by_chunks():
    groups = aot.plan_settings(aot.StepSetting(4, True, "fsdp"), chunks=(1, 2, 4, 8))
    assert [(g[0].axis_rules, g[0].remat) for g in groups] == [("fsdp", True), ("fsdp", False), ("standard", True),
                                                              ("standard", False)]
    assert [s.num_chunks for s in groups[0]] == [4, 8] and [s.num_chunks for s in groups[1]] == [1, 2, 4, 8]


def test_the_plan_picks_the_fewest_flops_of_the_first_fits(monkeypatch, tmp_path, capsys):
    """Each group stops at its first setting that fits; of those the fewest compiled FLOPs (loops counted) wins."""
    compiled = []

    def fake_compile(topology, utilizations=(), setting=None, **_):
        compiled.append(setting)
        if setting.num_chunks < (2 if setting.axis_rules == "fsdp" else 4):
            return {**_report(fits=False), "error": "RESOURCE_EXHAUSTED: too big", "memory": {
                "fits": False, "hbm_bytes": 16 * GIB, "needed_bytes": None}}
        flops = 1e11 * setting.num_chunks + (5e10 if setting.remat else 0)
        # XLA's figure counts a loop body once: it must not decide (here it would pick the most chunks).
        return {**_report(), "flops_per_device": flops, "compiler_flops_per_device": flops / setting.num_chunks ** 2,
                "num_chunks": setting.num_chunks}

    monkeypatch.setattr(aot, "compile_train_step", fake_compile)
    parse_gin(TINY_GIN, ["TrainerConfig.num_chunks=1", "t5_config.remat=False", "TrainerConfig.axis_rules='standard'"])
    out = tmp_path / "plan.json"
    plan = aot.run_plan("v3-8", json_out=str(out))
    assert [(s.axis_rules, s.remat, s.num_chunks) for s in compiled] == [
        ("standard", False, 1), ("standard", False, 2), ("standard", False, 4), ("standard", True, 1),
        ("standard", True, 2), ("standard", True, 4), ("fsdp", False, 1), ("fsdp", False, 2),
        ("fsdp", True, 1), ("fsdp", True, 2)]
    assert plan["chosen"]["setting"] == {"num_chunks": 2, "remat": False, "axis_rules": "fsdp"}
    assert plan["bindings"] == ["TrainerConfig.num_chunks = 2", "TrainerConfig.axis_rules = 'fsdp'"]
    assert "--gin.TrainerConfig.axis_rules='fsdp'" in capsys.readouterr().out
    assert json.loads(out.read_text())["chosen"]["setting"]["axis_rules"] == "fsdp"
    monkeypatch.setattr(aot, "compile_train_step", lambda *a, **k: {**_report(fits=False), "error": "too big",
                                                                      "memory": {"fits": False, "hbm_bytes": 1,
                                                                                 "needed_bytes": None}})
    with pytest.raises(RankgenError, match="no setting tried fits v3-8"):
        aot.run_plan("v3-8", json_out=str(out))
    assert json.loads(out.read_text())["chosen"] is None


# --- with libtpu: real compiles for TPU topologies -----------------------------------------


@needs_libtpu
def test_tiny_config_compiles_for_v3_8(tmp_path, capsys):
    out = tmp_path / "report.json"
    assert main(["compile", "--topology", "v3-8", "--json", str(out)] + [f"--gin_file={f}" for f in TINY_GIN]
                + [f"--gin.{b}" for b in TINY_BINDINGS]) == 0
    assert "fits" in capsys.readouterr().out
    report = json.loads(out.read_text())
    assert (report["topology"], report["devices"], report["devices_per_chip"]) == ("v3:2x2", 8, 2)
    assert report["mesh"] == {"replica": 1, "data": 4, "model": 2}
    memory = report["memory"]
    assert memory["hbm_bytes"] == 16 * GIB and memory["fits"]
    assert 0 < memory["total_bytes"] < GIB and memory["argument_bytes"] > 0
    assert report["flops_per_device"] > report["compiler_flops_per_device"] > 0  # scans count once in XLA's number
    assert report["timing"]["0.4"]["step_seconds"] > report["timing"]["0.6"]["step_seconds"] > 0


@needs_libtpu
def test_tiny_config_compiles_for_v5e_8():
    parse_gin(TINY_GIN, TINY_BINDINGS)
    report = aot.compile_train_step("v5e:2x4")
    assert (report["device_kind"], report["devices"], report["devices_per_chip"]) == ("TPU v5 lite", 8, 1)
    assert report["memory"]["hbm_bytes"] == 16 * GIB and report["memory"]["fits"]
    assert report["flops_per_device"] > 0 and report["peak_flops_per_device"] == 197e12


@needs_libtpu
def test_matmul_flops_agree_with_the_compiler_without_loops():
    # Unrolled layers, one chunk: XLA's count is a check on ours. It adds elementwise work (softmax, GELU,
    # Adafactor), about a tenth at this tiny width; a missed remat pass or a doubled count would be far off.
    parse_gin(TINY_GIN, TINY_BINDINGS + ["t5_config.scan_layers=False", "TrainerConfig.num_chunks=1"])
    report = aot.compile_train_step("v3:2x2")
    assert report["flops_per_device"] == pytest.approx(report["compiler_flops_per_device"], rel=0.2)


@needs_libtpu
def test_config_that_does_not_fit_fails_with_the_compilers_message():
    parse_gin(TINY_GIN, TINY_BINDINGS + ["DataConfig.batch_size=16384", "DataConfig.prefix_length=512",
                                         "t5_config.d_model=1024", "t5_config.d_ff=4096", "t5_config.remat=False",
                                         "TrainerConfig.num_chunks=1", "TrainerConfig.axis_rules='standard'"])
    report = aot.compile_train_step("v3-8")
    assert report["error"].startswith("RESOURCE_EXHAUSTED") and "HBM" in report["error"]
    assert report["memory"]["fits"] is False and report["memory"]["needed_bytes"] > 16 * GIB
    with pytest.raises(RankgenError, match=r"does not fit v3:2x2 with mesh .*: the compiler: RESOURCE_EXHAUSTED: "
                                           r".*HBM.*To fit it: raise TrainerConfig.num_chunks") as error:
        aot.run_compile("v3-8")
    assert "\n" not in str(error.value)


@needs_libtpu
def test_fsdp_keeps_activations_sharded_over_batch_on_tpu(tmp_path):
    # TINY on v3-8: data 4 x model 2, 2 chunks of 16 rows x 64 prefix tokens. The MLP's hidden activations of a
    # chunk's prefixes are [tokens, d_ff / model]: 4 rows x 64 = 256 tokens per device, not all 1024 of the chunk.
    parse_gin(TINY_GIN, TINY_BINDINGS)
    hlo = tmp_path / "step.hlo"
    aot.compile_train_step("v3:2x2", hlo_out=str(hlo))
    text = hlo.read_text()
    assert "bf16[256,256]" in text
    assert "bf16[1024,256]" not in text


@needs_libtpu
@pytest.mark.slow
@pytest.mark.parametrize("gin_file, topology, batch_size, mesh", PAPER_CONFIGS)
def test_paper_configs_fit_their_topologies(gin_file, topology, batch_size, mesh):
    # 1.5 to 3.5 minutes each on 2 CPU cores (the v3-256 one the longest).
    from rankgen_jax.experiments.gin_runs import experiment_configurables

    # As `compile` parses it (the recipe's data bind the seqio tasks' options), whichever test ran before.
    parse_gin([gin_file], [], experiment_configurables)
    report = aot.compile_train_step(topology)
    assert report["mesh"] == mesh and report["batch"]["query_ids"] == [batch_size, 512]
    assert report["memory"]["fits"] and report["flops_per_device"] > 1e13


@pytest.mark.slow  # two compiles of a large batch: about 2 minutes on 2 cores
@needs_libtpu
def test_a_plan_fits_a_step_that_does_not_fit_as_configured(tmp_path):
    """A tiny T5 with a batch too large for a v3 core: as configured the compiler refuses it; the plan (standard
    rules, no remat, chunks 1 then 16) finds the chunks that fit, and that setting compiles and fits."""
    parse_gin(TINY_GIN, ["DataConfig.source=@RandomData()", "DataConfig.batch_size=16384",
                         "DataConfig.prefix_length=512", "RandomData.continuation_length=128"])
    groups = [[aot.StepSetting(c, False, "standard") for c in (1, 16)]]
    plan = aot.plan_train_step("v3-8", groups)
    assert plan["candidates"][0]["setting"]["num_chunks"] == 1 and not plan["candidates"][0]["fits"]
    chosen = plan["chosen"]
    assert chosen is not None and chosen["setting"]["num_chunks"] > 1
    assert plan["report"]["memory"]["fits"] and plan["report"]["num_chunks"] == chosen["setting"]["num_chunks"]
    assert plan["bindings"][0] == f"TrainerConfig.num_chunks = {chosen['setting']['num_chunks']}"

"""Ahead-of-time compilation of the real train step for a TPU topology, from a CPU machine.

`rankgen-jax compile --topology v3-128 --gin_file tpu/rankgen_xl_v3_128.gin`
builds the trainer's mesh, shardings and jitted train step on libtpu's
compile-only devices for that topology, compiles it with abstract inputs and
reports per-device memory (argument + output - alias + temp) against the
chip's HBM; FLOPs per step three ways: the model's (`models.flops`: 6 N T plus
attention), the compiled program's matmuls (remat's and GradCache's re-forwards
included, so their overhead shows as the ratio of the two) and XLA's cost
analysis; and the step times they imply at given fractions of the chip's peak
(`GENERATIONS`, the per-chip figures used). A config
that does not fit fails here in seconds to minutes with the compiler's
RESOURCE_EXHAUSTED message instead of on the reserved slice.

Needs `libtpu` (tpu_scripts/aot_venv.sh makes .venv-aot with it); nothing here
touches a real TPU.
"""

from __future__ import annotations

import dataclasses
import glob
import importlib.util
import json
import math
import os
import re
import sys
import time
from pathlib import Path
from typing import Any, Sequence

from rankgen_jax.errors import RankgenError
from rankgen_jax.models.batch_layout import TRIPLES, BatchLayout

# jax (and every module that imports it) is imported inside the functions: it must load only after
# topology_devices has set libtpu's environment for compile-only TPU devices.

GIB = 1024**3
AOT_VENV_HINT = "run tpu_scripts/aot_venv.sh and use .venv-aot/bin/rankgen-jax"
DEFAULT_UTILIZATIONS = (0.4, 0.6)


@dataclasses.dataclass(frozen=True)
class TpuGeneration:
    """Per-chip facts of one TPU generation (public Cloud TPU spec sheets)."""

    name: str
    dims: int  # 2: a 2-D torus of chips; 3: a 3-D one
    counts: str  # what N in an accelerator type `vX-N` counts: "cores" (2 TensorCores per chip) or "chips"
    hbm_gib_per_chip: float
    peak_tflops_per_chip: float  # bf16 dense matmul
    device_kind: str
    # libtpu's chip configuration: "megacore" makes a chip's two TensorCores one device, as on real v4 / v5p VMs.
    chip_config: str = "default"


GENERATIONS: dict[str, TpuGeneration] = {
    "v2": TpuGeneration("v2", 2, "cores", 16, 45, "TPU v2"),
    "v3": TpuGeneration("v3", 2, "cores", 32, 123, "TPU v3"),
    "v4": TpuGeneration("v4", 3, "cores", 32, 275, "TPU v4", "megacore"),
    "v5e": TpuGeneration("v5e", 2, "chips", 16, 197, "TPU v5 lite"),
    "v5p": TpuGeneration("v5p", 3, "cores", 95, 459, "TPU v5", "megacore"),
    "v6e": TpuGeneration("v6e", 2, "chips", 32, 918, "TPU v6 lite"),
}
# Other spellings of generation names (Cloud accelerator types and libtpu topology names).
GENERATION_ALIASES = {"v5litepod": "v5e", "v5lite": "v5e", "v6": "v6e"}


@dataclasses.dataclass(frozen=True)
class Topology:
    """A TPU slice: its generation and chip grid, and the name libtpu takes (`v3:8x8`)."""

    generation: TpuGeneration
    chip_grid: tuple[int, ...]
    requested: str

    @property
    def chips(self) -> int:
        return math.prod(self.chip_grid)

    @property
    def libtpu_name(self) -> str:
        return f"{self.generation.name}:{'x'.join(map(str, self.chip_grid))}"

    @property
    def accelerator_type(self) -> str:
        """The Cloud accelerator type of this slice (`v3-128`, `v5litepod-8`)."""
        g = self.generation
        n = self.chips * (2 if g.counts == "cores" else 1)
        return f"{'v5litepod' if g.name == 'v5e' else g.name}-{n}"


def _generation(name: str, topology: str) -> TpuGeneration:
    key = GENERATION_ALIASES.get(name.lower(), name.lower())
    if key not in GENERATIONS:
        raise RankgenError(f"topology {topology!r}: unknown TPU generation {name!r}; "
                           f"expected one of {sorted(GENERATIONS) + sorted(GENERATION_ALIASES)}")
    return GENERATIONS[key]


def _default_grid(chips: int, dims: int) -> tuple[int, ...]:
    """The usual chip grid of a slice: powers of two split as evenly as possible, smaller axes first."""
    exponent = chips.bit_length() - 1
    if dims == 3 and chips < 8:
        # The smallest 3-D slices are flat: v4-8 is 2x2x1.
        return (2, 2, 1) if chips == 4 else (chips, 1, 1)
    shares = [exponent // dims + (1 if i >= dims - exponent % dims else 0) for i in range(dims)]
    return tuple(2**s for s in shares)


def parse_topology(name: str) -> Topology:
    """`v3-128` (an accelerator type) or `v3:8x8` (libtpu's chip grid) -> Topology."""
    text = name.strip()
    grid = re.fullmatch(r"([a-zA-Z0-9]+):(\d+(?:x\d+){1,2})", text)
    if grid:
        generation = _generation(grid.group(1), name)
        shape = tuple(int(s) for s in grid.group(2).split("x"))
        if any(s <= 0 for s in shape):
            raise RankgenError(f"topology {name!r}: every grid size must be positive")
        return Topology(generation, shape, name)
    accel = re.fullmatch(r"([a-zA-Z0-9]+)-(\d+)", text)
    if not accel:
        raise RankgenError(f"topology {name!r}: expected an accelerator type such as v3-128 or v5litepod-16, "
                           "or a chip grid such as v3:8x8, v4:4x4x4 or v5e:16x16")
    generation = _generation(accel.group(1), name)
    n = int(accel.group(2))
    per_chip = 2 if generation.counts == "cores" else 1
    chips = n // per_chip
    if n <= 0 or n % per_chip or chips & (chips - 1):
        unit = "TensorCores (2 per chip)" if per_chip == 2 else "chips"
        raise RankgenError(f"topology {name!r}: N counts {unit}, so it must be {per_chip} x a power of two; "
                           f"give the chip grid instead (e.g. {generation.name}:4x4) for other shapes")
    return Topology(generation, _default_grid(chips, generation.dims), name)


def device_specs(topology: Topology, num_devices: int) -> tuple[float, float, int]:
    """(HBM bytes, peak bf16 FLOP/s, devices per chip) of one jax device of the slice."""
    # jax shows one device per TensorCore on v2 / v3 (two per chip) and one per chip on
    # v4 / v5p (megacore) and v5e / v6e; a chip's HBM and FLOP/s split evenly over its devices.
    if num_devices % topology.chips:
        raise RankgenError(f"{num_devices} devices do not split evenly over {topology.chips} chips")
    per_chip = num_devices // topology.chips
    g = topology.generation
    return g.hbm_gib_per_chip * GIB / per_chip, g.peak_tflops_per_chip * 1e12 / per_chip, per_chip


def step_time_seconds(flops_per_device: float, peak_flops_per_device: float, utilization: float) -> float:
    """Seconds per step when a device sustains `utilization` of its peak."""
    if not 0 < utilization <= 1:
        raise RankgenError(f"utilization must be in (0, 1], got {utilization}")
    return flops_per_device / (peak_flops_per_device * utilization)


def days_for_steps(step_seconds: float, num_steps: int) -> float:
    return step_seconds * num_steps / 86400.0


def implied_utilization(flops_per_device: float, peak_flops_per_device: float, step_seconds: float) -> float:
    """The fraction of peak a device sustains when its step takes step_seconds (MFU with the model's FLOPs)."""
    if step_seconds <= 0:
        raise RankgenError(f"step seconds must be positive, got {step_seconds}")
    return flops_per_device / (peak_flops_per_device * step_seconds)


# --- FLOPs --------------------------------------------------------------------------------
# XLA's cost analysis counts the body of a while loop once, whatever its trip
# count, so with scanned layers and GradCache's chunk loops it reports a small
# fraction of the real work. These count matmul FLOPs in the step's jaxpr
# instead, multiplying scan bodies by their length; remat's recomputation is
# in the jaxpr, so it is counted.


def _dot_flops(eqn) -> int:
    (lhs_contract, _), _ = eqn.params["dimension_numbers"]
    lhs = eqn.invars[0].aval
    contracted = math.prod(lhs.shape[d] for d in lhs_contract)
    return 2 * math.prod(eqn.outvars[0].aval.shape) * contracted


def sub_jaxprs(value) -> list:
    """Jaxprs held in one equation parameter (a jaxpr, a closed jaxpr, or a tuple of them)."""
    import jax.extend.core as jex

    if isinstance(value, jex.ClosedJaxpr):
        return [value.jaxpr]
    if isinstance(value, jex.Jaxpr):
        return [value]
    if isinstance(value, (tuple, list)):
        return [j for v in value for j in sub_jaxprs(v)]
    return []


def jaxpr_matmul_flops(jaxpr) -> int:
    """FLOPs of every dot_general in a jaxpr (global shapes), scan bodies times their length."""
    # cond counts its costliest branch; a while loop (trip count unknown here) counts once.
    total = 0
    for eqn in jaxpr.eqns:
        name = eqn.primitive.name
        if name == "dot_general":
            total += _dot_flops(eqn)
            continue
        if name == "cond":
            total += max((jaxpr_matmul_flops(b) for b in sub_jaxprs(eqn.params["branches"])), default=0)
            continue
        repeat = eqn.params["length"] if name == "scan" else 1
        for value in eqn.params.values():
            for sub in sub_jaxprs(value):
                total += repeat * jaxpr_matmul_flops(sub)
    return total


# --- building and compiling the step -------------------------------------------------------


def _libtpu_env_without_tpu(topology: Topology) -> None:
    """On a machine without TPUs, set what libtpu would otherwise look for and complain about."""
    # libtpu asks the GCE metadata server for the accelerator type and worker hostnames
    # (printing INVALID_ARGUMENT lines that look like a failure but are not) and takes a
    # machine-wide lock file, so a second compile (or a test run) beside a first one fails.
    # Compile-only devices need neither. A TPU VM (accelerator device files) is left alone.
    if glob.glob("/dev/accel*") or glob.glob("/dev/vfio/[0-9]*"):
        return
    if "TPU_ACCELERATOR_TYPE" not in os.environ and "TPU_WORKER_HOSTNAMES" not in os.environ:
        os.environ["TPU_ACCELERATOR_TYPE"] = topology.accelerator_type
        os.environ["TPU_WORKER_HOSTNAMES"] = "localhost"
    os.environ.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")


def libtpu_available() -> bool:
    return importlib.util.find_spec("libtpu") is not None


def topology_devices(topology: Topology) -> list:
    """libtpu's compile-only devices for a topology (no TPU needed)."""
    if not libtpu_available():
        raise RankgenError(f"libtpu is not installed, so TPU programs cannot be compiled here: {AOT_VENV_HINT}")
    _libtpu_env_without_tpu(topology)
    import jax

    # Compile-only work needs no local accelerator; keep jax off a TPU a training run may hold.
    if os.environ.get("JAX_PLATFORMS") is None and not jax._src.xla_bridge.backends_are_initialized():  # noqa: SLF001
        jax.config.update("jax_platforms", "cpu")
    from jax.experimental import topologies

    try:
        devices = topologies.get_topology_desc(topology_name=topology.libtpu_name, platform="tpu",
                                               chip_config_name=topology.generation.chip_config).devices
    except Exception as e:  # noqa: BLE001 - libtpu reports bad names as assorted runtime errors
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise RankgenError(f"libtpu rejected topology {topology.libtpu_name!r} ({topology.requested}): "
                           f"{first}") from None
    device_kind = devices[0].device_kind
    if device_kind != topology.generation.device_kind:
        raise RankgenError(f"topology {topology.libtpu_name!r} gave {device_kind!r} devices, expected "
                           f"{topology.generation.device_kind!r}")
    return list(devices)


def batch_shapes(data, layout: BatchLayout) -> dict[str, tuple[int, ...]]:
    """Global shapes of the int32 arrays of one training batch (triple sources; see models.batch_layout)."""
    # A candidate list's length is known only once its file is read, so lists and pairs are not compiled.
    src = data.source
    if layout.form != TRIPLES or src.kind in ("lists", "pairs"):
        raise RankgenError(f"compile supports dual encoders trained on triples (DataConfig.source 'books', "
                           f"'examples', 'seqio', 'random' or 'retrieval'), not model kind {layout.model_kind!r} with source "
                           f"{src.kind!r} and a loss of {layout.form}")
    if src.kind == "retrieval":  # K hard negatives per query (data.retrieval_source)
        lengths = layout.lengths(data.prefix_length, src.continuation_length, optional=src.hard_negatives > 0)
        return {key: (data.batch_size, src.hard_negatives, length) if key == "negative_ids" else
                (data.batch_size, length) for key, length in lengths.items()}
    lengths = layout.lengths(data.prefix_length, src.continuation_length, optional=src.with_negative)
    return {key: (data.batch_size, length) for key, length in lengths.items()}


def _model_config(trainer, gin_model, encoder_bindings=()):
    """The model config training would use (as checkpointing.resolve_model_config), without reading weights."""
    # An init checkpoint readable here supplies its saved encoder config; otherwise (gs://)
    # gin's encoder stands in for it. Either way the trainer's encoder_overrides apply.
    # Imported here, as jax is: topology_devices sets libtpu's environment before jax loads.
    from rankgen_jax.checkpoints import native
    from rankgen_jax.train.checkpointing import model_config_from_checkpoint

    if not trainer.init_checkpoint:
        return gin_model
    path = trainer.init_checkpoint
    if not native.is_remote(path) and native.is_checkpoint_dir(path):
        saved = native.load_model_config(path)
    else:
        print(f"note: {path} is not readable here; compiling gin's ModelConfig with TrainerConfig.encoder_overrides",
              file=sys.stderr)
        saved = gin_model
    return model_config_from_checkpoint(saved, trainer, gin_model, encoder_bindings)


@dataclasses.dataclass(frozen=True)
class StepSetting:
    """The settings that change a step's memory but keep its model and global batch: GradCache chunks, the
    encoder's rematerialisation and the axis rules (FSDP shards parameters and optimizer state too)."""

    num_chunks: int
    remat: bool
    axis_rules: str


def setting_bindings(setting: StepSetting, trainer, model_config) -> list[str]:
    """The gin bindings that select `setting` in a run configured as (trainer, model_config) are: remat through
    the trainer's encoder_overrides where the run has them (its other overrides kept), else the encoder's config."""
    lines = [f"TrainerConfig.num_chunks = {setting.num_chunks}", f"TrainerConfig.axis_rules = '{setting.axis_rules}'"]
    if setting.remat != model_config.encoder.remat:
        if trainer.init_checkpoint or trainer.encoder_overrides:
            lines.append(f"TrainerConfig.encoder_overrides = {dict(trainer.encoder_overrides) | {'remat': setting.remat}}")
        else:
            lines.append(f"{'t5_config' if model_config.encoder_type == 't5' else 'BertConfig'}.remat = {setting.remat}")
    return lines


def fit_advice(report: dict[str, Any]) -> list[str]:
    """What to change when a step does not fit, in the order it is worth trying (what the report already has
    left out)."""
    advice = ["raise TrainerConfig.num_chunks (GradCache: the same global batch, its activations a chunk at a time)"]
    if not report["encoder"]["remat"]:
        advice.append("set the encoder's remat = True (recompute activations in the backward pass)")
    if report["axis_rules"] != "fsdp":
        advice.append("TrainerConfig.axis_rules = 'fsdp' (shard parameters and optimizer state over the data axis too)")
    return advice + ["or let `rankgen-jax compile --plan` try them"]


def _first_line(error: BaseException) -> str:
    text = str(error).strip()
    for line in text.splitlines():
        if "RESOURCE_EXHAUSTED" in line:
            return line.strip()
    return text.splitlines()[0] if text else type(error).__name__


_SIZE = re.compile(r"\(([\d.]+)([KMGT])\) exceeds")


def _needed_bytes(message: str) -> int | None:
    """The size a RESOURCE_EXHAUSTED message says the program needs ("... (16.87G) exceeds available HBM ...")."""
    found = _SIZE.search(message)
    if not found:
        return None
    return int(float(found.group(1)) * 1024 ** ("KMGT".index(found.group(2)) + 1))


def _memory_report(stats, hbm_bytes: float) -> dict[str, Any]:
    total = (stats.argument_size_in_bytes + stats.output_size_in_bytes - stats.alias_size_in_bytes
             + stats.temp_size_in_bytes)
    return {
        "argument_bytes": int(stats.argument_size_in_bytes),
        "output_bytes": int(stats.output_size_in_bytes),
        "alias_bytes": int(stats.alias_size_in_bytes),
        "temp_bytes": int(stats.temp_size_in_bytes),
        "generated_code_bytes": int(stats.generated_code_size_in_bytes),
        "total_bytes": int(total),
        "hbm_bytes": int(hbm_bytes),
        "fits": bool(total + stats.generated_code_size_in_bytes <= hbm_bytes),
    }


def compile_train_step(topology_name: str, utilizations: Sequence[float] = DEFAULT_UTILIZATIONS,
                       hlo_out: str | None = None, step_seconds: float | None = None,
                       setting: StepSetting | None = None) -> dict[str, Any]:
    """Compile the train step of the parsed gin config (as `train` reads it) for a TPU topology; returns the report.

    step_seconds: a step time (measured, or a paper's: 100k steps in 2 days is 1.728 s) to turn into the
    model FLOPs utilization (MFU) and the compiled program's utilization it implies. setting: other chunks,
    remat or axis rules than gin's. A step the compiler refuses for memory gives a report with "error" (the
    compiler's line) and memory["fits"] False.
    """
    topology = parse_topology(topology_name)
    for u in utilizations:
        step_time_seconds(1.0, 1.0, u)  # validates before minutes of compiling
    if step_seconds is not None:
        implied_utilization(1.0, 1.0, step_seconds)
    devices = topology_devices(topology)

    # Imported only now: jax (which all of these import) must load after topology_devices has set
    # libtpu's environment.
    import flax.linen as nn
    import jax

    from rankgen_jax.losses import registry as losses
    from rankgen_jax.runtime import partitioning
    from rankgen_jax.models.configs import ModelConfig
    from rankgen_jax.data.source_configs import DataConfig
    from rankgen_jax.train.optimizers import OptimizerConfig, make_optimizer, schedule_for_run
    from rankgen_jax.train.step import StepOptions
    from rankgen_jax.train.compiled import build_step_functions
    from rankgen_jax.train.config import LossConfig, TrainerConfig, check_divisible, matryoshka_for
    from rankgen_jax.train import gin_parsing
    from rankgen_jax.models.flops import train_step_model_flops

    trainer, data, loss, optimizer = TrainerConfig(), DataConfig(), LossConfig(), OptimizerConfig()
    model_config = _model_config(trainer, ModelConfig(), gin_parsing.encoder_bindings())
    if setting is not None:
        trainer = dataclasses.replace(trainer, num_chunks=setting.num_chunks, axis_rules=setting.axis_rules)
        model_config = dataclasses.replace(model_config,
                                           encoder=dataclasses.replace(model_config.encoder, remat=setting.remat))
    losses.check_model_kind(loss.name, model_config.kind)
    layout = BatchLayout(model_config.kind, losses.batch_form(loss.name))
    shapes = batch_shapes(data, layout)
    gin_parsing.check_bindings_used()

    # The same mesh, options and step functions as train.loop.train, on the topology's devices.
    mesh = partitioning.make_mesh(trainer.mesh_data, trainer.mesh_model, devices=devices, replica=trainer.mesh_replica)
    rules = partitioning.rules_by_name(trainer.axis_rules)
    check_divisible(data.batch_size, partitioning.data_parallel_size(mesh), trainer)
    options = StepOptions(loss.name, tuple(sorted(loss.options().items())), trainer.num_chunks, trainer.accum_steps,
                          towers=layout.towers, matryoshka=matryoshka_for(loss, model_config))
    tx, schedule = make_optimizer(schedule_for_run(optimizer, trainer.num_steps))
    loss_params = losses.init_loss_params(loss.name, **loss.options())
    setup = build_step_functions(model_config, options, tx, schedule, loss_params, mesh, rules, trainer.seed)

    state = jax.tree_util.tree_map(lambda a, s: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=s),
                                   setup.abstract_state, setup.shardings)
    batch = {k: jax.ShapeDtypeStruct(s, "int32", sharding=setup.batch_sharding) for k, s in shapes.items()}
    n = len(devices)
    hbm, peak, per_chip = device_specs(topology, n)
    encoder = model_config.encoder
    tried = {
        "topology": topology.libtpu_name,
        "requested": topology.requested,
        "accelerator_type": topology.accelerator_type,
        "device_kind": devices[0].device_kind,
        "devices": n,
        "chips": topology.chips,
        "devices_per_chip": per_chip,
        "hosts": len({d.process_index for d in devices}),
        "mesh": dict(mesh.shape),
        "axis_rules": trainer.axis_rules,
        "num_chunks": trainer.num_chunks,
        "accum_steps": trainer.accum_steps,
        "encoder": {k: getattr(encoder, k) for k in ("d_model", "num_layers", "dtype", "remat", "scan_layers")},
        "batch": {k: list(s) for k, s in shapes.items()},
        "loss": loss.name,
        "optimizer": optimizer.name,
    }
    started = time.time()
    with jax.set_mesh(mesh), nn.logical_axis_rules(list(rules)):
        traced = setup.train_step.trace(state, batch)
        lowered = traced.lower()
        try:
            compiled = lowered.compile()
        except jax.errors.JaxRuntimeError as e:
            if "RESOURCE_EXHAUSTED" not in str(e):
                raise
            return {**tried, "error": _first_line(e), "compile_seconds": time.time() - started,
                    "memory": {"fits": False, "hbm_bytes": int(hbm), "needed_bytes": _needed_bytes(str(e))}}
    compile_seconds = time.time() - started
    if hlo_out:
        Path(hlo_out).write_text(compiled.as_text(), encoding="utf-8")

    cost = compiled.cost_analysis()
    cost = cost[0] if isinstance(cost, (list, tuple)) else cost
    flops = jaxpr_matmul_flops(traced.jaxpr.jaxpr) / n
    params = sum(math.prod(x.shape) for x in jax.tree_util.tree_leaves(setup.abstract_state.params))
    steps = trainer.num_steps
    model_flops = train_step_model_flops(encoder, shapes, model_config.head.output_dim(encoder.d_model)) / n
    timings = {}
    for u in utilizations:
        seconds = step_time_seconds(flops, peak, u)
        # MFU u: the model's FLOPs at u of peak, whatever the program adds on top.
        mfu_seconds = step_time_seconds(model_flops, peak, u)
        timings[f"{u:g}"] = {"step_seconds": seconds, "days": days_for_steps(seconds, steps),
                             "mfu_step_seconds": mfu_seconds, "mfu_days": days_for_steps(mfu_seconds, steps)}
    implied = None
    if step_seconds is not None:
        implied = {"step_seconds": step_seconds, "mfu": implied_utilization(model_flops, peak, step_seconds),
                   "compiled_utilization": implied_utilization(flops, peak, step_seconds),
                   "days": days_for_steps(step_seconds, steps)}
    return {
        **tried,
        "params": int(params),
        "memory": _memory_report(compiled.memory_analysis(), hbm),
        "flops_per_device": float(flops),
        "model_flops_per_device": float(model_flops),
        "compiler_flops_per_device": float(cost.get("flops", 0.0)),
        "peak_flops_per_device": peak,
        "num_steps": steps,
        "timing": timings,
        "implied_by_step_seconds": implied,
        "compile_seconds": compile_seconds,
    }


def _gib(n: float) -> str:
    return f"{n / GIB:.2f} GiB"


def _setting_lines(r: dict[str, Any]) -> list[str]:
    mesh = " x ".join(f"{k} {v}" for k, v in r["mesh"].items())
    e = r["encoder"]
    params = f"; {r['params'] / 1e6:.0f}M params" if "params" in r else ""
    return [
        f"topology {r['topology']} ({r['accelerator_type']}): {r['devices']} {r['device_kind']} devices, "
        f"{r['chips']} chips, {r['hosts']} hosts",
        f"mesh {mesh}, rules {r['axis_rules']}, num_chunks {r['num_chunks']}, accum_steps {r['accum_steps']}; "
        f"encoder d_model {e['d_model']} x {e['num_layers']} layers, {e['dtype']}, remat {e['remat']}, "
        f"scan_layers {e['scan_layers']}{params}",
        "batch " + ", ".join(f"{k} {'x'.join(map(str, s))}" for k, s in r["batch"].items()),
    ]


def format_report(r: dict[str, Any]) -> str:
    """The report as a few readable lines."""
    m = r["memory"]
    if "error" in r:
        return "\n".join(_setting_lines(r) + [f"DOES NOT FIT {_gib(m['hbm_bytes'])} of HBM per device: {r['error']}"])
    lines = [
        *_setting_lines(r),
        f"memory per device: argument {_gib(m['argument_bytes'])} + output {_gib(m['output_bytes'])} "
        f"- alias {_gib(m['alias_bytes'])} + temp {_gib(m['temp_bytes'])} = {_gib(m['total_bytes'])} "
        f"(+ code {_gib(m['generated_code_bytes'])}) of {_gib(m['hbm_bytes'])} HBM: "
        + ("fits" if m["fits"] else "DOES NOT FIT"),
        f"FLOPs per step per device: model {r['model_flops_per_device']:.4g} (6 N T + attention); compiled "
        f"{r['flops_per_device']:.4g} (matmuls, loops counted, re-forwards included: "
        f"{r['flops_per_device'] / r['model_flops_per_device']:.2f}x the model's); XLA's cost analysis, loop bodies "
        f"once: {r['compiler_flops_per_device']:.4g}; peak {r['peak_flops_per_device'] / 1e12:.1f} TFLOP/s per device",
    ]
    for u, t in r["timing"].items():
        lines.append(f"at {float(u):.0%} of peak: {t['step_seconds']:.4g} s/step, {t['days']:.3g} days for "
                     f"{r['num_steps']} steps; at {float(u):.0%} MFU: {t['mfu_step_seconds']:.4g} s/step, "
                     f"{t['mfu_days']:.3g} days")
    implied = r.get("implied_by_step_seconds")
    if implied:
        lines.append(f"at {implied['step_seconds']:.4g} s/step ({implied['days']:.3g} days for {r['num_steps']} steps): "
                     f"MFU {implied['mfu']:.1%}, compiled FLOPs at {implied['compiled_utilization']:.1%} of peak")
    lines.append(f"compiled in {r['compile_seconds']:.0f} s")
    return "\n".join(lines)


def run_compile(topology: str, utilizations: Sequence[float] = DEFAULT_UTILIZATIONS, *,
                hlo_out: str | None = None, json_out: str | None = None, step_seconds: float | None = None) -> dict:
    """What `rankgen-jax compile` does with the gin config parsed: compile_train_step, print the report.

    json_out: also write the report there. Raises RankgenError when the
    step's buffers exceed the chip's HBM; returns the report otherwise.
    """
    report = compile_train_step(topology, utilizations, hlo_out=hlo_out, step_seconds=step_seconds)
    print(format_report(report))
    if json_out:
        Path(json_out).write_text(json.dumps(report, indent=2) + "\n", encoding="utf-8")
    memory = report["memory"]
    if not memory["fits"]:
        tried = (f"mesh {report['mesh']}, global batch {next(iter(report['batch'].values()))[0]}, num_chunks "
                 f"{report['num_chunks']}, remat {report['encoder']['remat']}, axis_rules '{report['axis_rules']}'")
        if "error" in report:
            # The compiler refused: its own peak estimate is over the chip's memory.
            what = f"the compiler: {report['error'].rstrip('.')}"
        else:
            # The compiler accepted it, but the sum of every buffer is still over the chip's memory.
            need = memory["total_bytes"] + memory["generated_code_bytes"]
            what = (f"per-device memory {_gib(need)} (argument + output - alias + temp + code) exceeds the "
                    f"{_gib(memory['hbm_bytes'])} of HBM of a {report['device_kind']} device")
        raise RankgenError(f"does not fit {report['topology']} with {tried}: {what}. To fit it: "
                           + "; ".join(fit_advice(report)))
    return report


def plan_settings(base: StepSetting, rules: Sequence[str] = ("standard", "fsdp"), remat: Sequence[bool] = (False, True),
                  chunks: Sequence[int] = (1, 2, 4, 8, 16, 32, 64)) -> list[list[StepSetting]]:
    """The settings a plan tries, in groups of one axis rules and remat each, by chunks from the fewest: gin's own
    setting first (its group first, from its chunks)."""
    groups = []
    for rule in dict.fromkeys([base.axis_rules, *rules]):
        for re_materialise in dict.fromkeys([base.remat, *remat]):
            first = base.num_chunks if (rule, re_materialise) == (base.axis_rules, base.remat) else 1
            groups.append([StepSetting(c, re_materialise, rule) for c in sorted({*chunks, first}) if c >= first])
    return groups


def plan_train_step(topology: str, groups: list[list[StepSetting]] | None = None,
                    utilizations: Sequence[float] = DEFAULT_UTILIZATIONS) -> dict[str, Any]:
    """Compile the settings of `groups` (default: plan_settings of gin's) until each group's first that fits; pick,
    of those that fit, the one whose compiled step does the fewest FLOPs per device (then the least memory).

    The FLOPs are the compiled program's matmuls with every loop iteration counted (flops_per_device: remat's
    and GradCache's re-forwards included). XLA's own cost analysis counts a loop body once, so it would favour
    more GradCache chunks (a loop over them) and scanned layers, by about their count.

    Returns {"candidates": [{"setting", "fits", "total_bytes" | "error", "compiler_flops_per_device", ...}],
    "chosen": the chosen candidate or None, "bindings": its gin bindings, "report": its compile report}."""
    from rankgen_jax.models.configs import ModelConfig
    from rankgen_jax.train import gin_parsing
    from rankgen_jax.train.config import TrainerConfig

    trainer = TrainerConfig()
    model_config = _model_config(trainer, ModelConfig(), gin_parsing.encoder_bindings())
    if groups is None:
        groups = plan_settings(StepSetting(trainer.num_chunks, model_config.encoder.remat, trainer.axis_rules))
    candidates, reports = [], {}
    for group in groups:
        for setting in group:
            try:
                report = compile_train_step(topology, utilizations, setting=setting)
            except RankgenError as e:  # a chunk count the batch does not split into
                candidates.append({"setting": dataclasses.asdict(setting), "fits": False, "error": str(e)})
                continue
            fits = report["memory"]["fits"]
            entry = {"setting": dataclasses.asdict(setting), "fits": fits, "compile_seconds": report["compile_seconds"]}
            if "error" in report:
                entry.update(error=report["error"], needed_bytes=report["memory"]["needed_bytes"])
            else:
                entry.update(total_bytes=report["memory"]["total_bytes"] + report["memory"]["generated_code_bytes"],
                             compiler_flops_per_device=report["compiler_flops_per_device"],
                             flops_per_device=report["flops_per_device"])
            candidates.append(entry)
            print(f"plan: {_describe_setting(setting)}: " + (
                f"fits, {_gib(entry['total_bytes'])}, {entry['flops_per_device']:.4g} FLOPs per device"
                if fits else f"does not fit ({entry.get('error') or _gib(entry['total_bytes'])})"),
                file=sys.stderr, flush=True)
            if fits:
                reports[setting] = report
                break
    fitting = [c for c in candidates if c["fits"]]
    chosen = min(fitting, key=lambda c: (c["flops_per_device"], c["total_bytes"])) if fitting else None
    setting = StepSetting(**chosen["setting"]) if chosen else None
    return {"topology": topology, "candidates": candidates, "chosen": chosen,
            "bindings": setting_bindings(setting, trainer, model_config) if setting else None,
            "report": reports[setting] if setting else None}


def _describe_setting(setting: StepSetting) -> str:
    return f"num_chunks {setting.num_chunks}, remat {setting.remat}, axis_rules '{setting.axis_rules}'"


def run_plan(topology: str, json_out: str | None = None,
             utilizations: Sequence[float] = DEFAULT_UTILIZATIONS) -> dict[str, Any]:
    """What `rankgen-jax compile --plan` does: plan_train_step, the chosen setting's report and its gin bindings;
    RankgenError when nothing tried fits."""
    plan = plan_train_step(topology, utilizations=utilizations)
    if json_out:
        Path(json_out).write_text(json.dumps(plan, indent=2) + "\n", encoding="utf-8")
    if plan["chosen"] is None:
        raise RankgenError(f"no setting tried fits {topology} (chunks, remat and axis rules; "
                           f"{len(plan['candidates'])} compiles): a larger topology, a smaller global batch or "
                           "shorter inputs")
    setting = StepSetting(**plan["chosen"]["setting"])
    print(format_report(plan["report"]))
    print(f"chosen: {_describe_setting(setting)}, the fewest FLOPs per device (compiled, loops counted) of the "
          f"{sum(c['fits'] for c in plan['candidates'])} that fit; bind:\n  "
          + "\n  ".join(f"--gin.{b.replace(' = ', '=')}" for b in plan["bindings"]))
    return plan

"""Device meshes and logical axis rules: the one place that decides how arrays are sharded.

Models name their axes logically (T5X names); these rules map logical names to
mesh axes. A rule list is ordered, and flax walks the rules, not the array's
axes: a mesh axis goes to the first rule that asks for it and names one of the
array's axes. So FSDP's ("embed", "data") must come after ("batch", ...):
activations then keep `data` for `batch`, and parameters (which have no
`batch` axis) shard `embed` over `data`.
"""

from __future__ import annotations

from typing import Sequence

import flax.linen as nn
import jax
import numpy as np
from jax.sharding import AxisType, Mesh, NamedSharding, PartitionSpec

from rankgen_jax.errors import RankgenError

LogicalRules = Sequence[tuple[str, str | tuple[str, ...] | None]]

# The batch is split over slices (`replica`, data-center network) and over
# `data` within a slice; with one slice `replica` has size 1.
BATCH_MESH_AXES = ("replica", "data")

# T5X's standard rules (1-D parameter and activation partitioning).
STANDARD_RULES: LogicalRules = (
    ("batch", BATCH_MESH_AXES),
    ("vocab", "model"),
    ("embed", None),
    ("mlp", "model"),
    ("heads", "model"),
    ("kv", None),
    ("joined_kv", "model"),
    ("relpos_buckets", None),
    ("abspos_buckets", None),
    ("type_vocab", None),
    ("length", None),
    ("layers", None),
    ("projection", None),
    ("candidates", None),
)

# Fully sharded data parallel: parameters (and optimizer state) also split
# their `embed` axis over `data`.
FSDP_RULES: LogicalRules = (STANDARD_RULES[0], ("embed", "data")) + tuple(STANDARD_RULES[1:])

NAMED_RULES = {"standard": STANDARD_RULES, "fsdp": FSDP_RULES}


def rules_by_name(name: str) -> LogicalRules:
    if name not in NAMED_RULES:
        raise RankgenError(f"unknown logical axis rules {name!r}: expected one of {sorted(NAMED_RULES)}")
    return NAMED_RULES[name]


def make_mesh(
    data: int = -1, model: int = 1, devices: Sequence[jax.Device] | None = None, replica: int = 1
) -> Mesh:
    """A (`replica`, `data`, `model`) mesh; -1 for data or model takes the remaining devices.

    Axes are Auto (flax.linen's logical constraints need that). On a
    multi-slice TPU job `replica` counts slices; the device order then should
    come from a hybrid (ICI x DCN) layout, which the TPU launch code supplies.
    """
    devices = list(devices if devices is not None else jax.devices())
    n = len(devices)
    if data == -1 and model == -1:
        raise RankgenError("mesh: at most one of data/model may be -1")
    if replica <= 0 or n % replica:
        raise RankgenError(f"mesh replica={replica} does not divide the {n} available devices")
    per_replica = n // replica
    if data == -1:
        data = per_replica // model if model > 0 and per_replica % model == 0 else 0
    if model == -1:
        model = per_replica // data if data > 0 and per_replica % data == 0 else 0
    if data <= 0 or model <= 0 or replica * data * model != n:
        shown = f"replica={replica} x data={data} x model={model}" if replica != 1 else f"data={data} x model={model}"
        raise RankgenError(f"mesh {shown} does not match the {n} available devices")
    return jax.make_mesh(
        (replica, data, model), ("replica", "data", "model"), axis_types=(AxisType.Auto,) * 3, devices=devices
    )


def batch_sharding(mesh: Mesh) -> NamedSharding:
    """Leading (batch) axis split over every data-parallel device."""
    return NamedSharding(mesh, PartitionSpec(BATCH_MESH_AXES))


def data_parallel_size(mesh: Mesh) -> int:
    return mesh.shape["replica"] * mesh.shape["data"]


def logical_shardings(boxed_tree, mesh: Mesh, rules: LogicalRules):
    """NamedShardings for a tree of (abstract) flax LogicallyPartitioned values."""
    specs = nn.get_partition_spec(boxed_tree)
    return nn.logical_to_mesh_sharding(specs, mesh, list(rules))


def replicated(mesh: Mesh) -> NamedSharding:
    return NamedSharding(mesh, PartitionSpec())


def device_put_tree(tree, shardings):
    """Place a host tree of arrays with the given (matching) shardings."""
    return jax.tree_util.tree_map(lambda x, s: jax.device_put(np.asarray(x), s), tree, shardings)

"""Device meshes and logical axis rules: the one place that decides how arrays are sharded.

Models name their axes logically (T5X names); these rules map logical names to
mesh axes. A rule list is ordered: for each logical axis the first rule whose
mesh axis is not yet used by that array wins, so FSDP can shard `embed` over
`data` for parameters while activations keep `data` for `batch`.
"""

from __future__ import annotations

from typing import Sequence

import flax.linen as nn
import jax
import numpy as np
from jax.sharding import AxisType, Mesh, NamedSharding, PartitionSpec

from rankgen_jax.errors import RankgenError

LogicalRules = Sequence[tuple[str, str | tuple[str, ...] | None]]

# T5X's standard rules (1-D parameter and activation partitioning).
STANDARD_RULES: LogicalRules = (
    ("batch", "data"),
    ("vocab", "model"),
    ("embed", None),
    ("mlp", "model"),
    ("heads", "model"),
    ("kv", None),
    ("joined_kv", "model"),
    ("relpos_buckets", None),
    ("length", None),
    ("layers", None),
    ("projection", None),
    ("candidates", None),
)

# Fully sharded data parallel: parameters (and optimizer state) also split
# their `embed` axis over `data`.
FSDP_RULES: LogicalRules = (
    ("batch", "data"),
    ("vocab", "model"),
    ("embed", "data"),
    ("embed", None),
    ("mlp", "model"),
    ("heads", "model"),
    ("kv", None),
    ("joined_kv", "model"),
    ("relpos_buckets", None),
    ("length", None),
    ("layers", None),
    ("projection", None),
    ("candidates", None),
)

NAMED_RULES = {"standard": STANDARD_RULES, "fsdp": FSDP_RULES}


def rules_by_name(name: str) -> LogicalRules:
    if name not in NAMED_RULES:
        raise RankgenError(f"unknown logical axis rules {name!r}: expected one of {sorted(NAMED_RULES)}")
    return NAMED_RULES[name]


def make_mesh(data: int = -1, model: int = 1, devices: Sequence[jax.Device] | None = None) -> Mesh:
    """A (`data`, `model`) mesh; -1 takes all remaining devices. Axes are Auto (flax.linen needs that)."""
    devices = list(devices if devices is not None else jax.devices())
    n = len(devices)
    if data == -1 and model == -1:
        raise RankgenError("mesh: at most one of data/model may be -1")
    if data == -1:
        data = n // model if model > 0 and n % model == 0 else 0
    if model == -1:
        model = n // data if data > 0 and n % data == 0 else 0
    if data <= 0 or model <= 0 or data * model != n:
        raise RankgenError(f"mesh data={data} x model={model} does not match the {n} available devices")
    return jax.make_mesh(
        (data, model), ("data", "model"), axis_types=(AxisType.Auto, AxisType.Auto), devices=devices
    )


def logical_shardings(boxed_tree, mesh: Mesh, rules: LogicalRules):
    """NamedShardings for a tree of (abstract) flax LogicallyPartitioned values."""
    specs = nn.get_partition_spec(boxed_tree)
    return nn.logical_to_mesh_sharding(specs, mesh, list(rules))


def replicated(mesh: Mesh) -> NamedSharding:
    return NamedSharding(mesh, PartitionSpec())


def device_put_tree(tree, shardings):
    """Place a host tree of arrays with the given (matching) shardings."""
    return jax.tree_util.tree_map(lambda x, s: jax.device_put(np.asarray(x), s), tree, shardings)

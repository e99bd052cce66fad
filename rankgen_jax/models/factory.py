"""Build the flax module a ModelConfig describes, initialise it, and check parameter trees against it."""

from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
from flax.traverse_util import flatten_dict

from rankgen_jax.models.configs import ModelConfig
from rankgen_jax.errors import RankgenError
from rankgen_jax.models.heads import CrossEncoder, DualEncoder, build_backbone
from rankgen_jax.models.t5 import to_scanned_layout, to_unscanned_layout


def build_model(config: ModelConfig) -> nn.Module:
    """The module for config.kind: DualEncoder, CrossEncoder, or the bare encoder."""
    config.check_head_fits_encoder()
    if config.kind == "dual_encoder":
        return DualEncoder(config)
    if config.kind == "cross_encoder":
        return CrossEncoder(config)
    return build_backbone(config.encoder)


def _dummy_ids(length: int = 8) -> jax.Array:
    return jnp.ones((1, length), jnp.int32)


def init_variables(config: ModelConfig, rng: jax.Array):
    """model.init touching every tower (boxed variables, with logical axis names)."""
    model = build_model(config)
    if config.kind == "dual_encoder":
        return model.init(rng, _dummy_ids(), method=DualEncoder.initialize)
    return model.init(rng, _dummy_ids())


def abstract_variables(config: ModelConfig):
    """Shapes and logical axis names of the model's variables, without allocating them."""
    return jax.eval_shape(lambda: init_variables(config, jax.random.PRNGKey(0)))


def init_params(config: ModelConfig, seed: int = 0) -> dict:
    """Random-init parameters (unboxed, model layout)."""
    return nn.unbox(jax.jit(lambda rng: init_variables(config, rng))(jax.random.PRNGKey(seed)))["params"]


def to_model_layout(params: dict, config: ModelConfig) -> dict:
    """Canonical (T5X `layers_{i}`) params -> the layout the model's scan setting wants."""
    if "encoder" not in params or not isinstance(params["encoder"], dict):
        return params  # two-tower trees and BERT-family encoders are never scanned
    scanned = "layers" in params["encoder"]
    if config.encoder.scan_layers and not scanned:
        return to_scanned_layout(params, config.encoder.num_layers)
    if not config.encoder.scan_layers and scanned:
        return to_unscanned_layout(params)
    return params


def to_canonical_layout(params: dict) -> dict:
    return to_unscanned_layout(params) if "layers" in params.get("encoder", {}) else params


def check_params_match(params: dict, config: ModelConfig, where: str) -> None:
    """Raise a RankgenError listing every missing, unexpected or mis-shaped parameter."""
    expected = {
        "/".join(k): tuple(v.shape)
        for k, v in flatten_dict(nn.unbox(abstract_variables(config))["params"]).items()
    }
    got = {"/".join(k): tuple(np.shape(v)) for k, v in flatten_dict(to_model_layout(params, config)).items()}
    problems = [f"missing {k} {expected[k]}" for k in sorted(expected.keys() - got.keys())]
    problems += [f"unexpected {k} {got[k]}" for k in sorted(got.keys() - expected.keys())]
    problems += [
        f"{k} has shape {got[k]}, model wants {expected[k]}"
        for k in sorted(expected.keys() & got.keys())
        if expected[k] != got[k]
    ]
    if problems:
        shown = "; ".join(problems[:4]) + (f"; and {len(problems) - 4} more" if len(problems) > 4 else "")
        raise RankgenError(f"{where}: parameters do not fit the model config ({shown})")

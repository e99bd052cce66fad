"""Model FLOPs of an encoder step: the work the model needs, for MFU figures.

Counted as the matmuls of the forward pass: per token, 2 x the weights every token
multiplies (attention q/k/v/out, the MLP; the embedding is a lookup and counts
nothing), plus attention's two L x L products (q k^T and weights x v: 2 x 2 x L x
heads x d_kv per token), plus the head's projection per sequence. A train step is
3x its forwards (the backward pass costs two). So, for N such weights and T
tokens, 6 N T plus attention: the usual MFU numerator. Work the implementation
adds on top (remat's and GradCache's re-forwards) is not model work and is not
counted; the compiled step's own count (`tpu.aot.jaxpr_matmul_flops`) includes it.
"""

from __future__ import annotations

import math
from typing import Mapping, Sequence


def matmul_weights_per_token(cfg) -> int:
    """N: the weights one token multiplies in one encoder layer stack (T5 or BERT configs)."""
    d, inner, ff = cfg.d_model, cfg.num_heads * cfg.d_kv, cfg.d_ff
    mlp_in = 2 if getattr(cfg, "mlp_activation", "") == "gated-gelu" else 1
    return cfg.num_layers * (3 * d * inner + inner * d + mlp_in * d * ff + ff * d)


def encoder_forward_flops(cfg, length: int, head_dim_out: int) -> float:
    """Matmul FLOPs of one encoder forward over one sequence of `length` tokens, plus its head."""
    inner = cfg.num_heads * cfg.d_kv
    attention_per_token = 2 * 2 * length * inner
    return length * (2 * matmul_weights_per_token(cfg) + cfg.num_layers * attention_per_token) + 2 * cfg.d_model * head_dim_out


def train_step_model_flops(cfg, batch_shapes: Mapping[str, Sequence[int]], head_dim_out: int) -> float:
    """Model FLOPs of one train step over a batch of int arrays [..., L] (every array is one tower's input)."""
    forward = sum(math.prod(shape[:-1]) * encoder_forward_flops(cfg, shape[-1], head_dim_out)
                  for shape in batch_shapes.values())
    return 3 * forward

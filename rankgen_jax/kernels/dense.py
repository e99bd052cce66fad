"""A dense layer x w on CPU whose weight gradient x^T d_y is the kernel of `cpu_kernels.cc`.

The forward product and d_x = d_y w^T stay with XLA, which runs them near the
machine's matmul peak; XLA:CPU runs the transposed-left weight-gradient product
well below it when the weight is small against the token count. On the 2-core
dev machine at 8192 tokens (GFLOP/s, XLA -> kernel, spread over runs): [128, 128]
70-145 -> 114-184, [128, 512] 151-187 -> 152-204, [512, 384] 184-204 -> 190-274;
at [512, 1024] and [1024, 512] the two trade places from run to run, and T5 small's
step did not move. The kernel is used for weights up to 512 x 512.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from rankgen_jax.kernels import build

WEIGHT_GRADIENT_TARGET = "rankgen_weight_gradient"
MATMUL_TARGET = "rankgen_matmul"
MATMUL_TRANSPOSED_TARGET = "rankgen_matmul_transposed"
MAX_KERNEL_GRADIENT_ELEMENTS = 512 * 512


def kernel_gradient_applies(m: int, n: int) -> bool:
    """Whether a [m, n] weight's gradient is faster by the kernel than by XLA (see the module docstring)."""
    return m * n <= MAX_KERNEL_GRADIENT_ELEMENTS


def weight_gradient(x_TxM: jax.Array, d_y_TxN: jax.Array) -> jax.Array:
    """x^T d_y in float32 for 2-D x [T, M] and d_y [T, N]."""
    build.require()
    out_type = jax.ShapeDtypeStruct((x_TxM.shape[-1], d_y_TxN.shape[-1]), jnp.float32)
    return jax.ffi.ffi_call(WEIGHT_GRADIENT_TARGET, out_type)(x_TxM.astype(jnp.float32), d_y_TxN.astype(jnp.float32))


def matmul(a: jax.Array, w: jax.Array, transposed: bool = False) -> jax.Array:
    """a [..., K] @ w for float32 w [K, N], or @ w.T for w [N, K] when `transposed`."""
    build.require()
    n = w.shape[0] if transposed else w.shape[1]
    out_type = jax.ShapeDtypeStruct((*a.shape[:-1], n), jnp.float32)
    target = MATMUL_TRANSPOSED_TARGET if transposed else MATMUL_TARGET
    return jax.ffi.ffi_call(target, out_type)(a.astype(jnp.float32), w.astype(jnp.float32))


@jax.custom_vjp
def fused_dense(x: jax.Array, w_MxN: jax.Array) -> jax.Array:
    """x @ w for float32 x [..., M] and w [M, N], with the CPU kernels' matmuls."""
    return matmul(x, w_MxN)


def _fwd(x, w_MxN):
    return matmul(x, w_MxN), (x, w_MxN)


def _bwd(residuals, d_y):
    x, w_MxN = residuals
    d_x = matmul(d_y, w_MxN, transposed=True)
    x_TxM, d_y_TxN = x.reshape(-1, x.shape[-1]), d_y.reshape(-1, d_y.shape[-1])
    if kernel_gradient_applies(*w_MxN.shape):
        d_w = weight_gradient(x_TxM, d_y_TxN)
    else:
        d_w = jnp.dot(x_TxM.T, d_y_TxN)
    return d_x, d_w


fused_dense.defvjp(_fwd, _bwd)

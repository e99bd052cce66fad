"""Nominal dense bfloat16 peaks of the chips the project compiles for or benchmarks on, for MFU figures.

Vendor figures (dense, no sparsity), per chip: a TPU v3 or v4 chip has two
TensorCores (a v3-128 slice is 64 chips), v5e and v6e one, v5p two. MFU
divides the model's FLOPs per step by the step time and by these.
"""

from __future__ import annotations

# chip generation -> (dense bf16 TFLOP/s per chip, TensorCores or GPUs per chip, HBM GiB per chip)
PEAK_BF16_TFLOPS: dict[str, tuple[float, int, float]] = {
    "v3": (123.0, 2, 32.0),
    "v4": (275.0, 2, 32.0),
    "v5e": (197.0, 1, 16.0),
    "v5p": (459.0, 2, 95.0),
    "v6e": (918.0, 1, 32.0),
    "A100": (312.0, 1, 80.0),
    "H100": (989.4, 1, 80.0),
    "H200": (989.4, 1, 141.0),
}

# Substrings of jax's `device_kind` / torch's device name -> the table's key, most specific first.
_KIND_NAMES = (("v5 lite", "v5e"), ("v5e", "v5e"), ("v5p", "v5p"), ("v6 lite", "v6e"), ("v6e", "v6e"),
               ("v4", "v4"), ("v3", "v3"), ("h200", "H200"), ("h100", "H100"), ("a100", "A100"))


def chip_generation(device_kind: str) -> str | None:
    """The table's key for a device kind ('TPU v4', 'NVIDIA H200', 'TPU v5 lite'), or None if not listed."""
    kind = device_kind.lower()
    return next((key for name, key in _KIND_NAMES if name in kind), None)


def peak_tflops(device_kind: str) -> float | None:
    """Nominal dense bf16 TFLOP/s of one chip of this kind, or None if the table has no figure."""
    key = chip_generation(device_kind)
    return PEAK_BF16_TFLOPS[key][0] if key else None

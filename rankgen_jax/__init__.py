"""rankgen_jax: RankGen-style ranking models in JAX/Flax; `RankGenEncoder` and `RankGenGenerator` (the released
`rankgen` package's names) are loaded on first use."""

__all__ = ["RankGenEncoder", "RankGenGenerator"]


def __getattr__(name):
    # Lazy, so `import rankgen_jax` (and the CLI, which sets XLA flags first) does not import jax.
    if name == "RankGenEncoder":
        from rankgen_jax.inference.api import RankGenEncoder

        return RankGenEncoder
    if name == "RankGenGenerator":
        from rankgen_jax.lm.generation import RankGenGenerator

        return RankGenGenerator
    raise AttributeError(f"module 'rankgen_jax' has no attribute {name!r}")


def __dir__():
    return sorted(list(globals()) + __all__)

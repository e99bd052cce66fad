"""rankgen_jax: RankGen-style ranking models on T5 encoders, in JAX/Flax."""

from pathlib import Path

from setuptools import find_packages, setup

setup(
    name="rankgen_jax",
    version="0.1.0",
    description="Train and use RankGen-style ranking models (dual and cross encoders) on T5 encoders in JAX/Flax.",
    long_description=Path(__file__).with_name("README.md").read_text(encoding="utf-8")
    if Path(__file__).with_name("README.md").exists()
    else "",
    long_description_content_type="text/markdown",
    python_requires=">=3.11",
    packages=find_packages(include=["rankgen_jax", "rankgen_jax.*", "tasks"]),
    package_data={"rankgen_jax": ["kernels/cpu_kernels.cc"]},
    # Exact pins live in requirements.txt (CPU) and requirements-tpu.txt.
    install_requires=[
        "jax", "flax", "optax", "orbax-checkpoint", "tensorstore", "numpy", "gin-config",
        "sentencepiece", "safetensors", "msgpack", "tqdm",
    ],
    extras_require={"torch": ["torch", "transformers"], "data": ["seqio"], "retrieval": ["faiss-cpu"]},
    entry_points={"console_scripts": ["rankgen-jax=rankgen_jax.cli.main:console_main"]},
)

"""Files the package reads at run time: the gin configs, the demo corpus and vocabulary, the perspectives works.

In a source checkout they are the repository's own folders (`gin_configs/`, `data/`). A wheel carries the same
folders inside the package, under `rankgen_jax/bundled/` (pyproject.toml maps them there), so that an installed
`rankgen-jax` finds them wherever it runs. Callers name a file by its path in the repository.
"""

from __future__ import annotations

from pathlib import Path

PACKAGE_DIR = Path(__file__).resolve().parent
# The checkout the package runs from; in an installed wheel, site-packages (which has no gin_configs/ or data/).
REPO_ROOT = PACKAGE_DIR.parent
BUNDLED_DIR = PACKAGE_DIR / "bundled"


def resource_path(relative: str) -> Path:
    """A run-time file or folder by its path in the repository (e.g. "data/corpus"): the wheel's copy or the checkout's.

    The wheel's copy wins: an installed package must not read a folder of that name that happens to sit beside it
    in site-packages. Where neither exists, the checkout's path is returned, so that the caller's "not found"
    error names the path a developer expects.
    """
    bundled = BUNDLED_DIR / relative
    return bundled if bundled.exists() else REPO_ROOT / relative


GIN_CONFIGS_DIR = resource_path("gin_configs")
BUNDLED_CORPUS = resource_path("data/corpus")  # the demo's books
DEMO_VOCAB = resource_path("data/vocab/demo_spiece_8k.model")
PERSPECTIVES_DIR = resource_path("data/perspectives")  # works.json and the works it lists
MPTS_DIR = resource_path("data/mpts")  # the MPTS dev and test splits

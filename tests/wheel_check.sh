#!/usr/bin/env bash
# The package as a user gets it (`make wheel-check`, run by .ci/run): build the wheel from the files a clean
# clone has, install it with its dependencies into a new venv, and use it from a folder outside the checkout.
#
#   1. the plain install: `rankgen-jax --help`, every module outside the extras imports, the CPU plug-in builds,
#      a tiny train with it (`rankgen-jax-cpu`) on the bundled books with the bundled vocabulary (gin files found
#      in the package) and `export-hf`;
#   2. the torch extra added: transformers loads the export (its modeling_rankgen.py comes from the wheel) and
#      gives the vectors `rankgen-jax encode` gives.
#
# Versions are held to requirements.txt's pins (a constraints file): the set CI tests, and torch stays the
# CPU build pip finds for torch==2.13.0. Everything lives in .wheel-check/ (ignored), made anew each run; its
# venv is removed when the check passes.
#   tests/wheel_check.sh                 # PYTHON=.venv/bin/python by default (builds the wheel, makes the venv)
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
PYTHON="${PYTHON:-$ROOT/.venv/bin/python}"
WORK="$ROOT/.wheel-check"
PIP_QUIET=(--disable-pip-version-check -q)

step() { printf '[wheel-check %4ds] %s\n' "$SECONDS" "$*"; }
# pip's output goes to a log, shown only when pip fails.
pip_logged() {
    if ! "$@" >> "$WORK/pip.log" 2>&1; then
        tail -n 40 "$WORK/pip.log" >&2
        return 1
    fi
}

step "removing the previous $WORK"
rm -rf "$WORK"
mkdir -p "$WORK/src" "$WORK/dist"
RUN="$(mktemp -d)"  # outside the checkout: nothing there can be picked up from the source tree
trap 'rm -rf "$RUN"' EXIT

step "copying the files git tracks (or would) into $WORK/src"
(cd "$ROOT" && git ls-files -z --cached --others --exclude-standard \
    | while IFS= read -r -d '' f; do [[ -f "$f" ]] && printf '%s\0' "$f"; done \
    | tar --null -T - -cf -) | tar -xf - -C "$WORK/src"

step "building the wheel"
pip_logged "$PYTHON" -m pip wheel "${PIP_QUIET[@]}" --no-deps --no-build-isolation -w "$WORK/dist" "$WORK/src"
WHEEL="$(ls "$WORK"/dist/rankgen_jax-*.whl)"

step "installing $(basename "$WHEEL") with its dependencies into a new venv"
"$PYTHON" -m venv "$WORK/venv"
VENV_PY="$WORK/venv/bin/python"
pip_logged "$VENV_PY" -m pip install "${PIP_QUIET[@]}" -c "$ROOT/requirements.txt" "$WHEEL"

cd "$RUN"
export PYTHONPATH=  # nothing but the venv
export RANKGEN_KERNEL_CACHE="$RUN/kernels"  # the kernels compile from the wheel's cpu_kernels.cc
RANKGEN="$WORK/venv/bin/rankgen-jax"

step "rankgen-jax --help"
"$RANKGEN" --help > help.txt
grep -q "export-hf" help.txt

step "importing every module outside the extras, from the installed package"
"$VENV_PY" - <<'EOF'
import importlib, importlib.util, pkgutil, sys
import rankgen_jax

site = rankgen_jax.__path__[0]
assert site.startswith(sys.prefix), f"rankgen_jax imported from {site}, not the venv"
extras = ("rankgen_jax.data.seqio", "rankgen_jax.checkpoints.hf.modeling_", "rankgen_jax.experiments.smoke")
names = [m.name for m in pkgutil.walk_packages(rankgen_jax.__path__, "rankgen_jax.")
         if not m.name.startswith(extras) and not m.name.endswith(".__main__")]  # __main__ runs the command
for name in names:
    importlib.import_module(name)
for absent in ("torch", "transformers", "seqio", "faiss"):
    assert importlib.util.find_spec(absent) is None, f"{absent} came with the plain install"
from rankgen_jax_cpu import build
assert build.available(), "the CPU plug-in's kernels did not build from the installed cpu_kernels.cc"
print(f"imported {len(names)} modules from {site}; torch, transformers, seqio, faiss absent; kernels built")
EOF

step "rankgen-jax-cpu train (tiny T5, 2 steps, the bundled books and vocabulary; the CPU plug-in's kernels)"
"$WORK/venv/bin/rankgen-jax-cpu" train --gin_file rankgen_t5_tiny_books.gin --workdir "$RUN/tiny" \
    --gin.TrainerConfig.num_steps=2 --gin.OptimizerConfig.warmup_steps=1 --gin.TrainerConfig.eval_every=0 \
    --gin.TrainerConfig.checkpoint_every=2 \
    --gin.DataConfig.batch_size=4 > train.txt
tail -n 1 train.txt

step "rankgen-jax export-hf"
"$RANKGEN" export-hf --checkpoint "$RUN/tiny" --out "$RUN/hf"
test -f "$RUN/hf/modeling_rankgen.py"
printf '%s\n' "Emma Woodhouse, handsome, clever, and rich." "It was a dark and stormy night." > texts.txt
"$RANKGEN" encode --model "$RUN/hf" --input texts.txt --side prefix --output jax.npy

step "a command that needs an extra says which"
printf 'd1\tEmma Woodhouse, handsome, clever, and rich.\nd2\tIt was a dark and stormy night.\n' > corpus.tsv
if "$RANKGEN" index --model "$RUN/hf" --corpus corpus.tsv --out "$RUN/index" 2> index.txt; then
    echo "index ran without faiss" >&2; exit 1
fi
cat index.txt
grep -q "pip install 'rankgen-jax\[retrieval\]'" index.txt

step "adding the torch extra (torch==2.13.0: the CPU build)"
pip_logged "$VENV_PY" -m pip install "${PIP_QUIET[@]}" -c "$ROOT/requirements.txt" "$WHEEL[torch]"

step "transformers loads the export and gives the same vectors"
"$VENV_PY" - <<'EOF'
import numpy as np
import torch
from transformers import AutoModel, AutoTokenizer

assert "+cpu" in torch.__version__ or not torch.cuda.is_available(), torch.__version__
texts = open("texts.txt", encoding="utf-8").read().splitlines()
tokenizer = AutoTokenizer.from_pretrained("hf")
model = AutoModel.from_pretrained("hf", trust_remote_code=True).eval()
batch = tokenizer(["pre " + t for t in texts], padding=True, return_tensors="pt")
with torch.no_grad():
    hf_vectors = model(**batch).numpy()
jax_vectors = np.load("jax.npy")
difference = float(np.abs(hf_vectors - jax_vectors).max())
print(f"torch {torch.__version__}: {type(model).__name__} vectors {hf_vectors.shape}, "
      f"max |transformers - rankgen-jax encode| = {difference:.2e}")
assert hf_vectors.shape == jax_vectors.shape and difference < 1e-4, difference
EOF
# The venv (a couple of GB) goes once the check passed: CI's test suite runs next on the same disk. A failed
# check keeps it for a look.
step "removing $WORK/venv"
rm -rf "$WORK/venv"
step "ok"

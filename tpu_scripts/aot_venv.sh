#!/usr/bin/env bash
# Create .venv-aot: the main .venv plus libtpu, for `rankgen-jax compile` (ahead-of-time
# compilation for a TPU topology on a CPU machine) and tests/test_aot.py.
#
#   tpu_scripts/aot_venv.sh                 # needs .venv (make venv) first
#   .venv-aot/bin/rankgen-jax compile --topology v3-128 --gin_file tpu/rankgen_xl_v3_128.gin
#   .venv-aot/bin/python -m pytest -q tests/test_aot.py
#
# libtpu stays out of .venv: with it installed, every jax start on a CPU machine
# prints libtpu's "could not determine TPU accelerator type" warnings. .venv-aot
# holds only libtpu (~0.7 GB); everything else comes from .venv through a .pth
# file, so the two never drift apart. The libtpu pin is read from
# requirements-tpu.txt, the one place it lives.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
MAIN="${MAIN_VENV:-$ROOT/.venv}"
AOT="${AOT_VENV:-$ROOT/.venv-aot}"

if [[ ! -x "$MAIN/bin/python" ]]; then
    echo "error: $MAIN/bin/python not found: create the main venv first (make venv)" >&2
    exit 2
fi
PIN="$(grep -E '^libtpu==' "$ROOT/requirements-tpu.txt" | head -n 1 | tr -d '[:space:]')"
if [[ -z "$PIN" ]]; then
    echo "error: no libtpu==VERSION line in $ROOT/requirements-tpu.txt" >&2
    exit 2
fi

# The main venv's interpreter, so both venvs run the same Python version.
test -x "$AOT/bin/python" || "$MAIN/bin/python" -m venv "$AOT"
MAIN_SITE="$("$MAIN/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
AOT_SITE="$("$AOT/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
# addsitedir (not a bare path line) so .venv's own .pth files run too: the editable rankgen_jax install.
echo "import site; site.addsitedir('$MAIN_SITE')" > "$AOT_SITE/_rankgen_main_venv.pth"
# --no-deps: libtpu needs nothing, and jax must stay the main venv's copy.
"$AOT/bin/python" -m pip install --disable-pip-version-check -q --no-deps "$PIN"

cat > "$AOT/bin/rankgen-jax" <<EOF
#!/bin/sh
exec "$AOT/bin/python" -m rankgen_jax.cli.main "\$@"
EOF
chmod +x "$AOT/bin/rankgen-jax"

# A check that the pair works: a compile-only v3-8 topology from libtpu, no TPU needed.
JAX_PLATFORMS=cpu "$AOT/bin/python" - <<'EOF' 2>/dev/null
import jax
import libtpu  # noqa: F401
from jax.experimental import topologies

devices = topologies.get_topology_desc(topology_name="v3:2x2", platform="tpu").devices
print(f"ok: jax {jax.__version__}, libtpu, compile-only topology v3:2x2 with {len(devices)} {devices[0].device_kind} devices")
EOF
echo "created $AOT (run: $AOT/bin/rankgen-jax compile --help)"

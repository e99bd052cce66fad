#!/usr/bin/env bash
# Start the same rankgen-jax command on every worker, one log per worker.
# Arguments go to `tpu.py launch` (see docs/tpu.md); add --dry_run to print the gcloud commands.
set -euo pipefail
exec "${PYTHON:-python3}" "$(dirname "$0")/tpu.py" launch "$@"

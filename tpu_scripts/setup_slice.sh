#!/usr/bin/env bash
# Copy the code to every worker of a slice and install the pinned TPU requirements.
# Arguments go to `tpu.py setup` (see docs/tpu.md); add --dry_run to print the gcloud commands.
set -euo pipefail
exec "${PYTHON:-python3}" "$(dirname "$0")/tpu.py" setup "$@"

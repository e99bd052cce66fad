#!/usr/bin/env bash
# Create a TPU VM slice, or queue one with --queued.
# Arguments go to `tpu.py create` (see docs/tpu.md); add --dry_run to print the gcloud commands.
set -euo pipefail
exec "${PYTHON:-python3}" "$(dirname "$0")/tpu.py" create "$@"

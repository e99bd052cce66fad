#!/usr/bin/env bash
# Delete a slice (with --queued: the queued resource and its node).
# Arguments go to `tpu.py delete` (see docs/tpu.md); add --dry_run to print the gcloud commands.
set -euo pipefail
exec "${PYTHON:-python3}" "$(dirname "$0")/tpu.py" delete "$@"

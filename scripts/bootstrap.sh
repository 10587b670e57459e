#!/usr/bin/env bash
# Create .venv with Python 3.11+ and install Kelvin into it (editable), with test
# and plugin extras when asked: scripts/bootstrap.sh [extras]
set -euo pipefail
cd "$(dirname "$0")/.."
extras="${1:-}"
venv="${VENV:-.venv}"
pick_python() {
  for c in python3.13 python3.12 python3.11 python3; do
    if command -v "$c" >/dev/null 2>&1 && "$c" -c 'import sys; sys.exit(sys.version_info < (3, 11))'; then
      echo "$c"; return 0
    fi
  done
  return 1
}
if [ ! -x "$venv/bin/python" ]; then
  py=$(pick_python) || { echo "bootstrap: Python 3.11+ is required (apt-get install python3 python3-venv)" >&2; exit 1; }
  "$py" -m venv "$venv" || { echo "bootstrap: cannot create $venv (apt-get install python3-venv)" >&2; exit 1; }
  "$venv/bin/python" -m pip install -q --upgrade pip
fi
stamp="$venv/.installed${extras:+-$extras}"
# (the compiled core is rebuilt when its C sources change: services/common/native.py)
stale=$(find pyproject.toml setup.py services/common/csrc -newer "$stamp" 2>/dev/null | head -1 || true)
if [ ! -f "$stamp" ] || [ -n "$stale" ]; then
  spec="."
  [ -n "$extras" ] && spec=".[$extras]"
  "$venv/bin/python" -m pip install -q -e "$spec"
  touch "$stamp"
fi

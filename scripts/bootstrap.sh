#!/usr/bin/env bash
# Create .venv with Python 3.11+ and install Kelvin into it (editable), with test
# and plugin extras when asked: scripts/bootstrap.sh [extras]
# It says what it is doing: one line per package pip fetches, a summary at the end;
# pip's whole output goes to $venv/install.log (shown when pip fails).
set -euo pipefail
cd "$(dirname "$0")/.."
extras="${1:-}"
venv="${VENV:-.venv}"
say() { printf 'bootstrap: %s\n' "$*"; }
pick_python() {
  for c in python3.13 python3.12 python3.11 python3; do
    # pyenv shims exist for versions that are not selected: probe quietly
    if command -v "$c" >/dev/null 2>&1 && "$c" -c 'import sys; sys.exit(sys.version_info < (3, 11))' 2>/dev/null; then
      echo "$c"; return 0
    fi
  done
  return 1
}
# pip's output, condensed to what a person waiting wants to see; the rest is in the log.
progress() {
  awk '
    /^(Collecting|Processing) / { n++; name = $2; sub(".*/", "", name); printf "  [%d] %s\n", n, name; fflush(); next }
    /^Building (editable|wheels) for collected packages:/ { sub(/^.*packages: /, ""); print "  building " $0; fflush(); next }
    /^Installing collected packages:/ { print "  installing " (n ? n " packages" : "the packages") " into the venv ..."; fflush(); next }
    /^Successfully installed/ { print "  done: " (NF - 2) " installed or updated"; fflush(); next }
    /^(ERROR|error):/ { print; fflush() }
  '
}
pip_install() {
  local log="$venv/install.log"
  if ! "$venv/bin/python" -m pip install --progress-bar off --disable-pip-version-check "$@" >"$log" 2>&1 < /dev/null; then
    progress <"$log"
    say "pip failed; the end of $log:" >&2
    tail -n 30 "$log" >&2
    exit 1
  fi
  progress <"$log"
}
if [ ! -x "$venv/bin/python" ]; then
  py=$(pick_python) || { echo "bootstrap: Python 3.11+ is required (apt-get install python3 python3-venv)" >&2; exit 1; }
  say "creating $venv with $("$py" -c 'import sys; print("Python %d.%d.%d" % sys.version_info[:3])')"
  "$py" -m venv "$venv" || { echo "bootstrap: cannot create $venv (apt-get install python3-venv)" >&2; exit 1; }
  say "updating pip in $venv"
  pip_install -q --upgrade pip
fi
stamp="$venv/.installed${extras:+-$extras}"
if [ ! -f "$stamp" ] || [ pyproject.toml -nt "$stamp" ]; then
  spec="."
  [ -n "$extras" ] && spec=".[$extras]"
  say "installing Kelvin${extras:+ with [$extras]} and its dependencies into $venv (about a minute the first time; log: $venv/install.log)"
  started=$SECONDS
  # pip prints one "Collecting" line per package as it resolves: shown live, one by one.
  set +e
  "$venv/bin/python" -m pip install --progress-bar off --disable-pip-version-check -e "$spec" \
    < /dev/null 2>&1 | tee "$venv/install.log" | progress
  status=${PIPESTATUS[0]}
  set -e
  if [ "$status" -ne 0 ]; then
    say "pip failed (exit $status); the end of $venv/install.log:" >&2
    tail -n 30 "$venv/install.log" >&2
    exit "$status"
  fi
  say "installed in $((SECONDS - started)) s"
  touch "$stamp"
fi

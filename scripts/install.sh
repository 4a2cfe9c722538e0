#!/usr/bin/env bash
# install.sh -- create .venv in the repository and install chainrun into it (with test extras).
# Works as root on a fresh Debian 12 machine (installs python3-venv if the venv module is missing)
# and as a normal user where Python >= 3.11 is already there.
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
PY=${PYTHON:-python3}
log() { printf '[install] %s\n' "$*" >&2; }

"$PY" -c 'import sys; sys.exit(sys.version_info < (3, 11))' || { log "need Python >= 3.11 (found $("$PY" --version 2>&1))"; exit 1; }
if [[ ! -x $ROOT/.venv/bin/python ]]; then
  if ! "$PY" -m venv "$ROOT/.venv" 2>/dev/null; then
    if [[ $(id -u) -eq 0 ]] && command -v apt-get >/dev/null; then
      log "installing python3-venv"
      DEBIAN_FRONTEND=noninteractive apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq python3-venv >/dev/null
      rm -rf "$ROOT/.venv"; "$PY" -m venv "$ROOT/.venv"
    else
      log "python -m venv failed; install your distribution's venv package"; exit 1
    fi
  fi
fi
"$ROOT/.venv/bin/python" -m pip install -q --upgrade pip 2>&1 | grep -v -i warning || true
"$ROOT/.venv/bin/python" -m pip install -q -e "$ROOT[test]" 2>&1 | grep -v -i warning || true
"$ROOT/.venv/bin/chainrun" --version >/dev/null || { log "chainrun did not install"; exit 1; }
log "chainrun $("$ROOT/.venv/bin/chainrun" --version | cut -d' ' -f2) installed in $ROOT/.venv"

#!/usr/bin/env bash
# install.sh [EXTRA...] -- create .venv in the repository and install chainrun into it with the
# given extras (default: test), e.g. `scripts/install.sh test templates`. pip is quiet: its
# output is shown only when it fails (on stderr, and the script exits with pip's code).
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
# quiet_pip ARGS...: pip install, silent on success; on failure its whole output goes to stderr
# and the script stops with pip's exit code (nothing is filtered, so no failure is hidden)
quiet_pip() {
  local out rc=0
  out=$(mktemp "${TMPDIR:-/tmp}/chainrun-pip.XXXXXX")
  "$ROOT/.venv/bin/python" -m pip install -q --disable-pip-version-check "$@" >"$out" 2>&1 || rc=$?
  if [[ $rc -ne 0 ]]; then
    log "pip install $* failed (exit $rc):"
    cat "$out" >&2
    rm -f "$out"
    exit "$rc"
  fi
  rm -f "$out"
}

extras=$(IFS=,; echo "${*:-test}")
quiet_pip --upgrade pip
quiet_pip -e "$ROOT[$extras]"
"$ROOT/.venv/bin/chainrun" --version >/dev/null || { log "chainrun did not install"; exit 1; }
log "chainrun $("$ROOT/.venv/bin/chainrun" --version | cut -d' ' -f2) installed in $ROOT/.venv (extras: $extras)"

#!/usr/bin/env bash
# test.sh -- the whole test suite on a fresh Debian machine, as root:
# installs chainrun, brings up the local Slurm test cluster (and sshd), runs pytest.
# In CI (CI=true) a test that needs Slurm and finds none fails instead of skipping.
# Extra arguments go to pytest, e.g.: scripts/test.sh -k parsers
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT"
bash scripts/install.sh
.venv/bin/python -m pip install -q -e ".[templates]" 2>&1 | { grep -v -i warning || true; }  # torch, lightning, transformers for the template tests
command -v tmux >/dev/null || { [[ $(id -u) -eq 0 ]] && DEBIAN_FRONTEND=noninteractive apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq tmux >/dev/null; } || echo "[test] tmux missing; the watch screenshot test will say so" >&2
export CHAINRUN_SLURM_USERS=${CHAINRUN_SLURM_USERS:-chainrun}  # the SSH tests' remote user gets an association
bash scripts/start-cluster.sh >/dev/null
export SLURM_CONF=${SLURM_CONF:-/tmp/chainrun-slurm/etc/slurm.conf}
if [[ -x scripts/start-sshd.sh ]] || [[ -f scripts/start-sshd.sh ]]; then
  bash scripts/start-sshd.sh >/dev/null 2>&1 || echo "[test] sshd did not start; SSH tests will report it" >&2
fi
exec .venv/bin/python -m pytest -q -p no:cacheprovider "$@"

#!/usr/bin/env bash
# test.sh -- the whole test suite on a fresh Debian machine, as root:
# installs chainrun, brings up the local Slurm test cluster (and sshd), runs pytest.
# In CI (CI=true) a test that needs Slurm and finds none fails instead of skipping.
# Extra arguments go to pytest, e.g.: scripts/test.sh -k parsers
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT"
bash scripts/install.sh
export CHAINRUN_SLURM_USERS=${CHAINRUN_SLURM_USERS:-chainrun}  # the SSH tests' remote user gets an association
bash scripts/start-cluster.sh >/dev/null
export SLURM_CONF=${SLURM_CONF:-/tmp/chainrun-slurm/etc/slurm.conf}
if [[ -x scripts/start-sshd.sh ]] || [[ -f scripts/start-sshd.sh ]]; then
  bash scripts/start-sshd.sh >/dev/null 2>&1 || echo "[test] sshd did not start; SSH tests will report it" >&2
fi
exec .venv/bin/python -m pytest -q -p no:cacheprovider "$@"

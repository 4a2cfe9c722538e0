#!/usr/bin/env bash
# test.sh -- the whole test suite on a fresh Debian machine, as root:
# installs chainrun, brings up the local Slurm test cluster (and sshd), runs pytest.
# In CI (CI=true) a test that needs Slurm and finds none fails instead of skipping.
# It installs chainrun with the `test` and `templates` extras: torch, Lightning and Transformers
# (about 1.6 GB in .venv) for the trainer-template tests.
# Core only (no torch, template tests left out; CI never does this):
#   scripts/test.sh --core        or        CHAINRUN_TEST_CORE=1 scripts/test.sh
# Other arguments go to pytest, e.g.: scripts/test.sh -k parsers
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT"
core=${CHAINRUN_TEST_CORE:-0}
if [[ ${1:-} == --core ]]; then core=1; shift; fi
pytest_extra=()
if [[ $core == 1 ]]; then
  echo "[test] core only: no templates extra; tests/ux/test_slurm_ux.py (the trainer templates) left out" >&2
  bash scripts/install.sh test
  pytest_extra=(--ignore=tests/ux/test_slurm_ux.py)
else
  bash scripts/install.sh test templates
fi
command -v tmux >/dev/null || { [[ $(id -u) -eq 0 ]] && DEBIAN_FRONTEND=noninteractive apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq tmux >/dev/null; } || echo "[test] tmux missing; the watch screenshot test will say so" >&2
export CHAINRUN_SLURM_USERS=${CHAINRUN_SLURM_USERS:-chainrun}  # the SSH tests' remote user gets an association
bash scripts/start-cluster.sh >/dev/null
export SLURM_CONF=${SLURM_CONF:-/tmp/chainrun-slurm/etc/slurm.conf}
if [[ -x scripts/start-sshd.sh ]] || [[ -f scripts/start-sshd.sh ]]; then
  bash scripts/start-sshd.sh >/dev/null 2>&1 || echo "[test] sshd did not start; SSH tests will report it" >&2
fi
exec .venv/bin/python -m pytest -q -p no:cacheprovider "${pytest_extra[@]}" "$@"

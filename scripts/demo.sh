#!/usr/bin/env bash
# demo.sh -- the main job on a fresh Debian machine, as root: install chainrun, start a real
# local Slurm, run a 3-segment chain of the toy trainer under the `lead` policy, show it finish.
#
# The test partition allows 2 minutes, so 3 minutes of training (--total counts the trainer's
# run time) become three or four 2-minute segments (Slurm sends the signal up to a minute early).
# Segments are pinned to one node held exclusively, as on a busy cluster: each next segment is
# submitted early (--lead 40s), waits in the queue, and starts the moment its predecessor
# has checkpointed and left. Takes about 7 minutes.
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT"
bash scripts/install.sh
bash scripts/start-cluster.sh >/dev/null
export SLURM_CONF=${SLURM_CONF:-/tmp/chainrun-slurm/etc/slurm.conf}
export CHAINRUN_HOME=${CHAINRUN_HOME:-/tmp/chainrun-demo/home}
WORK=/tmp/chainrun-demo/work; mkdir -p "$WORK"; cd "$WORK"
CR=$ROOT/.venv/bin/chainrun

echo "== chainrun submit (toy trainer, 3 min of training in 2-min segments, policy lead)"
"$CR" submit "$ROOT/templates/toy_train.sh" --total 3m --policy lead --lead 40s --signal USR2@30 --name demo \
  -- --nodelist=n1 --exclusive
echo "== chainrun watch (until the chain is done)"
"$CR" watch --interval 5 --until-done
echo "== chainrun status"
chain=$("$CR" status --json | "$ROOT/.venv/bin/python" -c 'import json,sys; print(json.load(sys.stdin)["data"][-1]["id"])')
COLUMNS=${COLUMNS:-140} "$CR" status "$chain"
echo "== the toy trainer's checkpoints"
tail -n 3 "$WORK/chainrun-runs/$chain/checkpoint/steps.log"

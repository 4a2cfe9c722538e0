#!/usr/bin/env bash
# test.sh -- the whole test suite on a fresh Debian machine, as root:
# installs chainrun, brings up the local Slurm test cluster (and sshd), runs pytest.
# In CI (CI=true) a test that needs Slurm and finds none fails instead of skipping.
# It installs chainrun with the `test` and `templates` extras: torch, Lightning and Transformers
# (about 1.6 GB in .venv) for the trainer-template tests.
# Core only (no torch, template tests left out; CI never does this):
#   scripts/test.sh --core        or        CHAINRUN_TEST_CORE=1 scripts/test.sh
# Other arguments go to pytest, e.g.: scripts/test.sh -k parsers (then one pytest run, main cluster).
# Without arguments the suite runs in three lanes at once, each on its own real test cluster (see below);
# CHAINRUN_TEST_LANES=1 runs it as one lane.
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
# sshfs: tests/test_store_shared_mount.py mounts one export twice (two login nodes' caches) where the kernel has no NFS
command -v sshfs >/dev/null || { [[ $(id -u) -eq 0 ]] && DEBIAN_FRONTEND=noninteractive apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq sshfs >/dev/null; } || echo "[test] sshfs missing; the shared-mount store test will skip and say so" >&2
# crontab: tests/test_schedule.py edits a real crontab (and puts it back); the cron daemon is kept from starting
if ! command -v crontab >/dev/null && [[ $(id -u) -eq 0 ]]; then
  nopol=0; [[ -e /usr/sbin/policy-rc.d ]] || { printf '#!/bin/sh\nexit 101\n' > /usr/sbin/policy-rc.d; chmod 755 /usr/sbin/policy-rc.d; nopol=1; }
  { DEBIAN_FRONTEND=noninteractive apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends cron >/dev/null; } || echo "[test] cron missing; the crontab test will skip and say so" >&2
  if ((nopol)); then rm -f /usr/sbin/policy-rc.d; fi
fi
export CHAINRUN_SLURM_USERS=${CHAINRUN_SLURM_USERS:-chainrun}  # the SSH tests' remote user gets an association
bash scripts/start-cluster.sh >/dev/null
export SLURM_CONF=${SLURM_CONF:-/tmp/chainrun-slurm/etc/slurm.conf}
if [[ -x scripts/start-sshd.sh ]] || [[ -f scripts/start-sshd.sh ]]; then
  bash scripts/start-sshd.sh >/dev/null 2>&1 || echo "[test] sshd did not start; SSH tests will report it" >&2
fi
PYTEST=(.venv/bin/python -m pytest -q -p no:cacheprovider "${pytest_extra[@]}")
# With arguments (a developer picking tests): one pytest run on the main cluster, as asked.
if (($#)) || [[ ${CHAINRUN_TEST_LANES:-2} == 1 ]]; then
  exec "${PYTEST[@]}" "$@"
fi

# The whole suite: three lanes at once, each on its own real cluster. Most of the suite's time is
# real chains waiting for real Slurm (sleeps, not CPU), so separate clusters cut the wall time without
# one lane's jobs queueing behind another's. Lanes B and C (the modules below) run on their own
# clusters under /tmp/chainrun-slurm-b and -c (own slurmctld, slurmd x4, slurmdbd and MariaDB on other
# ports); lane A, everything else, on the main cluster, which the SSH tests' remote shell also reaches.
# Each lane prints its slowest tests (--durations) so the next rebalance starts from numbers.
# Balanced from the lanes' --durations on a clean run (A 18 min, B 28 min, C 18 min before the
# trainer templates went to lane A and the busy-cluster doubt test to lane C: each ~21-23 min). Then the
# multi-cluster tests (checkpoint copies, sites, the two-cluster move: ~7 min, all on the main cluster and
# the SSH servers) joined lane A, and the UX test and the cross-site gate went to lane C; then (A 24, B 23,
# C 27 min) the elastic filler (~1.5 min) went from C to B; then (A 31.5, B 25.5, C 25.5 min, the second
# cluster started ahead) the store's kill test (~1.5 min, no Slurm) went to B and the wrapper's gate (~1.5
# min, bash without Slurm) to C.
LANE_B=(tests/chain/test_handoff_slurm.py tests/chain/test_chain_slurm.py tests/chain/test_cluster_slurm.py
        tests/chain/test_elastic_slurm.py tests/chain/test_settle_slurm.py tests/chain/test_watch_lease_slurm.py
        tests/chain/test_requeue_slurm.py tests/install/test_login_node_install.py
        tests/chain/test_elastic_filler_slurm.py tests/reliability/test_store_kill.py)
LANE_C=(tests/chain/test_placement_slurm.py tests/reliability/test_faults_slurm.py tests/chain/test_template_saves.py
        tests/chain/test_wrapper_field_slurm.py tests/chain/test_schedule_slurm.py tests/predict/test_slurm_doubt.py
        tests/chain/test_wrapper_gate_slurm.py tests/ux/test_slurm_ux.py tests/chain/test_wrapper_gate.py)
lane_b=(); lane_c=(); ignore=()
for f in "${LANE_B[@]}"; do
  [[ -e $f ]] || continue
  lane_b+=("$f"); ignore+=("--ignore=$f")
done
for f in "${LANE_C[@]}"; do
  [[ -e $f ]] || continue
  lane_c+=("$f"); ignore+=("--ignore=$f")
done
B_DIR=${CHAINRUN_SLURM_B_DIR:-/tmp/chainrun-slurm-b}
C_DIR=${CHAINRUN_SLURM_C_DIR:-/tmp/chainrun-slurm-c}
# the lanes' clusters, and lane A's second cluster for the multi-cluster SSH tests (tests/ssh/test_sites_slurm.py
# starts it with these settings if it is not up: ~1.5-4.5 min inside lane A otherwise), all at once: each has
# its own folder, ports and daemons, and the packages were installed by the main cluster's start above
starts=()
CHAINRUN_SLURM_PORT_BASE=8817 CHAINRUN_SLURM_DB_PORT=3309 CHAINRUN_SLURM_ETC_LINK=0 \
  bash scripts/start-cluster.sh "$B_DIR" >/dev/null & starts+=($!)
CHAINRUN_SLURM_PORT_BASE=8917 CHAINRUN_SLURM_DB_PORT=3310 CHAINRUN_SLURM_ETC_LINK=0 \
  bash scripts/start-cluster.sh "$C_DIR" >/dev/null & starts+=($!)
CHAINRUN_SLURM_PORT_BASE=9017 CHAINRUN_SLURM_DB_PORT=3311 CHAINRUN_SLURM_ETC_LINK=0 CHAINRUN_SLURM_CLUSTER=crsites \
  bash scripts/start-cluster.sh /tmp/chainrun-slurm-sites >/dev/null 2>&1 & sites_pid=$!
for p in "${starts[@]}"; do wait "$p"; done  # a lane cluster that did not start stops the run here
wait "$sites_pid" || echo "[test] the second cluster did not start ahead; tests/ssh/test_sites_slurm.py tries again" >&2
b_log=$(mktemp /tmp/chainrun-lane-b.XXXXXX.log); c_log=$(mktemp /tmp/chainrun-lane-c.XXXXXX.log)
echo "[test] lane B (${#lane_b[@]} modules) on $B_DIR, lane C (${#lane_c[@]} modules) on $C_DIR; their output follows lane A's" >&2
SLURM_CONF=$B_DIR/etc/slurm.conf "${PYTEST[@]}" --durations=15 "${lane_b[@]}" >"$b_log" 2>&1 &
b_pid=$!
SLURM_CONF=$C_DIR/etc/slurm.conf "${PYTEST[@]}" --durations=15 "${lane_c[@]}" >"$c_log" 2>&1 &
c_pid=$!
trap 'kill "$b_pid" "$c_pid" 2>/dev/null' EXIT
rc_a=0; "${PYTEST[@]}" --durations=25 "${ignore[@]}" || rc_a=$?
rc_b=0; wait "$b_pid" || rc_b=$?
rc_c=0; wait "$c_pid" || rc_c=$?
trap - EXIT
echo; echo "================ lane B: ${lane_b[*]} (cluster $B_DIR) ================"
cat "$b_log"; rm -f "$b_log"
echo; echo "================ lane C: ${lane_c[*]} (cluster $C_DIR) ================"
cat "$c_log"; rm -f "$c_log"
echo "[test] lane A exit $rc_a, lane B exit $rc_b, lane C exit $rc_c" >&2
((rc_a == 0 && rc_b == 0 && rc_c == 0))

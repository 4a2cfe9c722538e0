#!/usr/bin/env bash
# start-cluster.sh [DIR] -- install (if missing), configure and start a real,
# single-machine Slurm 22.05 test cluster (Debian 12 packages):
#   munged, mariadbd, slurmdbd, slurmctld and N slurmd (one per fake node n1..nN,
#   all on 127.0.0.1, distinct ports), accounting via slurmdbd+MariaDB.
# Everything (configs, state, logs, PID files) lives under DIR
# (default /tmp/chainrun-slurm). Idempotent: daemons whose PID file points at a
# live process of the right name are left alone. Must run as root.
# Tunables (environment): CHAINRUN_SLURM_NODES (4), CHAINRUN_SLURM_CPUS (4, per node),
#   CHAINRUN_SLURM_MEM (2000 MB per node), CHAINRUN_SLURM_GPUS (2 fake gpus per node, 0=off),
#   CHAINRUN_SLURM_MAXTIME (2, minutes, partition "short"), CHAINRUN_SLURM_CLUSTER (chainrun),
#   CHAINRUN_SLURM_PORT_BASE (6817: ctld=base, dbd=base+2, slurmd n_i=base+3+i),
#   CHAINRUN_SLURM_DB_PORT (3307), CHAINRUN_SLURM_USERS (extra users to give an association),
#   CHAINRUN_SLURM_ETC_LINK (1: point /etc/slurm/slurm.conf at DIR/etc/slurm.conf),
#   CHAINRUN_SLURM_TIMEOUT (90 s, per wait step), CHAINRUN_SLURM_PROCTRACK (proctrack/linuxproc),
#   CHAINRUN_SLURM_TASK (task/none), CHAINRUN_SLURM_RESTART (0; 1: a running cluster whose configuration
#   would change is stopped and started again; a change `scontrol reconfigure` applies is applied in place).
# Debian's slurm-client has no `scrontab`: it is built once from Debian's source of the same Slurm
# (install_scrontab below) into /usr/local/bin.
set -euo pipefail

DIR=${1:-${CHAINRUN_SLURM_DIR:-/tmp/chainrun-slurm}}
NODES=${CHAINRUN_SLURM_NODES:-4}
CPUS=${CHAINRUN_SLURM_CPUS:-4}
MEM=${CHAINRUN_SLURM_MEM:-2000}
GPUS=${CHAINRUN_SLURM_GPUS:-2}
MAXTIME=${CHAINRUN_SLURM_MAXTIME:-2}
CLUSTER=${CHAINRUN_SLURM_CLUSTER:-chainrun}
PORT_BASE=${CHAINRUN_SLURM_PORT_BASE:-6817}
DB_PORT=${CHAINRUN_SLURM_DB_PORT:-3307}
EXTRA_USERS=${CHAINRUN_SLURM_USERS:-}
ETC_LINK=${CHAINRUN_SLURM_ETC_LINK:-1}
TIMEOUT=${CHAINRUN_SLURM_TIMEOUT:-90}
PROCTRACK=${CHAINRUN_SLURM_PROCTRACK:-proctrack/linuxproc}
TASKPLUGIN=${CHAINRUN_SLURM_TASK:-task/none}
RESTART=${CHAINRUN_SLURM_RESTART:-0}
CTLD_PORT=$PORT_BASE
DBD_PORT=$((PORT_BASE + 2))
# rsync: checkpoint copies between the test clusters (mariadb-server pulls it in today; named so it stays)
PKGS=(munge mariadb-server slurmctld slurmd slurmdbd slurm-client slurm-wlm-basic-plugins slurm-wlm-mysql-plugin rsync)

T0=${EPOCHREALTIME/[.,]/}
log() { local ms=$(( (${EPOCHREALTIME/[.,]/} - T0) / 1000 )); printf '[start-cluster +%d.%03ds] %s\n' $((ms / 1000)) $((ms % 1000)) "$*" >&2; }
die() { printf '[start-cluster] ERROR: %s\n' "$*" >&2; exit 1; }
[[ $(id -u) -eq 0 ]] || die "must run as root"
[[ $DIR == /* ]] || die "DIR must be an absolute path (got '$DIR')"
[[ $NODES =~ ^[1-9][0-9]*$ ]] || die "CHAINRUN_SLURM_NODES must be a positive integer"
(( ${#DIR} <= 70 )) || die "DIR too long for unix socket paths (max 70 chars): $DIR"

# ---------------------------------------------------------------- install
missing=()
for p in "${PKGS[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || missing+=("$p")
done
if ((${#missing[@]})); then
  log "installing: ${missing[*]}"
  # keep the package maintainer scripts from starting system-wide daemons
  made_policy=0
  if [[ ! -e /usr/sbin/policy-rc.d ]]; then
    printf '#!/bin/sh\nexit 101\n' > /usr/sbin/policy-rc.d; chmod 755 /usr/sbin/policy-rc.d; made_policy=1
  fi
  export DEBIAN_FRONTEND=noninteractive
  apt_ok=0
  for try in 1 2 3; do
    if apt-get update -qq && apt-get install -y -qq --no-install-recommends "${missing[@]}" >/tmp/chainrun-slurm-apt.log 2>&1; then
      apt_ok=1; break
    fi
    log "apt attempt $try failed (see /tmp/chainrun-slurm-apt.log); retrying"; sleep 5
  done
  ((made_policy)) && rm -f /usr/sbin/policy-rc.d
  ((apt_ok)) || { tail -20 /tmp/chainrun-slurm-apt.log >&2; die "apt-get install failed"; }
  log "install done"
fi
for u in slurm munge mysql; do id "$u" >/dev/null 2>&1 || die "system user '$u' missing after install"; done

# ---------------------------------------------------------------- scrontab
# Debian 12's slurm-client ships no `scrontab` (its .install list leaves it out; the library and slurmctld
# have the crontab RPCs). Build the client alone from Debian's source of the installed version, linked to the
# installed libslurmfull; ~45 s, once per machine (configure is most of it); gcc and binutils installed if missing.
install_scrontab() {
  local ver lib work srcdir
  ver=$(dpkg-query -W -f='${Version}' slurm-client)
  lib=$(dirname "$(dpkg -L slurm-wlm-basic-plugins | grep '/libslurmfull\.so$' | head -1)")
  [[ -n $ver && -f $lib/libslurmfull.so ]] || die "cannot find slurm-client's version or libslurmfull.so"
  if ! command -v gcc >/dev/null || ! command -v objcopy >/dev/null; then
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends gcc libc6-dev binutils \
      >/tmp/chainrun-slurm-apt.log 2>&1 || die "building scrontab needs gcc and binutils (apt-get install failed)"
  fi
  work=$(mktemp -d /tmp/chainrun-scrontab.XXXXXX)
  log "building scrontab from Debian's source of slurm-wlm $ver (into /usr/local/bin)"
  mkdir -p "$work/lists/partial" "$work/parts"
  # the system's own Debian sources, as deb-src, in a private list folder: the system's apt state is untouched
  sed 's/^Types: deb$/Types: deb-src/' /etc/apt/sources.list.d/debian.sources > "$work/parts/debian-src.sources"
  local apt=(-o Dir::Etc::SourceList=/dev/null -o "Dir::Etc::SourceParts=$work/parts" -o "Dir::State::Lists=$work/lists")
  ( cd "$work" && apt-get "${apt[@]}" update -qq && apt-get "${apt[@]}" source --download-only "slurm-wlm=$ver" ) \
    >"$work/apt.log" 2>&1 || { tail -5 "$work/apt.log" >&2; die "could not download slurm-wlm's source"; }
  tar -xzf "$work"/slurm-wlm_*.orig.tar.gz -C "$work"
  srcdir=$(find "$work" -maxdepth 2 -type d -path '*/src' -printf '%h\n' | head -1)
  [[ -d $srcdir/src/scrontab ]] || die "no src/scrontab in slurm-wlm's source"
  ( cd "$srcdir" && ./configure --prefix=/usr --sysconfdir=/etc/slurm --without-munge >"$work/configure.log" 2>&1 ) \
    || { tail -5 "$work/configure.log" >&2; die "configure of slurm's source failed"; }
  ( cd "$srcdir/src/scrontab" && set -e
    for t in default_crontab usage; do  # text compiled in as data, as its Makefile does
      ld -r -o "$work/$t.bino" -z noexecstack --format=binary "$t.txt"
      objcopy --rename-section .data=.rodata,alloc,load,readonly,data,contents "$work/$t.bino"
    done
    gcc -O2 -DHAVE_CONFIG_H -I../.. -I../../slurm -o "$work/scrontab" env.c opt.c parse.c scrontab.c \
      "$work/default_crontab.bino" "$work/usage.bino" -Wl,-rpath="$lib" -L"$lib" -lslurmfull -ldl -lpthread
  ) >"$work/build.log" 2>&1 || { tail -10 "$work/build.log" >&2; die "building scrontab failed"; }
  install -m 755 "$work/scrontab" /usr/local/bin/scrontab
  rm -rf "$work"
  log "scrontab installed: /usr/local/bin/scrontab"
}
command -v scrontab >/dev/null || install_scrontab

# ---------------------------------------------------------------- helpers
# pid_of PIDFILE NAME...: print pid if PIDFILE names a live process whose comm is one of NAMEs
pid_of() {
  local f=$1; shift; local pid comm n
  [[ -s $f ]] || return 1
  pid=$(tr -dc '0-9' < "$f"); [[ -n $pid ]] || return 1
  comm=$(cat "/proc/$pid/comm" 2>/dev/null) || return 1
  # zombies (PID 1 in some sandboxes reaps late) count as dead
  [[ $(sed 's/.*) //' "/proc/$pid/stat" 2>/dev/null | cut -d' ' -f1) == Z ]] && return 1
  for n in "$@"; do [[ $comm == "$n" ]] && { echo "$pid"; return 0; }; done
  return 1
}
wait_for() { # wait_for DESCRIPTION LOGFILE CMD...
  local what=$1 logf=$2; shift 2; local end=$((SECONDS + TIMEOUT))
  until "$@" >/dev/null 2>&1; do
    if ((SECONDS >= end)); then
      echo "---- last lines of $logf ----" >&2; tail -n 30 "$logf" >&2 2>/dev/null || true
      die "timed out after ${TIMEOUT}s waiting for $what"
    fi
    sleep 0.5
  done
}
# stage FILE MODE OWNER < content: write FILE.new; remember it if it differs from FILE
STAGED=()
stage() {
  local f=$1; cat > "$f.new"; chmod "$2" "$f.new"; chown "$3" "$f.new"
  if [[ -f $f ]] && cmp -s "$f.new" "$f"; then rm -f "$f.new"; else STAGED+=("$f"); fi
}

# changed_keys FILE: the keys of the lines that differ between FILE and FILE.new (comments ignored)
changed_keys() {
  diff <(grep -v '^#' "$1") <(grep -v '^#' "$1.new") | sed -n 's/^[<>] *\([A-Za-z]*\)=.*/\1/p' | sort -u
}
# only_reconfigurable FILE: every changed key of slurm.conf is one `scontrol reconfigure` applies (no restart)
only_reconfigurable() {
  local k keys; keys=$(changed_keys "$1"); [[ -n $keys ]] || return 1
  for k in $keys; do [[ " $RECONFIGURABLE " == *" $k "* ]] || return 1; done
}
RECONFIGURABLE="ScronParameters"
RECONFIGURE=0

ETC=$DIR/etc; MUNGE=$DIR/munge; DB=$DIR/mysql; SL=$DIR/slurm; SD=$DIR/slurmd
export SLURM_CONF=$ETC/slurm.conf
install -d -m 755 -o root -g root "$DIR" "$ETC" "$SD"
install -d -m 755 -o munge -g munge "$MUNGE"
install -d -m 750 -o mysql -g mysql "$DB"
install -d -m 755 -o slurm -g slurm "$SL" "$SL/state"
for i in $(seq 1 "$NODES"); do install -d -m 755 -o root -g root "$SD/n$i"; done
install -d -m 755 -o root -g root "$DIR/dev"
for ((g = 0; g < GPUS; g++)); do  # fake GPU "devices": char devices 1:3 (= /dev/null)
  f=$DIR/dev/gpu$g; [[ -c $f ]] && continue
  rm -f "$f"; mknod -m 666 "$f" c 1 3 2>/dev/null || install -m 666 /dev/null "$f"
done

# ---------------------------------------------------------------- configs
if [[ ! -s $MUNGE/munge.key ]]; then
  dd if=/dev/urandom of="$MUNGE/munge.key" bs=1024 count=1 status=none
fi
chown munge:munge "$MUNGE/munge.key"; chmod 400 "$MUNGE/munge.key"
if [[ ! -s $DB/slurm-db-password ]]; then
  (umask 077; head -c 18 /dev/urandom | base64 | tr -dc 'A-Za-z0-9' > "$DB/slurm-db-password")
fi
chown root:root "$DB/slurm-db-password"; chmod 600 "$DB/slurm-db-password"
DBPASS=$(cat "$DB/slurm-db-password")

stage "$ETC/my.cnf" 644 root:root <<EOF
# managed by chainrun start-cluster.sh
[mysqld]
user=mysql
datadir=$DB/data
socket=$DB/mysqld.sock
pid-file=$DB/mariadbd.pid
log-error=$DB/mariadbd.log
port=$DB_PORT
bind-address=127.0.0.1
skip-name-resolve
innodb_buffer_pool_size=512M
innodb_log_file_size=64M
innodb_lock_wait_timeout=900
[client]
socket=$DB/mysqld.sock
port=$DB_PORT
EOF

AUTHINFO="socket=$MUNGE/munge.socket.2"
GRESLINE=""; ((GPUS > 0)) && GRESLINE="Gres=gpu:$GPUS"
stage "$ETC/slurm.conf" 644 root:root < <(
  cat <<EOF
# managed by chainrun start-cluster.sh -- test cluster, do not use in production
ClusterName=$CLUSTER
SlurmctldHost=localhost(127.0.0.1)
SlurmctldPort=$CTLD_PORT
SlurmUser=slurm
SlurmdUser=root
AuthType=auth/munge
AuthInfo=$AUTHINFO
CredType=cred/munge
StateSaveLocation=$SL/state
SlurmctldPidFile=$SL/slurmctld.pid
SlurmctldLogFile=$SL/slurmctld.log
SlurmctldDebug=info
SlurmdSpoolDir=$SD/%n
SlurmdPidFile=$SD/%n.pid
SlurmdLogFile=$SD/%n.log
SlurmdDebug=info
SlurmdParameters=config_overrides
ReturnToService=2
SlurmdTimeout=60
MailProg=/bin/true
MpiDefault=none
LaunchType=launch/slurm
ProctrackType=$PROCTRACK
TaskPlugin=$TASKPLUGIN
JobAcctGatherType=jobacct_gather/linux
JobAcctGatherFrequency=30
SwitchType=switch/none
# two nodes per leaf switch (topology.conf): sbatch --switches and chainrun's spread rule have a topology to read
TopologyPlugin=topology/tree
SchedulerType=sched/backfill
SchedulerParameters=bf_interval=5,sched_interval=5
SelectType=select/cons_tres
SelectTypeParameters=CR_Core_Memory
DefMemPerCPU=100
PriorityType=priority/multifactor
PriorityDecayHalfLife=1-0
PriorityWeightAge=1000
PriorityWeightFairshare=1000
PriorityWeightJobSize=100
PriorityWeightPartition=1000
PriorityWeightQOS=0
PriorityMaxAge=1-0
AccountingStorageType=accounting_storage/slurmdbd
AccountingStorageHost=localhost
AccountingStoragePort=$DBD_PORT
# for slurmdbd connections the munge socket comes from AccountingStoragePass, not AuthInfo
AccountingStoragePass=$MUNGE/munge.socket.2
AccountingStorageTRES=gres/gpu
JobCompType=jobcomp/none
# scrontab (Slurm's per-user cron, run as batch jobs): chainrun's scheduled ticks use it where a site enables it
ScronParameters=enable
KillWait=10
MinJobAge=300
EOF
  ((GPUS > 0)) && echo "GresTypes=gpu"
  for i in $(seq 1 "$NODES"); do
    echo "NodeName=n$i NodeHostname=localhost NodeAddr=127.0.0.1 Port=$((PORT_BASE + 3 + i)) CPUs=$CPUS RealMemory=$MEM $GRESLINE State=UNKNOWN"
  done
  echo "PartitionName=short Nodes=ALL Default=YES MaxTime=$MAXTIME DefaultTime=$MAXTIME State=UP"
  echo "PartitionName=long Nodes=ALL Default=NO MaxTime=60 DefaultTime=10 State=UP"
)
stage "$ETC/gres.conf" 644 root:root < <(
  echo "# managed by chainrun start-cluster.sh"
  echo "AutoDetect=off"
  # gres/gpu needs File= (file-less GPUs are dropped); DIR/dev/gpuN (char dev 1:3) stand in for devices
  ((GPUS > 0)) && echo "NodeName=n[1-$NODES] Name=gpu File=$DIR/dev/gpu[0-$((GPUS - 1))]"
)
stage "$ETC/topology.conf" 644 root:root < <(
  echo "# managed by chainrun start-cluster.sh: leaf switches of two nodes under one top switch"
  leaves=()
  for ((i = 1; i <= NODES; i += 2)); do
    j=$((i + 1 <= NODES ? i + 1 : i)); k=$(((i + 1) / 2))
    if ((j > i)); then echo "SwitchName=s$k Nodes=n[$i-$j]"; else echo "SwitchName=s$k Nodes=n$i"; fi
    leaves+=("s$k")
  done
  echo "SwitchName=s0 Switches=$(IFS=,; echo "${leaves[*]}")"
)
stage "$ETC/cgroup.conf" 644 root:root <<EOF
# managed by chainrun start-cluster.sh (only used with proctrack/cgroup or task/cgroup)
CgroupPlugin=autodetect
ConstrainCores=no
ConstrainRAMSpace=no
ConstrainDevices=no
EOF
stage "$ETC/slurmdbd.conf" 600 slurm:slurm <<EOF
# managed by chainrun start-cluster.sh
AuthType=auth/munge
AuthInfo=$AUTHINFO
DbdHost=localhost
DbdAddr=127.0.0.1
DbdPort=$DBD_PORT
SlurmUser=slurm
DebugLevel=info
LogFile=$SL/slurmdbd.log
PidFile=$SL/slurmdbd.pid
StorageType=accounting_storage/mysql
StorageHost=127.0.0.1
StoragePort=$DB_PORT
StorageUser=slurm
StoragePass=$DBPASS
StorageLoc=slurm_acct_db
EOF
if ((${#STAGED[@]})); then
  running=()
  pid_of "$MUNGE/munged.pid" munged >/dev/null && running+=(munged)
  pid_of "$DB/mariadbd.pid" mariadbd mysqld >/dev/null && running+=(mariadbd)
  pid_of "$SL/slurmdbd.pid" slurmdbd >/dev/null && running+=(slurmdbd)
  pid_of "$SL/slurmctld.pid" slurmctld slurmctld-wlm >/dev/null && running+=(slurmctld)
  for f in "$SD"/*.pid; do pid_of "$f" slurmd slurmd-wlm >/dev/null && running+=("slurmd:$(basename "$f" .pid)"); done
  if ((${#running[@]})) && [[ ${STAGED[*]} == "$ETC/slurm.conf" ]] && only_reconfigurable "$ETC/slurm.conf"; then
    # a cluster started by an older start-cluster.sh: what changed, `scontrol reconfigure` applies in place
    log "slurm.conf changed ($(changed_keys "$ETC/slurm.conf" | paste -sd, -)): applying with scontrol reconfigure"
    RECONFIGURE=1; running=()
  elif ((${#running[@]})) && [[ $RESTART == 1 ]]; then
    log "configuration changes (${STAGED[*]##*/}) while ${running[*]} run: restarting (CHAINRUN_SLURM_RESTART=1)"
    bash "$(dirname "${BASH_SOURCE[0]}")/stop-cluster.sh" "$DIR" || die "stop-cluster.sh $DIR failed"
    running=()
  fi
  if ((${#running[@]})); then
    for f in "${STAGED[@]}"; do rm -f "$f.new"; done
    die "configuration would change (${STAGED[*]##*/}) while ${running[*]} run from $DIR; run stop-cluster.sh $DIR first, or set CHAINRUN_SLURM_RESTART=1 to restart (nothing was modified)"
  fi
  for f in "${STAGED[@]}"; do mv -f "$f.new" "$f"; done
fi

# make plain `sbatch`/`squeue` (e.g. over ssh, without SLURM_CONF) find this cluster
if [[ $ETC_LINK == 1 ]]; then
  mkdir -p /etc/slurm
  if [[ -L /etc/slurm/slurm.conf || ! -e /etc/slurm/slurm.conf ]]; then
    ln -sfn "$ETC/slurm.conf" /etc/slurm/slurm.conf
  elif grep -q 'managed by chainrun' /etc/slurm/slurm.conf; then
    ln -sfn "$ETC/slurm.conf" /etc/slurm/slurm.conf
  else
    log "WARNING: /etc/slurm/slurm.conf is a foreign file; clients need SLURM_CONF=$ETC/slurm.conf"
  fi
fi

# ---------------------------------------------------------------- munge
if pid=$(pid_of "$MUNGE/munged.pid" munged); then
  log "munged already running (pid $pid)"
else
  log "starting munged"
  runuser -u munge -- /usr/sbin/munged --socket="$MUNGE/munge.socket.2" \
    --key-file="$MUNGE/munge.key" --pid-file="$MUNGE/munged.pid" \
    --log-file="$MUNGE/munged.log" --seed-file="$MUNGE/munged.seed" </dev/null \
    || { tail -5 "$MUNGE/munged.log" >&2 2>/dev/null; die "munged failed to start"; }
  wait_for "munged" "$MUNGE/munged.log" bash -c "munge -n -S '$MUNGE/munge.socket.2' | unmunge -S '$MUNGE/munge.socket.2'"
fi

# ---------------------------------------------------------------- mariadb
MYSQL=(mariadb --defaults-file="$ETC/my.cnf" -u root)
if pid=$(pid_of "$DB/mariadbd.pid" mariadbd mysqld); then
  log "mariadbd already running (pid $pid)"
else
  if [[ ! -d $DB/data/mysql ]]; then
    log "initialising MariaDB datadir"
    rm -rf "$DB/data"
    mariadb-install-db --defaults-file="$ETC/my.cnf" --skip-test-db \
      --auth-root-authentication-method=socket >"$DB/install-db.log" 2>&1 \
      || { tail -20 "$DB/install-db.log" >&2; die "mariadb-install-db failed"; }
  fi
  log "starting mariadbd"
  setsid /usr/sbin/mariadbd --defaults-file="$ETC/my.cnf" </dev/null >>"$DB/mariadbd.stdout" 2>&1 &
  wait_for "mariadbd" "$DB/mariadbd.log" mariadb-admin --defaults-file="$ETC/my.cnf" -u root ping
fi
"${MYSQL[@]}" <<EOF || die "could not create the slurm database user"
CREATE DATABASE IF NOT EXISTS slurm_acct_db;
CREATE USER IF NOT EXISTS 'slurm'@'127.0.0.1' IDENTIFIED BY '$DBPASS';
CREATE USER IF NOT EXISTS 'slurm'@'localhost' IDENTIFIED BY '$DBPASS';
ALTER USER 'slurm'@'127.0.0.1' IDENTIFIED BY '$DBPASS';
ALTER USER 'slurm'@'localhost' IDENTIFIED BY '$DBPASS';
GRANT ALL ON slurm_acct_db.* TO 'slurm'@'127.0.0.1';
GRANT ALL ON slurm_acct_db.* TO 'slurm'@'localhost';
FLUSH PRIVILEGES;
EOF

# ---------------------------------------------------------------- slurmdbd
if pid=$(pid_of "$SL/slurmdbd.pid" slurmdbd); then
  log "slurmdbd already running (pid $pid)"
else
  log "starting slurmdbd"
  /usr/sbin/slurmdbd </dev/null >>"$SL/slurmdbd.stdout" 2>&1 || die "slurmdbd failed to start (see $SL/slurmdbd.log)"
fi
wait_for "slurmdbd" "$SL/slurmdbd.log" sacctmgr -n -P show cluster
if [[ -z $(sacctmgr -n -P show cluster where name="$CLUSTER" format=cluster 2>/dev/null) ]]; then
  sacctmgr -i add cluster "$CLUSTER" >/dev/null || die "sacctmgr add cluster failed"
fi
if [[ -z $(sacctmgr -n -P show account where name=testacct format=account 2>/dev/null) ]]; then
  sacctmgr -i add account testacct cluster="$CLUSTER" description=test organization=test >/dev/null || die "sacctmgr add account failed"
fi
for u in root $EXTRA_USERS; do
  if [[ -z $(sacctmgr -n -P show user where name="$u" format=user 2>/dev/null) ]]; then
    sacctmgr -i add user "$u" account=testacct cluster="$CLUSTER" >/dev/null || die "sacctmgr add user $u failed"
  fi
done

# ---------------------------------------------------------------- slurmctld
if pid=$(pid_of "$SL/slurmctld.pid" slurmctld slurmctld-wlm); then
  log "slurmctld already running (pid $pid)"
else
  log "starting slurmctld"
  /usr/sbin/slurmctld -f "$ETC/slurm.conf" </dev/null >>"$SL/slurmctld.stdout" 2>&1 || die "slurmctld failed to start (see $SL/slurmctld.log)"
fi
wait_for "slurmctld" "$SL/slurmctld.log" bash -c "scontrol ping | grep -q 'is UP'"
if ((RECONFIGURE)); then scontrol reconfigure || die "scontrol reconfigure failed (see $SL/slurmctld.log)"; fi

# ---------------------------------------------------------------- slurmd x N
for i in $(seq 1 "$NODES"); do
  n=n$i
  if pid=$(pid_of "$SD/$n.pid" slurmd slurmd-wlm); then
    log "slurmd $n already running (pid $pid)"
  else
    log "starting slurmd $n"
    /usr/sbin/slurmd -N "$n" -f "$ETC/slurm.conf" </dev/null >>"$SD/$n.stdout" 2>&1 || die "slurmd $n failed to start (see $SD/$n.log)"
  fi
done

# ---------------------------------------------------------------- wait for nodes
nodes_ok() { # every node responding and usable (idle, or busy with jobs)
  local out; out=$(sinfo -h -N -p short -o '%N %t' 2>/dev/null) || return 1
  [[ $(wc -l <<<"$out") -eq $NODES ]] || return 1
  ! grep -vqE ' (idle|mix|alloc|comp)$' <<<"$out"
}
resumed=0; start_wait=$SECONDS; end=$((SECONDS + TIMEOUT))
until nodes_ok; do
  if ((!resumed && SECONDS - start_wait >= 3)); then
    # nodes left DOWN/DRAIN by an earlier run: bring them back once
    bad=$(sinfo -h -N -o '%N %t' 2>/dev/null | awk '$2 ~ /down|drain|drng|fail|inval/ && $2 !~ /\*/ {print $1}' | sort -u | paste -sd, -) || bad=""
    [[ -n $bad ]] && scontrol update nodename="$bad" state=resume 2>/dev/null || true
    resumed=1
  fi
  if ((SECONDS >= end)); then
    sinfo -N -l >&2 || true; tail -n 20 "$SL/slurmctld.log" "$SD"/n1.log >&2 || true
    die "nodes did not become idle within ${TIMEOUT}s"
  fi
  sleep 0.5
done
log "cluster '$CLUSTER' up: $(sinfo -h -o '%P %a %l %D %t' | paste -sd';' -)"
echo "export SLURM_CONF=$ETC/slurm.conf"

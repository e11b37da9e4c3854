#!/usr/bin/env bash
# A one-node Slurm cluster on this machine, to test hybridlm under `srun` and `sbatch` without a real
# cluster (docs/distributed.md "Testing the Slurm path"). Needs root (Debian packages, daemons as root).
#
#   scripts/slurm_local.sh start    # installs slurmctld slurmd slurm-client munge if missing, starts them
#   eval "$(scripts/slurm_local.sh env)"   # SLURM_CONF for srun / sbatch / sinfo in this shell
#   scripts/slurm_local.sh stop     # stops the daemons this script started
#   scripts/slurm_local.sh run CMD...   # start if needed, run CMD with SLURM_CONF set, stop what it started
#
# The configuration lives in $HLM_SLURM_DIR (default /tmp/hlm-slurm), not in /etc/slurm: the node is this
# host with all its CPUs, one partition `debug`, MPI through PMIx (as OpenMPI 4 from Debian needs), no
# cgroups and no accounting, so it runs in a container as well.
set -euo pipefail

DIR=${HLM_SLURM_DIR:-/tmp/hlm-slurm}
CONF=$DIR/slurm.conf
PACKAGES=(slurmctld slurmd slurm-client munge)

say() { echo "slurm_local: $*" >&2; }

install_packages() {
  local missing=()
  for p in "${PACKAGES[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
  done
  ((${#missing[@]})) || return 0
  say "installing ${missing[*]}"
  apt-get update -qq || true
  # Debian's postinst scripts try to start the services; without systemd that fails harmlessly.
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
}

start_munge() {
  munge -n 2>/dev/null | unmunge >/dev/null 2>&1 && return 0
  mkdir -p /etc/munge /var/log/munge /run/munge /var/lib/munge
  [ -s /etc/munge/munge.key ] || mungekey --create --keyfile=/etc/munge/munge.key
  chown -R munge:munge /etc/munge /var/log/munge /run/munge /var/lib/munge
  chmod 400 /etc/munge/munge.key
  munged --force
  echo munged >>"$DIR/started"
}

write_conf() {
  local host cpus mem
  host=$(hostname -s)
  cpus=$(nproc --all)
  mem=$(awk '/MemTotal/ {print int($2 / 1024) - 1024}' /proc/meminfo)
  mkdir -p "$DIR/state" "$DIR/spool"
  cat >"$CONF" <<EOF
# Written by scripts/slurm_local.sh: a one-node test cluster.
ClusterName=hlmlocal
SlurmctldHost=$host
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
MpiDefault=pmix
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
ReturnToService=2
StateSaveLocation=$DIR/state
SlurmdSpoolDir=$DIR/spool
SlurmctldPidFile=$DIR/slurmctld.pid
SlurmdPidFile=$DIR/slurmd.pid
SlurmctldLogFile=$DIR/slurmctld.log
SlurmdLogFile=$DIR/slurmd.log
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
NodeName=$host CPUs=$cpus RealMemory=$mem State=UNKNOWN
PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP OverSubscribe=FORCE:4
EOF
}

running() { SLURM_CONF=$CONF sinfo >/dev/null 2>&1; }

case "${1:-}" in
  run)
    shift
    started_here=0
    if ! running; then "$0" start; started_here=1; fi
    status=0
    SLURM_CONF=$CONF "$@" || status=$?
    if ((started_here)); then "$0" stop; fi
    exit $status ;;
  start)
    [ "$(id -u)" -eq 0 ] || { say "needs root (Debian packages and daemons)"; exit 1; }
    if running; then say "already running ($CONF)"; exit 0; fi
    install_packages
    mkdir -p "$DIR"
    : >"$DIR/started"
    start_munge
    write_conf
    slurmctld -f "$CONF" && echo slurmctld >>"$DIR/started"
    slurmd -f "$CONF" && echo slurmd >>"$DIR/started"
    for _ in $(seq 100); do
      state=$(SLURM_CONF=$CONF sinfo -h -o %t 2>/dev/null || true)
      [ "$state" = idle ] && { say "running: one node, $(nproc --all) CPUs ($CONF)"; exit 0; }
      sleep 0.2
    done
    say "the node did not come up; logs in $DIR"; exit 1 ;;
  env)
    echo "export SLURM_CONF=$CONF" ;;
  stop)
    [ -f "$DIR/started" ] || exit 0
    if grep -q slurmctld "$DIR/started"; then SLURM_CONF=$CONF scontrol shutdown >/dev/null 2>&1 || true; fi
    for d in slurmd slurmctld; do
      [ -f "$DIR/$d.pid" ] && kill "$(cat "$DIR/$d.pid")" 2>/dev/null || true
    done
    if grep -q munged "$DIR/started"; then pkill -x munged || true; fi
    rm -f "$DIR/started"
    say "stopped" ;;
  *)
    echo "usage: $0 start|env|stop|run CMD..." >&2; exit 2 ;;
esac

#!/usr/bin/env bash
# A single-node SLURM cluster on this machine, from Debian's packages (munge, slurmctld, slurmd),
# to run the batch scripts of docs/distributed.md (docs/examples/slurm_*.sh) for real.
#
#   scripts/slurm-local.sh start    # install when absent, configure, start; prints "started" or
#                                   # "running" (it was up already) once the node takes jobs
#   scripts/slurm-local.sh stop     # stop the daemons this script started
#   scripts/slurm-local.sh status   # "running" or "stopped"
#
# Needs root (or sudo) for apt-get and the daemons. Exit status 3 with one line on stderr: the
# packages cannot be installed here. The node gets every core and 90% of the memory of the
# machine, one partition "local"; jobs run as their submitter, processes tracked by parentage
# (no cgroups, so it runs in containers). A slurm.conf this script did not write is never
# touched: it refuses to start instead.
set -euo pipefail

PACKAGES="munge slurmctld slurmd slurm-client"
CONF_DIR=/etc/slurm
CONF=$CONF_DIR/slurm.conf
MARK="# written by myriad scripts/slurm-local.sh"
STATE=/var/spool/slurmctld
SPOOL=/var/spool/slurmd
LOGS=/var/log/slurm
RUN=/run/myriad-slurm
SUDO=""
[ "$(id -u)" -eq 0 ] || SUDO="sudo"

die() { echo "slurm-local: $1" >&2; exit "${2:-1}"; }

installed() {
  for package in $PACKAGES; do
    dpkg-query -W -f='${Status}' "$package" 2>/dev/null | grep -q "install ok installed" || return 1
  done
}

install() {
  installed && return 0
  command -v apt-get >/dev/null || die "no apt-get: install munge, slurmctld and slurmd by hand" 3
  if [ -n "$SUDO" ] && ! sudo -n true 2>/dev/null; then
    die "installing SLURM needs root: run as root or with passwordless sudo" 3
  fi
  # Debian's maintainer scripts would start the daemons (without a config); policy-rc.d keeps
  # them down until this script has configured them.
  local policy=/usr/sbin/policy-rc.d made_policy=0
  if [ ! -e "$policy" ]; then
    printf '#!/bin/sh\nexit 101\n' | $SUDO tee "$policy" >/dev/null
    $SUDO chmod +x "$policy"
    made_policy=1
  fi
  local ok=1
  { $SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive \
      $SUDO apt-get install -y -qq --no-install-recommends $PACKAGES; } >"$RUN/apt.log" 2>&1 || ok=0
  [ "$made_policy" -eq 0 ] || $SUDO rm -f "$policy"
  [ "$ok" -eq 1 ] || die "apt-get could not install $PACKAGES (log: $RUN/apt.log)" 3
}

write_config() {
  if [ -e "$CONF" ] && ! grep -qF "$MARK" "$CONF"; then
    die "$CONF exists and was not written by this script: start that cluster's daemons instead" 2
  fi
  local host cpus memory
  host=$(hostname -s)
  cpus=$(nproc)
  memory=$(awk '/MemTotal/ {print int($2 / 1024 * 0.9)}' /proc/meminfo)
  $SUDO mkdir -p "$CONF_DIR" "$STATE" "$SPOOL" "$LOGS" "$RUN"
  $SUDO tee "$CONF" >/dev/null <<EOF
$MARK
ClusterName=myriad-local
SlurmctldHost=$host
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
MpiDefault=none
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
SchedulerType=sched/backfill
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
GresTypes=gpu
ReturnToService=2
StateSaveLocation=$STATE
SlurmdSpoolDir=$SPOOL
SlurmctldPidFile=$RUN/slurmctld.pid
SlurmdPidFile=$RUN/slurmd.pid
SlurmctldLogFile=$LOGS/slurmctld.log
SlurmdLogFile=$LOGS/slurmd.log
NodeName=$host CPUs=$cpus RealMemory=$memory State=UNKNOWN
PartitionName=local Nodes=$host Default=YES MaxTime=INFINITE State=UP
EOF
}

alive() { [ -s "$1" ] && kill -0 "$(cat "$1")" 2>/dev/null; }

running() {
  alive "$RUN/slurmctld.pid" && alive "$RUN/slurmd.pid" && scontrol ping >/dev/null 2>&1
}

start_munge() {
  if munge -n </dev/null >/dev/null 2>&1; then
    return 0
  fi
  if [ ! -s /etc/munge/munge.key ]; then
    $SUDO mkdir -p /etc/munge
    $SUDO dd if=/dev/urandom of=/etc/munge/munge.key bs=1024 count=1 status=none
  fi
  $SUDO mkdir -p /run/munge /var/log/munge /var/lib/munge
  $SUDO touch "$RUN/munged.started"
  if id munge >/dev/null 2>&1; then
    $SUDO chown munge:munge /etc/munge/munge.key /run/munge /var/log/munge /var/lib/munge
    $SUDO chmod 0400 /etc/munge/munge.key
    $SUDO chmod 0755 /run/munge
    $SUDO runuser -u munge -- /usr/sbin/munged 9>&-
  else
    $SUDO /usr/sbin/munged --force 9>&-
  fi
  munge -n </dev/null >/dev/null 2>&1 || die "munged did not start (see /var/log/munge/munged.log)"
}

wait_for_node() {
  # The node registers with slurmctld a moment after both daemons are up.
  local i state
  for i in $(seq 1 120); do
    state=$(sinfo -h -N -o %T 2>/dev/null | head -n 1 || true)
    case "$state" in
      idle|mixed|allocated) return 0 ;;
      down*|drain*) $SUDO scontrol update nodename="$(hostname -s)" state=resume 2>/dev/null || true ;;
    esac
    sleep 0.5
  done
  die "the node did not become ready (state '${state:-none}'; see $LOGS/slurmctld.log and $LOGS/slurmd.log)"
}

start() {
  install
  if running; then
    wait_for_node
    echo running
    return 0
  fi
  write_config
  start_munge
  # 9>&-: the daemons must not inherit the lock (see the end of this file).
  alive "$RUN/slurmctld.pid" || $SUDO /usr/sbin/slurmctld -i 9>&-
  alive "$RUN/slurmd.pid" || $SUDO /usr/sbin/slurmd 9>&-
  wait_for_node
  echo started
}

stop_daemon() {
  local pid
  alive "$1" || return 0
  pid=$(cat "$1")
  $SUDO kill "$pid"
  for _ in $(seq 1 100); do kill -0 "$pid" 2>/dev/null || return 0; sleep 0.1; done
}

stop() {
  stop_daemon "$RUN/slurmd.pid"
  stop_daemon "$RUN/slurmctld.pid"
  # munged only when this script started it: other software on the machine may use it.
  if [ -e "$RUN/munged.started" ]; then
    stop_daemon /run/munge/munged.pid
    $SUDO rm -f "$RUN/munged.started"
  fi
  echo stopped
}

# One start or stop at a time (tests may call this from several processes).
exec 9>"${TMPDIR:-/tmp}/myriad-slurm-local.lock"
flock 9
$SUDO mkdir -p "$RUN"

case "${1:-}" in
  start) start ;;
  stop) stop ;;
  status) if running; then echo running; else echo stopped; fi ;;
  *) die "usage: scripts/slurm-local.sh start|stop|status" 2 ;;
esac

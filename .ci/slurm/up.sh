#!/usr/bin/env bash
# Start a real N-node Slurm with fake GPUs and accounting on this one machine (root, no
# systemd needed): munged, MariaDB, slurmdbd, slurmctld and one slurmd per fake node.
# Idempotent; stop it with down.sh. Recipe and pitfalls: shared/reference/slurm-ray.md §1.
#
#   NODES=2 GPUS_PER_NODE=4 CPUS_PER_NODE=4 .ci/slurm/up.sh
#
# Node i (1-based) is n<i>, listens on port 17000+i and owns /opt/fakegpu/nvidia<k>, symlinks
# to /dev/null (slurmd drops GPUs without File=, and only character devices stat cleanly).
set -euo pipefail
NODES=${NODES:-2}
GPUS_PER_NODE=${GPUS_PER_NODE:-4}
CPUS_PER_NODE=${CPUS_PER_NODE:-4}
FAKEGPU=${FAKEGPU:-/opt/fakegpu}
MARK="# written by vime .ci/slurm/up.sh"
CONF=/etc/slurm/slurm.conf

[ "$(id -u)" = 0 ] || { echo "slurm: up.sh needs root" >&2; exit 1; }
if [ -f "$CONF" ] && ! grep -qF "$MARK" "$CONF"; then
  echo "slurm: $CONF exists and was not written by vime; refusing to replace it" >&2
  exit 1
fi
mem_mb=$(( $(awk '/MemTotal/ {print $2}' /proc/meminfo) / 1024 / 2 ))

mkdir -p /etc/slurm /var/lib/slurm/slurmctld /var/log/slurm "$FAKEGPU"
nodelines="" ; gres=""
for i in $(seq 1 "$NODES"); do
  first=$(( (i - 1) * GPUS_PER_NODE )); last=$(( i * GPUS_PER_NODE - 1 ))
  for g in $(seq "$first" "$last"); do ln -sfn /dev/null "$FAKEGPU/nvidia$g"; done
  mkdir -p "/var/lib/slurm/slurmd/n$i"
  nodelines+="NodeName=n$i NodeHostname=localhost NodeAddr=127.0.0.1 Port=$((17000 + i)) CPUs=$CPUS_PER_NODE RealMemory=$mem_mb Gres=gpu:$GPUS_PER_NODE State=UNKNOWN"$'\n'
  gres+="NodeName=n$i Name=gpu File=$FAKEGPU/nvidia[$first-$last]"$'\n'
done

cat > "$CONF" <<CONF
$MARK
ClusterName=ci
SlurmctldHost=localhost
AuthType=auth/munge
CredType=cred/munge
SlurmUser=root
SlurmdUser=root
SlurmctldPort=6817
StateSaveLocation=/var/lib/slurm/slurmctld
SlurmdSpoolDir=/var/lib/slurm/slurmd/%n
SlurmctldPidFile=/run/slurmctld.pid
SlurmdPidFile=/run/slurmd-%n.pid
SlurmctldLogFile=/var/log/slurm/slurmctld.log
SlurmdLogFile=/var/log/slurm/slurmd-%n.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/slurmdbd
AccountingStorageHost=localhost
AccountingStoragePort=6819
SchedulerType=sched/backfill
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
GresTypes=gpu
SlurmdParameters=config_overrides
ReturnToService=2
MpiDefault=none
SlurmctldTimeout=30
SlurmdTimeout=30
InactiveLimit=0
MinJobAge=300
KillWait=5
Waittime=0
${nodelines}PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP OverSubscribe=NO
CONF
printf '%s\n%s' "$MARK" "$gres" > /etc/slurm/gres.conf

alive() { [ -f "$1" ] && kill -0 "$(cat "$1")" 2>/dev/null; }
wait_for() {  # wait_for SECONDS WHAT COMMAND...
  local until=$(( SECONDS + $1 )) what=$2; shift 2
  until "$@" >/dev/null 2>&1; do
    if [ $SECONDS -ge $until ]; then
      echo "slurm: $what did not come up; logs:" >&2
      tail -n 20 /var/log/slurm/*.log >&2 || true
      exit 1
    fi
    sleep 0.5
  done
}

# munge (§1.2)
[ -s /etc/munge/munge.key ] || runuser -u munge -- mungekey -c
mkdir -p /run/munge && chown munge:munge /run/munge && chmod 755 /run/munge
alive /run/munge/munged.pid || runuser -u munge -- /usr/sbin/munged
wait_for 15 munged sh -c 'munge -n | unmunge'

# MariaDB + slurmdbd, so that sacct works (§1.6)
mkdir -p /run/mysqld && chown mysql:mysql /run/mysqld
if ! mysqladmin ping >/dev/null 2>&1; then
  (setsid mysqld_safe --user=mysql >/var/log/slurm/mysqld_safe.log 2>&1 &)
  wait_for 60 MariaDB mysqladmin ping
fi
mysql -e "CREATE DATABASE IF NOT EXISTS slurm_acct_db;
          CREATE USER IF NOT EXISTS 'slurm'@'localhost' IDENTIFIED BY 'slurmpw';
          GRANT ALL ON slurm_acct_db.* TO 'slurm'@'localhost'; FLUSH PRIVILEGES;"
cat > /etc/slurm/slurmdbd.conf <<CONF
$MARK
AuthType=auth/munge
DbdHost=localhost
DbdPort=6819
SlurmUser=root
LogFile=/var/log/slurm/slurmdbd.log
PidFile=/run/slurmdbd.pid
StorageType=accounting_storage/mysql
StorageHost=localhost
StorageUser=slurm
StoragePass=slurmpw
StorageLoc=slurm_acct_db
CONF
chmod 600 /etc/slurm/slurmdbd.conf
alive /run/slurmdbd.pid || /usr/sbin/slurmdbd
wait_for 30 slurmdbd sacctmgr -n list cluster
sacctmgr -i add cluster ci >/dev/null 2>&1 || true

# slurmctld and one slurmd per fake node (§1.7)
alive /run/slurmctld.pid || /usr/sbin/slurmctld -c
for i in $(seq 1 "$NODES"); do
  alive "/run/slurmd-n$i.pid" || /usr/sbin/slurmd -N "n$i"
done
wait_for 60 "$NODES idle nodes" sh -c "[ \$(sinfo -h -N -t idle -o '%N' | sort -u | wc -l) -ge $NODES ]"
sinfo -N -o '%N %T %c %m %G'

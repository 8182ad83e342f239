#!/bin/sh
# A Slurm cluster on the namespace hosts of tests/cluster/cluster.sh, from
# Debian's packages (slurmctld, slurmd, slurm-client, munge):
#
#   slurm.sh up N DIR        N hosts, 2 CPUs each; DIR gets the configs, logs,
#                            spools and DIR/env (SLURM_CONF for the clients)
#   slurm.sh down DIR        stops what `up` started, and the hosts
#   slurm.sh exec I DIR CMD...  runs CMD on host I, its hostname and Slurm's
#                            client configuration set
#
# One munged (its own key and socket under DIR) serves every host; slurmctld
# runs on host 1 (cxhost1), and host I runs a slurmd named cxhostI at
# 10.251.0.I, each with its own spool and log (%n). Nothing is installed
# system-wide and no system daemon is touched: every process is started in
# the cluster's namespaces, which `down` ends. Needs root.
set -eu

die() { echo "slurm: $*" >&2; exit 1; }
HERE=$(cd "$(dirname "$0")" && pwd)
CL="sh $HERE/../cluster/cluster.sh"
NET=10.251.0

need() { command -v "$1" > /dev/null 2>&1 || [ -x "/usr/sbin/$1" ] || die "$1 not found: scripts/install-deps.sh installs $2"; }

write_conf() {
    D=$1 N=$2
    cat > "$D/slurm.conf" <<EOF
ClusterName=cxla
SlurmctldHost=cxhost1($NET.1)
AuthType=auth/munge
AuthInfo=socket=$D/munge.sock
CredType=cred/munge
SlurmUser=root
SlurmdUser=root
StateSaveLocation=$D/ctld
SlurmdSpoolDir=$D/spool/%n
TmpFS=$D/tmp/%n
SlurmctldPidFile=$D/slurmctld.pid
SlurmdPidFile=$D/slurmd-%n.pid
SlurmctldLogFile=$D/slurmctld.log
SlurmdLogFile=$D/slurmd-%n.log
SlurmctldDebug=info
SlurmdDebug=info
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
SchedulerType=sched/backfill
MpiDefault=none
ReturnToService=2
KillWait=${SLURM_TEST_KILLWAIT:-30}
SlurmdTimeout=30
MessageTimeout=10
InactiveLimit=0
MinJobAge=300
MailProg=/bin/true
PartitionName=test Nodes=ALL Default=YES MaxTime=INFINITE State=UP
EOF
    i=1
    while [ "$i" -le "$N" ]; do
        echo "NodeName=cxhost$i NodeAddr=$NET.$i CPUs=2 State=UNKNOWN" >> "$D/slurm.conf"
        mkdir -p "$D/spool/cxhost$i" "$D/tmp/cxhost$i"
        i=$((i + 1))
    done
}

# the daemons of host I run under its hostname, in its network namespace;
# nsenter, not `ip netns exec`, which mounts a /sys of its own without
# /sys/fs/cgroup, and slurmd 22.05 does not start without it
on_host() {
    I=$1 D=$2
    shift 2
    T=$(cat "$D/cl/tag")
    nsenter --net="/run/netns/cxc$T-h$I" unshare --uts sh -c 'hostname "$1"; shift; exec "$@"' sh "cxhost$I" "$@"
}

up() {
    N=$1 D=$2
    need munged munge
    need slurmctld slurmctld
    need slurmd slurmd
    need srun slurm-client
    [ -d /sys/fs/cgroup ] && [ -n "$(ls /sys/fs/cgroup 2> /dev/null)" ] ||
        die "/sys/fs/cgroup is not mounted: slurmd 22.05 needs it even without cgroup plugins"
    ls /usr/lib/*/libpmix.so > /dev/null 2>&1 ||
        die "libpmix.so not found: Slurm's pmix plugin loads it (scripts/install-deps.sh installs libpmix-dev)"
    mkdir -p "$D"
    D=$(cd "$D" && pwd)
    $CL up "$N" "$D/cl" || die "the namespace hosts did not come up"
    echo "$N" > "$D/hosts.n"
    mkdir -p "$D/ctld" "$D/munge"
    # munged refuses a key that others may read
    dd if=/dev/urandom of="$D/munge.key" bs=1024 count=1 2> /dev/null
    chmod 0400 "$D/munge.key"
    write_conf "$D" "$N"
    echo "SLURM_CONF=$D/slurm.conf" > "$D/env"
    on_host 1 "$D" /usr/sbin/munged -F --force --key-file="$D/munge.key" --socket="$D/munge.sock" \
        --pid-file="$D/munged.pid" --log-file="$D/munged.log" --seed-file="$D/munge.seed" > "$D/munged.out" 2>&1 &
    k=0
    until [ -S "$D/munge.sock" ]; do
        k=$((k + 1)); [ $k -lt 100 ] || die "munged did not start: $(cat "$D/munged.out" "$D/munged.log" 2> /dev/null | tail -3)"
        sleep 0.1
    done
    on_host 1 "$D" /usr/sbin/slurmctld -D -f "$D/slurm.conf" > "$D/slurmctld.out" 2>&1 &
    i=1
    while [ "$i" -le "$N" ]; do
        on_host "$i" "$D" /usr/sbin/slurmd -D -f "$D/slurm.conf" -N "cxhost$i" > "$D/slurmd$i.out" 2>&1 &
        i=$((i + 1))
    done
    # up means every node idle
    k=0
    until [ "$(on_host 1 "$D" env SLURM_CONF="$D/slurm.conf" sinfo -h -N -t idle -o %N 2> /dev/null | sort -u | wc -l)" -eq "$N" ]; do
        k=$((k + 1))
        [ $k -lt 300 ] || die "the nodes did not come up: $(on_host 1 "$D" env SLURM_CONF="$D/slurm.conf" sinfo -N 2>&1 | tail -3;
                               tail -3 "$D/slurmctld.log" "$D/slurmd-cxhost1.log" 2> /dev/null)"
        sleep 0.1
    done
}

down() {
    D=$1
    [ -f "$D/cl/tag" ] || return 0
    # the daemons, the jobs and everything else started on the hosts
    $CL down "$D/cl"
}

case ${1:-} in
up) [ $# -eq 3 ] || die "usage: slurm.sh up N DIR"; up "$2" "$3" ;;
down) [ $# -eq 2 ] || die "usage: slurm.sh down DIR"; down "$2" ;;
exec)
    [ $# -ge 4 ] || die "usage: slurm.sh exec I DIR CMD..."
    I=$2 D=$3
    shift 3
    $CL exec "$I" "$D/cl" env SLURM_CONF="$D/slurm.conf" "$@"
    ;;
*) die "usage: slurm.sh up N DIR | down DIR | exec I DIR CMD..." ;;
esac

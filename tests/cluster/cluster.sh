#!/bin/sh
# A cluster of test hosts on this machine, for the multi-node tests.
#
#   cluster.sh up N DIR     N hosts; DIR gets the keys, configs, logs and a
#                           hostfile (DIR/hostfile, 2 slots each)
#   cluster.sh down DIR     stops everything and removes the namespaces
#   cluster.sh exec I DIR CMD...   runs CMD on host I (1..N), as its hostname
#
# Host I is a network namespace (cxc<tag>-hI) with its own UTS namespace
# (hostname cxhostI) for everything started in it, an address 10.251.0.I/24
# on eth0, and an sshd (Debian's) that takes the cluster's own key. The
# hosts' eth0 are joined by a bridge that lives in a namespace of its own
# (cxc<tag>-br), so nothing here touches this machine's network and nothing
# is reachable from outside it. The filesystem is shared, as with NFS.
# Needs root (CAP_NET_ADMIN, CAP_SYS_ADMIN): without it, it fails and says so.
set -eu

die() { echo "cluster: $*" >&2; exit 1; }
NET=10.251.0

tag_of() { printf '%s' "$1" | cksum | cut -c1-6; }

up() {
    N=$1 D=$2
    [ "$N" -ge 1 ] && [ "$N" -le 8 ] || die "N must be 1..8"
    command -v ip > /dev/null || die "ip (iproute2) not found: scripts/install-deps.sh installs it"
    command -v unshare > /dev/null || die "unshare (util-linux) not found"
    [ -x /usr/sbin/sshd ] || die "/usr/sbin/sshd not found: scripts/install-deps.sh installs openssh-server"
    mkdir -p "$D"
    D=$(cd "$D" && pwd)
    T=$(tag_of "$D")
    BR=cxc$T-br
    echo "$N" > "$D/hosts.n"
    echo "$T" > "$D/tag"
    ip netns add "$BR" 2> "$D/netns.err" || die "cannot make a network namespace ($(cat "$D/netns.err")); the cluster tests need root (CAP_NET_ADMIN)"
    ip -n "$BR" link add br0 type bridge
    ip -n "$BR" link set br0 up
    ssh-keygen -q -t ed25519 -N '' -f "$D/id" -C cxla-cluster
    cp "$D/id.pub" "$D/authorized_keys"
    chmod 600 "$D/authorized_keys"
    mkdir -p /run/sshd
    cat > "$D/ssh_config" <<EOF
Host $NET.*
    IdentityFile $D/id
    IdentitiesOnly yes
    StrictHostKeyChecking no
    UserKnownHostsFile /dev/null
    LogLevel ERROR
    BatchMode yes
    ConnectTimeout 5
EOF
    : > "$D/hostfile"
    i=1
    while [ "$i" -le "$N" ]; do
        H=cxc$T-h$i
        ip netns add "$H"
        ip link add "v$T$i" netns "$BR" type veth peer name eth0 netns "$H"
        ip -n "$BR" link set "v$T$i" master br0 up
        ip -n "$H" link set lo up
        ip -n "$H" addr add "$NET.$i/24" dev eth0
        ip -n "$H" link set eth0 up
        ssh-keygen -q -t ed25519 -N '' -f "$D/hostkey$i"
        cat > "$D/sshd_config$i" <<EOF
ListenAddress $NET.$i
Port 22
HostKey $D/hostkey$i
PidFile $D/sshd$i.pid
AuthorizedKeysFile $D/authorized_keys
PermitRootLogin prohibit-password
PasswordAuthentication no
KbdInteractiveAuthentication no
UsePAM no
StrictModes no
AcceptEnv *
EOF
        # sshd and what it starts see host i's hostname
        ip netns exec "$H" unshare --uts sh -c "hostname cxhost$i; exec /usr/sbin/sshd -D -e -f '$D/sshd_config$i'" \
            > "$D/sshd$i.log" 2>&1 &
        echo $! > "$D/sshd$i.launcher"
        echo "$NET.$i slots=2" >> "$D/hostfile"
        i=$((i + 1))
    done
    # every host reaches every other over ssh, or the cluster is not up
    i=1
    while [ "$i" -le "$N" ]; do
        k=0
        until ip netns exec "cxc$T-h1" ssh -F "$D/ssh_config" "$NET.$i" true 2> "$D/ssh.err"; do
            k=$((k + 1))
            [ "$k" -lt 50 ] || die "host $i does not answer ssh: $(cat "$D/ssh.err"; tail -3 "$D/sshd$i.log")"
            sleep 0.1
        done
        i=$((i + 1))
    done
}

down() {
    D=$1
    [ -f "$D/tag" ] || return 0
    T=$(cat "$D/tag") N=$(cat "$D/hosts.n")
    i=1
    while [ "$i" -le "$N" ]; do
        H=cxc$T-h$i
        # everything started in the host: sshd, orted, ranks
        for p in $(ip netns pids "$H" 2> /dev/null); do kill -9 "$p" 2> /dev/null || true; done
        ip netns del "$H" 2> /dev/null || true
        i=$((i + 1))
    done
    ip netns del "cxc$T-br" 2> /dev/null || true
    rm -f "$D/tag"
}

# Runs a command on host I with its hostname, Open MPI talking TCP over the
# cluster's network and reaching the other hosts through the cluster's ssh.
run_on() {
    I=$1 D=$2
    shift 2
    T=$(cat "$D/tag")
    ip netns exec "cxc$T-h$I" unshare --uts sh -c 'hostname "$1"; shift; exec "$@"' sh "cxhost$I" \
        env OMPI_MCA_plm_rsh_agent="ssh -F $D/ssh_config" \
            OMPI_MCA_btl="self,vader,tcp" OMPI_MCA_btl_tcp_if_include="$NET.0/24" \
            OMPI_MCA_oob_tcp_if_include="$NET.0/24" \
            "$@"
}

case ${1:-} in
up) [ $# -eq 3 ] || die "usage: cluster.sh up N DIR"; up "$2" "$3" ;;
down) [ $# -eq 2 ] || die "usage: cluster.sh down DIR"; down "$2" ;;
exec) [ $# -ge 4 ] || die "usage: cluster.sh exec I DIR CMD..."; I=$2 D=$3; shift 3; run_on "$I" "$D" "$@" ;;
*) die "usage: cluster.sh up N DIR | down DIR | exec I DIR CMD..." ;;
esac

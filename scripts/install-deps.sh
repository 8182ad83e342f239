#!/bin/sh
# Installs what cxla needs on Debian 12 (as root, or through sudo), and
# nothing when everything is already there. The Slurm daemons and munge are
# for the tests' own Slurm cluster (tests/slurm/); Debian's packages would
# start them at install: policy-rc.d keeps that from happening here, and
# the tests never use the system's instances (their own configs, keys and
# sockets). libpmix-dev holds the libpmix.so Slurm's pmix plugin loads.
set -eu

PACKAGES="build-essential time cmake pkg-config python3 zlib1g-dev libopenmpi-dev openmpi-bin libopenblas-dev libdnnl-dev libhdf5-dev libzstd-dev libcriterion-dev libxxhash-dev libdw-dev libcjson-dev libjpeg62-turbo-dev libspng-dev hdf5-tools graphviz clang-14 libclang-rt-14-dev openssh-server openssh-client iproute2 util-linux slurmctld slurmd slurm-client munge libpmix-dev"
OPTIONAL="dataset-fashion-mnist bible-kjv gnuplot-nox"

missing=""
for p in $PACKAGES $OPTIONAL; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing="$missing $p"
done
[ -z "$missing" ] && exit 0

SUDO=""
[ "$(id -u)" -eq 0 ] || SUDO="sudo"
echo "install-deps: installing$missing" >&2
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq >/dev/null
# shellcheck disable=SC2086
# no service started by an install: a 101 from policy-rc.d says "not now"
# to invoke-rc.d (only when there is no policy of the machine's own)
policy=""
if [ ! -e /usr/sbin/policy-rc.d ]; then
    policy=/usr/sbin/policy-rc.d
    printf '#!/bin/sh\nexit 101\n' | $SUDO tee "$policy" > /dev/null
    $SUDO chmod 755 "$policy"
fi
$SUDO apt-get install -y -qq --no-install-recommends $PACKAGES >/dev/null || { [ -z "$policy" ] || $SUDO rm -f "$policy"; exit 1; }
[ -z "$policy" ] || $SUDO rm -f "$policy"
# optional, one at a time so one missing package does not keep the others
# out: the data sets (train falls back to --data fake, gpt to --data FILE)
# and gnuplot for `gpt plot`
for p in $OPTIONAL; do
    $SUDO apt-get install -y -qq --no-install-recommends "$p" >/dev/null 2>&1 ||
        echo "install-deps: optional package $p could not be installed" >&2
done

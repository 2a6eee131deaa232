#!/usr/bin/env bash
# An "ssh" for the emulated cluster: MPICH's hydra calls it as `mpiexec -launcher ssh
# -launcher-exec netns_launcher.sh ...`, exactly the way it would call ssh:
#
#   netns_launcher.sh [ssh options] HOST COMMAND WORDS...
#
# (hydra 5.0 passes `-x HOST "<path>/hydra_pmi_proxy" --control-port ...`). Instead of logging
# into a remote machine, it runs COMMAND inside the network namespace named HOST, in a fresh
# UTS namespace whose host name is HOST. That makes every emulated node look like a separate
# machine to MPI: its own host name (so MPICH puts it in another node) and its own network
# stack (so traffic to other nodes leaves through its shaped eth0).
#
# run_cluster.sh names each namespace after the node's host name, so no mapping table is needed.
# Like ssh, the remaining words are joined with spaces and interpreted by a shell: hydra quotes
# them for that (the proxy path arrives as "\"/path/hydra_pmi_proxy\"").
set -euo pipefail

die() {
  echo "netns_launcher.sh: error: $*" >&2
  exit 255 # what ssh returns when it cannot connect; hydra reports the launch as failed
}

# Skip ssh's options. Those that take an argument (ssh(1): -B -b -c -D -E -e -F -I -i -J -L -l
# -m -O -o -p -Q -R -S -W -w) swallow the next word too, unless it is glued on (-p22).
while [[ $# -gt 0 && $1 == -* ]]; do
  case $1 in
    --) shift; break ;;
    -[BbcDEeFIiJLlmOopQRSWw]) shift 2 || die "option $1 needs an argument" ;;
    *) shift ;;
  esac
done

[[ $# -ge 2 ]] || die "usage: netns_launcher.sh [ssh options] HOST COMMAND..."
host=${1#*@} # ssh accepts user@host; the user part means nothing here
shift

# Host names come from run_cluster.sh; refuse anything else rather than run in the wrong place.
[[ $host =~ ^[A-Za-z0-9][A-Za-z0-9.-]*$ ]] || die "bad host name '$host'"
# `ip netns list` prints "name (id: N)"; compare the first word exactly.
if ! ip netns list | awk -v h="$host" '$1 == h { found = 1 } END { exit !found }'; then
  die "no network namespace named '$host' (is run_cluster.sh still running?)"
fi

# The inner shell sets the host name (in the new UTS namespace only), then replaces itself with
# the command, so hydra's proxy is the process that ends up in the namespace and signals reach it.
# "$*" keeps ssh's semantics: the words are joined and parsed by that shell.
# shellcheck disable=SC2016  # $0 is expanded by the inner shell, on purpose
exec ip netns exec "$host" unshare --uts sh -c 'hostname "$0" || exit 255; exec '"$*" "$host"

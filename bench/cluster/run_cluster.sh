#!/usr/bin/env bash
# Emulated multi-node cluster on one Linux machine, for running MPI jobs (fourd's benchmark, tests)
# across "nodes" whose link to each other is a rate-limited TCP network, while ranks on the same
# node still talk through shared memory. See bench/cluster/README.md for the full story.
#
# What it builds, per invocation (all names carry a per-run prefix fdc<PID> so concurrent runs
# never collide, and a later --cleanup can tell a dead run's leftovers from a live run's):
#
#   root namespace: bridge <prefix>-br 198.S.T.1/24  ("the launcher", host name <prefix>-head)
#     |-- veth <prefix>-h0 (tbf)  <->  eth0 (tbf) 198.S.T.10  in netns <prefix>-node0
#     |-- veth <prefix>-h1 (tbf)  <->  eth0 (tbf) 198.S.T.11  in netns <prefix>-node1
#     ...
#
# S.T is the first free /24 in 198.18.0.0/15, the block reserved for benchmarking (RFC 2544), so
# the emulated network can never shadow a real one. Node host names are put into /etc/hosts with a
# marker comment and removed afterwards. Each node's processes run under `ip netns exec` plus a
# private UTS namespace with the node's host name (netns_launcher.sh), so MPI sees K machines.
#
# The job is launched by the MPICH (hydra) mpiexec next to the chosen Python, with the ssh
# launcher replaced by netns_launcher.sh, and with the MPI netmod forced onto TCP over eth0:
# otherwise MPICH's UCX finds that all "nodes" share one kernel and uses shared memory between
# them, and nothing crosses the shaped links.
#
# Everything is torn down on exit, on error and on Ctrl-C/TERM (a trap), and checked afterwards.
# A run killed with SIGKILL cannot clean up after itself: `run_cluster.sh --cleanup` removes the
# leftovers of every run whose process is gone.
set -euo pipefail

readonly PROG=run_cluster.sh
SCRIPT_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
readonly SCRIPT_DIR
readonly LAUNCHER="$SCRIPT_DIR/netns_launcher.sh"
REPO_ROOT=$(cd "$SCRIPT_DIR/../.." && pwd)
readonly REPO_ROOT
readonly HOSTS_FILE=/etc/hosts
readonly HOSTS_MARK='# fourd-cluster' # every line we add ends in "$HOSTS_MARK <prefix>"
readonly MAX_NODES=64                  # keeps interface names <= 15 chars and addresses in .10-.73
readonly MAX_RANKS_PER_NODE=256
# One lock for all runs: it serialises picking a subnet and editing /etc/hosts.
LOCK_FILE=/run/lock/fourd-cluster.lock
[[ -d /run/lock ]] || LOCK_FILE=/tmp/fourd-cluster.lock
readonly LOCK_FILE

usage() {
  cat <<EOF
Usage: $PROG [options] [-- COMMAND [ARGS...]]
       $PROG [options] -- -ARGS...      (extra arguments for the default command)
       $PROG --cleanup

Build an emulated cluster of K nodes on this machine (network namespaces + veth links to a
bridge, each link rate-limited with tc tbf) and run one MPI job across it with MPICH's mpiexec:
R ranks per node, ranks 0..R-1 on node0, R..2R-1 on node1, and so on. Traffic between nodes is
forced onto TCP over the shaped links; ranks on one node use shared memory. Needs root.

The default command is:  PYTHON -m mpi4py -m fourd.bench
A COMMAND whose first word is 'python' or 'python3' runs with the selected PYTHON instead.

Options:
  -n, --nodes K            emulated nodes (default 2, at most $MAX_NODES)
  -r, --ranks-per-node R   MPI ranks per node (default 2)
      --rate RATE[,RATE..] link rate per node and direction, tc syntax: 1gbit, 500mbit, 100mbps
                           (bytes/s) ... (default 4gbit). A comma list runs the command once
                           per rate, on the same cluster, re-shaping the links in between.
      --burst SIZE         tbf bucket size in bytes, suffix k/m allowed (default: 2 ms at the
                           rate, at least 64k)
      --latency DELAY      one-way delay added to each node's outgoing traffic (e.g. 50us, 1ms).
                           Needs the netem qdisc; many kernels lack it, and the run then stops
                           with an error before the job starts. tbf alone adds no delay beyond
                           the serialisation time.
      --mtu BYTES          MTU of the node links (default 1500)
      --transport T        how inter-node traffic is forced onto TCP (default ucx):
                             ucx: UCX_TLS=tcp,self UCX_NET_DEVICES=eth0
                             ofi: MPIR_CVAR_CH4_NETMOD=ofi FI_PROVIDER=tcp FI_TCP_IFACE=eth0
      --python PATH        Python to run (default: \$PYTHON, else the active virtualenv's
                           python, else <repo>/.venv/bin/python, else python3 on PATH)
      --mpiexec PATH       MPICH mpiexec (default: the one next to PYTHON)
      --timeout SECONDS    kill the job after this many seconds, per run (default: no limit)
      --min-traffic SIZE   fail a run if fewer bytes than this crossed between nodes (default 0:
                           report only). Suffix k/m/g = KiB/MiB/GiB.
      --keep-going         with several rates: go on with the next rate after a failed run
                           (default: stop at the first failure)
      --cleanup            remove what dead runs left behind (namespaces, links, bridges, qdiscs,
                           /etc/hosts lines), then exit; live runs are left alone
  -h, --help               show this help

Environment given to the job: FOURD_CLUSTER_NODES, FOURD_CLUSTER_RANKS_PER_NODE,
FOURD_CLUSTER_RATE (as given), FOURD_CLUSTER_RATE_BPS (bits/s), FOURD_CLUSTER_TRANSPORT,
plus the transport variables above (also passed with -genv).

Exit status: the job's status (the first failing one with several rates); 2 for bad usage or a
machine that cannot host the cluster; 3 if a run moved fewer bytes than --min-traffic; 4 if the
teardown left something behind; 124 if --timeout expired; 128+N on signal N.

Examples (as root, from the repository root):
  bench/cluster/run_cluster.sh -- python -m mpi4py.bench helloworld
  bench/cluster/run_cluster.sh --rate 1gbit,4gbit -- python -m mpi4py bench/cluster/mpi_selfcheck.py
  bench/cluster/run_cluster.sh --nodes 4 --ranks-per-node 1 -- --help   # args for fourd.bench
  bench/cluster/run_cluster.sh --cleanup
EOF
}

die() { # usage errors and unusable machines: exit 2 before anything was built
  echo "$PROG: error: $*" >&2
  exit 2
}
warn() { echo "$PROG: warning: $*" >&2; }
say() { echo "[cluster] $*"; }

# ---------------------------------------------------------------------------------------------
# Parsing helpers. Each fails on a bad value; the caller names the option in its message.

# Is $1 a decimal integer in [$2, $3]? (10# so that a leading zero is not read as octal)
int_in_range() { [[ $1 =~ ^[0-9]{1,9}$ ]] && ((10#$1 >= $2 && 10#$1 <= $3)); }

# tc rate syntax -> bits per second. tc's "bps" means bytes per second, "bit" bits per second.
rate_to_bps() {
  local r=${1,,} mult
  [[ $r =~ ^([0-9]+(\.[0-9]+)?)(bit|kbit|mbit|gbit|tbit|bps|kbps|mbps|gbps|tbps)$ ]] || return 1
  case ${BASH_REMATCH[3]} in
    bit) mult=1 ;; kbit) mult=1e3 ;; mbit) mult=1e6 ;; gbit) mult=1e9 ;; tbit) mult=1e12 ;;
    bps) mult=8 ;; kbps) mult=8e3 ;; mbps) mult=8e6 ;; gbps) mult=8e9 ;; tbps) mult=8e12 ;;
  esac
  # Below 1 Mbit/s a benchmark would run for hours; above 1 Tbit/s tbf is not the bottleneck.
  awk -v n="${BASH_REMATCH[1]}" -v m="$mult" \
    'BEGIN { v = n * m; if (v < 1e6 || v > 1e12) exit 1; printf "%.0f\n", v }'
}

# 4096, 64k, 16M, 1g -> bytes (binary multiples, like tc's "kb").
size_to_bytes() {
  local s=${1,,}
  [[ $s =~ ^([0-9]{1,12})(k|kb|kib|m|mb|mib|g|gb|gib)?$ ]] || return 1
  local n=$((10#${BASH_REMATCH[1]}))
  case ${BASH_REMATCH[2]} in
    k | kb | kib) n=$((n * 1024)) ;;
    m | mb | mib) n=$((n * 1024 * 1024)) ;;
    g | gb | gib) n=$((n * 1024 * 1024 * 1024)) ;;
  esac
  echo "$n"
}

human_bytes() { awk -v b="$1" 'BEGIN {
  if (b >= 1e9) printf "%.2f GB", b / 1e9; else if (b >= 1e6) printf "%.2f MB", b / 1e6;
  else if (b >= 1e3) printf "%.1f kB", b / 1e3; else printf "%d B", b }'; }

# ---------------------------------------------------------------------------------------------
# Arguments. Everything is validated before the machine is touched, so bad usage needs no root.

nodes=2
ranks_per_node=2
rate_arg=4gbit
burst_arg=auto
latency=
mtu=1500
transport=ucx
python_arg=
mpiexec_arg=
timeout_s=0
min_traffic=0
keep_going=0
cleanup_only=0
command=()

need_value() { [[ $# -ge 2 ]] || die "option $1 needs a value (see --help)"; }
while [[ $# -gt 0 ]]; do
  opt=$1
  # Accept --opt=value as well as --opt value.
  if [[ $opt == --*=* ]]; then
    set -- "${opt%%=*}" "${opt#*=}" "${@:2}"
    opt=$1
  fi
  case $opt in
    -h | --help) usage; exit 0 ;;
    -n | --nodes) need_value "$@"; nodes=$2; shift 2 ;;
    -r | --ranks-per-node) need_value "$@"; ranks_per_node=$2; shift 2 ;;
    --rate) need_value "$@"; rate_arg=$2; shift 2 ;;
    --burst) need_value "$@"; burst_arg=$2; shift 2 ;;
    --latency) need_value "$@"; latency=$2; shift 2 ;;
    --mtu) need_value "$@"; mtu=$2; shift 2 ;;
    --transport) need_value "$@"; transport=$2; shift 2 ;;
    --python) need_value "$@"; python_arg=$2; shift 2 ;;
    --mpiexec) need_value "$@"; mpiexec_arg=$2; shift 2 ;;
    --timeout) need_value "$@"; timeout_s=$2; shift 2 ;;
    --min-traffic) need_value "$@"; min_traffic=$2; shift 2 ;;
    --keep-going) keep_going=1; shift ;;
    --cleanup) cleanup_only=1; shift ;;
    --) shift; command=("$@"); break ;;
    *) die "unknown argument '$opt' (a command goes after --; see --help)" ;;
  esac
done

if [[ $cleanup_only -eq 0 ]]; then
  int_in_range "$nodes" 1 "$MAX_NODES" ||
    die "--nodes must be an integer from 1 to $MAX_NODES, got '$nodes'"
  int_in_range "$ranks_per_node" 1 "$MAX_RANKS_PER_NODE" || die "--ranks-per-node must be" \
    "an integer from 1 to $MAX_RANKS_PER_NODE, got '$ranks_per_node'"
  IFS=, read -r -a rates <<<"$rate_arg"
  [[ ${#rates[@]} -gt 0 ]] || die "--rate is empty"
  rates_bps=()
  for r in "${rates[@]}"; do
    bps=$(rate_to_bps "$r") || die "--rate: '$r' is not a rate between 1mbit and 1tbit" \
      "in tc syntax (e.g. 4gbit, 800mbit, 100mbps)"
    rates_bps+=("$bps")
  done
  if [[ $burst_arg != auto ]]; then
    burst_bytes=$(size_to_bytes "$burst_arg") || burst_bytes=0
    ((burst_bytes >= 2048)) || die "--burst must be a size of at least 2k (e.g. 512k), got '$burst_arg'"
  fi
  if [[ -n $latency ]]; then
    [[ $latency =~ ^[0-9]+(\.[0-9]+)?(us|ms|s)$ ]] ||
      die "--latency must be a delay like 50us, 1ms or 0.5ms, got '$latency'"
  fi
  int_in_range "$mtu" 576 65535 ||
    die "--mtu must be an integer from 576 to 65535, got '$mtu'"
  [[ $transport == ucx || $transport == ofi ]] ||
    die "--transport must be ucx or ofi, got '$transport'"
  int_in_range "$timeout_s" 0 86400 ||
    die "--timeout must be a positive number of seconds, got '$timeout_s'"
  # Validated: now drop leading zeros once, so later arithmetic never reads them as octal.
  nodes=$((10#$nodes)) ranks_per_node=$((10#$ranks_per_node)) mtu=$((10#$mtu))
  timeout_s=$((10#$timeout_s))
  min_traffic_bytes=$(size_to_bytes "$min_traffic") ||
    die "--min-traffic must be a size like 0, 4096, 16m, got '$min_traffic'"
fi

# ---------------------------------------------------------------------------------------------
# The machine: root and the tools. Checked before anything is created.

[[ $(id -u) -eq 0 ]] ||
  die "must run as root: it creates network namespaces, veths and a bridge, and edits $HOSTS_FILE"
for tool in ip tc unshare flock timeout hostname awk; do
  command -v "$tool" >/dev/null ||
    die "'$tool' not found on PATH (ip/tc: iproute2; unshare/flock: util-linux)"
done
[[ -x $LAUNCHER ]] || die "$LAUNCHER is missing or not executable"

# Names of everything a run with this prefix may have created, one per line ("kind name").
# Derived from the system, not from a state file, so --cleanup works after SIGKILL too.
list_objects() {
  local prefix=$1
  # "name (id: N)" or just "name"
  ip netns list 2>/dev/null | awk -v p="$prefix-" 'index($1, p) == 1 { print "netns", $1 }'
  # "7: fdc12-h0@if6: <...>": field 2, minus ":" and the "@peer" part
  ip -o link show 2>/dev/null | awk -v p="$prefix-" '{ n = $2; sub(/:$/, "", n); sub(/@.*/, "", n);
    if (index(n, p) == 1) print "link", n }'
  tc qdisc show 2>/dev/null | awk -v p="$prefix-" '{ for (i = 1; i < NF; i++)
    if ($i == "dev" && index($(i + 1), p) == 1) print "qdisc", $(i + 1) }' | sort -u
  hosts_lines "$prefix" | awk '{ print "hosts", $2 }'
}

# Our /etc/hosts lines of one run: they end in exactly "# fourd-cluster <prefix>" (an exact match
# on the last word, so fdc12 never matches fdc123's lines).
hosts_lines() {
  awk -v p="$1" '$NF == p && $(NF - 1) == "fourd-cluster" && $(NF - 2) == "#"' "$HOSTS_FILE" 2>/dev/null || true
}

# Remove one run's objects. Idempotent and best effort: it must work on half-built clusters.
teardown_prefix() {
  local prefix=$1 ns pids link
  set +e
  # Processes first: a namespace (and its veth) lives on while a process is inside, even after
  # `ip netns del`. Ask nicely, then insist.
  for ns in $(ip netns list 2>/dev/null | awk -v p="$prefix-" 'index($1, p) == 1 { print $1 }'); do
    pids=$(ip netns pids "$ns" 2>/dev/null)
    if [[ -n $pids ]]; then
      # shellcheck disable=SC2086
      kill -TERM $pids 2>/dev/null
      for _ in 1 2 3 4 5 6 7 8 9 10; do
        [[ -z $(ip netns pids "$ns" 2>/dev/null) ]] && break
        sleep 0.2
      done
      pids=$(ip netns pids "$ns" 2>/dev/null)
      # shellcheck disable=SC2086
      [[ -n $pids ]] && kill -KILL $pids 2>/dev/null && sleep 0.2
    fi
    ip netns del "$ns" 2>/dev/null
  done
  # Deleting a veth end destroys the pair and its qdiscs; the bridge goes last.
  for link in $(ip -o link show 2>/dev/null | awk -v p="$prefix-" '{ n = $2; sub(/:$/, "", n);
      sub(/@.*/, "", n); if (index(n, p) == 1 && n !~ /-br$/) print n }'); do
    ip link del "$link" 2>/dev/null
  done
  ip link del "$prefix-br" 2>/dev/null
  remove_hosts_lines "$prefix"
  set -e
}

# Rewrite /etc/hosts in place (cat >, not mv): in containers it is often a bind mount that
# cannot be replaced. Under the lock, so two runs never lose each other's lines.
remove_hosts_lines() {
  local prefix=$1 tmp
  [[ -n $(hosts_lines "$prefix") ]] || return 0
  tmp=$(mktemp)
  {
    flock 9
    awk -v p="$prefix" '!($NF == p && $(NF - 1) == "fourd-cluster" && $(NF - 2) == "#")' \
      "$HOSTS_FILE" >"$tmp" && cat "$tmp" >"$HOSTS_FILE"
  } 9>"$LOCK_FILE"
  rm -f "$tmp"
}

# Is the run that owns this prefix still alive? (The prefix is fdc<PID of run_cluster.sh>.)
prefix_alive() {
  local pid=${1#fdc}
  [[ $pid != "$$" ]] && kill -0 "$pid" 2>/dev/null &&
    tr '\0' ' ' <"/proc/$pid/cmdline" 2>/dev/null | grep -q run_cluster
}

all_prefixes() {
  {
    ip netns list 2>/dev/null | awk '{ print $1 }'
    ip -o link show 2>/dev/null | awk '{ print $2 }'
    awk '$(NF - 1) == "fourd-cluster" && $(NF - 2) == "#" { print $NF }' "$HOSTS_FILE" 2>/dev/null
  } | grep -oE '^fdc[0-9]+' | sort -u || true
}

if [[ $cleanup_only -eq 1 ]]; then
  found=0 failed=0
  for prefix in $(all_prefixes); do
    found=1
    if prefix_alive "$prefix"; then
      say "$prefix: run ${prefix#fdc} is still alive, left alone"
      continue
    fi
    say "$prefix: removing leftovers of a dead run: $(list_objects "$prefix" | awk '{ print $2 }' | sort -u | xargs)"
    teardown_prefix "$prefix"
    if [[ -n $(list_objects "$prefix") ]]; then
      warn "$prefix: could not remove: $(list_objects "$prefix" | tr '\n' ' ')"
      failed=1
    fi
  done
  [[ $found -eq 1 ]] || say "nothing to clean up"
  exit $((failed ? 4 : 0))
fi

# ---------------------------------------------------------------------------------------------
# Python and mpiexec.

if [[ -n $python_arg ]]; then
  python=$python_arg
elif [[ -n ${PYTHON:-} ]]; then
  python=$PYTHON
elif [[ -n ${VIRTUAL_ENV:-} && -x $VIRTUAL_ENV/bin/python ]]; then
  python=$VIRTUAL_ENV/bin/python
elif [[ -x $REPO_ROOT/.venv/bin/python ]]; then
  python=$REPO_ROOT/.venv/bin/python
else
  python=$(command -v python3) || die "no Python found: pass --python PATH"
fi
[[ $python == */* ]] || python=$(command -v "$python") || die "--python: '$python' not found"
[[ -x $python ]] || die "--python: '$python' is not an executable file"
# Not resolving symlinks: a venv's bin/python is a link out of the venv, but its mpiexec is not.
pybin=$(cd "$(dirname "$python")" && pwd)
python="$pybin/$(basename "$python")"
mpiexec=${mpiexec_arg:-$pybin/mpiexec}
[[ -x $mpiexec ]] || die "no mpiexec at '$mpiexec': install the mpich wheel next to $python" \
  "(pip install mpich) or pass --mpiexec"
[[ $("$mpiexec" --version 2>/dev/null) == *HYDRA* ]] ||
  die "'$mpiexec' is not MPICH's hydra mpiexec (this harness relies on -launcher ssh -launcher-exec)"

if [[ ${#command[@]} -eq 0 || ${command[0]} == -* ]]; then
  command=("$python" -m mpi4py -m fourd.bench "${command[@]}")
elif [[ ${command[0]} == python || ${command[0]} == python3 ]]; then
  command[0]=$python
fi

# shellcheck disable=SC2054  # the comma is part of UCX_TLS's value
case $transport in
  ucx) transport_env=(UCX_TLS=tcp,self UCX_NET_DEVICES=eth0) ;;
  ofi) transport_env=(MPIR_CVAR_CH4_NETMOD=ofi FI_PROVIDER=tcp FI_TCP_IFACE=eth0) ;;
esac

# ---------------------------------------------------------------------------------------------
# Build the cluster. From here on, the EXIT trap owns the cleanup.

prefix=fdc$$
job_pid=
final_rc=0

# shellcheck disable=SC2329  # called through the traps below
on_exit() {
  local rc=$? left
  set +e
  # A second Ctrl-C must not cut the teardown short.
  trap '' INT TERM HUP
  trap - EXIT
  # If we die while holding the lock (an error while claiming the subnet), release it, or the
  # /etc/hosts cleanup below would wait for ourselves forever.
  exec 9>&-
  if [[ -n $job_pid ]] && kill -TERM "$job_pid" 2>/dev/null; then
    # mpiexec passes the TERM on to its proxies; give it a moment, then insist. Whatever is
    # still running inside the namespaces is killed by the teardown.
    for _ in $(seq 25); do kill -0 "$job_pid" 2>/dev/null || break; sleep 0.2; done
    kill -KILL "$job_pid" 2>/dev/null
  fi
  teardown_prefix "$prefix"
  left=$(list_objects "$prefix")
  if [[ -n $left ]]; then
    echo "$PROG: error: teardown left behind: $(echo "$left" | tr '\n' ' ') (try $PROG --cleanup)" >&2
    [[ $rc -eq 0 ]] && rc=4
  else
    say "teardown: $prefix removed (namespaces, veths, bridge, qdiscs, $HOSTS_FILE lines)"
  fi
  exit "$rc"
}
# shellcheck disable=SC2329
on_signal() {
  echo "$PROG: caught SIG$1, stopping the job and tearing down" >&2
  exit "$2" # runs on_exit
}
trap on_exit EXIT
trap 'on_signal INT 130' INT
trap 'on_signal TERM 143' TERM
trap 'on_signal HUP 129' HUP

# A previous run with our PID that was SIGKILLed: its leftovers are certainly dead.
[[ -z $(list_objects "$prefix") ]] || teardown_prefix "$prefix"

head_name=$prefix-head
node_names=()
for ((i = 0; i < nodes; i++)); do node_names+=("$prefix-node$i"); done

# Claim a subnet and the host names atomically: the bridge's address is the claim.
{
  flock 9
  used=$(ip -4 -o addr show 2>/dev/null | awk '{ print $4 }')
  net=
  for ((j = 0; j < 512; j++)); do
    cand="198.$((18 + j / 256)).$((j % 256))"
    if ! grep -q "^${cand//./\\.}\." <<<"$used"; then net=$cand; break; fi
  done
  [[ -n $net ]] || { echo "$PROG: error: no free /24 left in 198.18.0.0/15" >&2; exit 2; }
  ip link add "$prefix-br" type bridge
  ip addr add "$net.1/24" dev "$prefix-br"
  {
    echo "$net.1 $head_name $HOSTS_MARK $prefix"
    for ((i = 0; i < nodes; i++)); do echo "$net.$((10 + i)) ${node_names[i]} $HOSTS_MARK $prefix"; done
  } >>"$HOSTS_FILE"
} 9>"$LOCK_FILE"
ip link set "$prefix-br" up

for ((i = 0; i < nodes; i++)); do
  ns=${node_names[i]}
  ip netns add "$ns"
  # Create the pair in the root namespace, then move one end in and call it eth0 there: every
  # node then has the same interface name, which is what UCX_NET_DEVICES/FI_TCP_IFACE select.
  ip link add "$prefix-h$i" mtu "$mtu" type veth peer name "$prefix-p$i" mtu "$mtu"
  ip link set "$prefix-p$i" netns "$ns"
  ip -n "$ns" link set "$prefix-p$i" name eth0
  ip -n "$ns" addr add "$net.$((10 + i))/24" dev eth0
  ip -n "$ns" link set eth0 up
  ip -n "$ns" link set lo up # MPI and hydra use loopback inside a node
  ip link set "$prefix-h$i" master "$prefix-br" up
done

# (Re)shape every node link for one rate. Deleting and re-adding the qdiscs also resets their
# counters, so each run's counters are its own.
#   host-side veth egress = traffic INTO the node; eth0 egress in the namespace = traffic OUT.
# A node-to-node packet passes both (sender's eth0, receiver's veth), at the same rate, so the
# path runs at RATE, and a node's total in or out is limited to RATE as on a real NIC.
shape_links() {
  local bps=$1 burst i ns
  if [[ $burst_arg == auto ]]; then
    burst=$(awk -v b="$bps" 'BEGIN { v = b / 8 * 0.002; if (v < 65536) v = 65536; printf "%.0f", v }')
  else
    burst=$burst_bytes
  fi
  # tbf's "latency" is only its queue length in time (packets waiting longer are dropped); 50 ms
  # is deep enough that TCP sees no drops and the measured time is pure bandwidth.
  local tbf=(tbf rate "${bps}bit" burst "$burst" latency 50ms)
  for ((i = 0; i < nodes; i++)); do
    ns=${node_names[i]}
    tc qdisc del dev "$prefix-h$i" root 2>/dev/null || true
    tc -n "$ns" qdisc del dev eth0 root 2>/dev/null || true
    tc qdisc add dev "$prefix-h$i" root handle 1: "${tbf[@]}"
    tc -n "$ns" qdisc add dev eth0 root handle 1: "${tbf[@]}"
    if [[ -n $latency ]]; then
      # netem under tbf's class: the usual rate + delay recipe. Only on the way out of a node,
      # so a node-to-node message is delayed once.
      tc -n "$ns" qdisc add dev eth0 parent 1:1 handle 10: netem delay "$latency" 2>/dev/null || {
        echo "$PROG: error: --latency needs the netem qdisc, which this kernel does not have" \
          "(sch_netem). Run without --latency: tbf limits the rate but cannot add delay." >&2
        exit 2
      }
    fi
  done
  shaped_burst=$burst
}

# "Sent N bytes M pkt (dropped D, ...)" of the root qdisc of a device, as "N M D".
qdisc_sent() {
  local out
  if [[ $1 == - ]]; then
    out=$(tc -s qdisc show dev "$2" root)
  else
    out=$(tc -n "$1" -s qdisc show dev "$2" root)
  fi
  # The first "Sent" line is the root tbf's (a netem child, if any, follows it).
  awk '/Sent/ && !seen { seen = 1
      for (i = 1; i < NF; i++) {
        if ($(i + 1) == "bytes") b = $i; if ($(i + 1) == "pkt") p = $i
        if ($i == "(dropped") { d = $(i + 1); sub(",", "", d) } } }
    END { printf "%.0f %.0f %.0f\n", b + 0, p + 0, d + 0 }' <<<"$out"
}

# Shape for the first rate now, before the header: a kernel without netem fails here, before
# anything is printed or run.
shape_links "${rates_bps[0]}"

# ---------------------------------------------------------------------------------------------
# Header

hosts_arg=$(for ((i = 0; i < nodes; i++)); do printf '%s:%d,' "${node_names[i]}" "$ranks_per_node"; done)
hosts_arg=${hosts_arg%,}
nranks=$((nodes * ranks_per_node))
placement=
for ((i = 0; i < nodes; i++)); do
  if ((nodes > 4 && i == 2)); then placement+=", ..."; i=$((nodes - 2)); continue; fi
  lo=$((i * ranks_per_node)) hi=$(((i + 1) * ranks_per_node - 1))
  ((i == 0)) || placement+=", "
  if ((lo == hi)); then placement+="node$i: rank $lo"; else placement+="node$i: ranks $lo-$hi"; fi
done
say "run $prefix: $nodes nodes x $ranks_per_node ranks = $nranks ranks ($placement)"
say "links: rate ${rates[*]} per node and direction (tc tbf on both ends of each veth)," \
  "latency ${latency:-not emulated (tbf only; no netem)}, mtu $mtu"
say "transport: inter-node TCP over eth0 (${transport_env[*]}); intra-node shared memory"
say "network: bridge $prefix-br $net.1/24 = $head_name (mpiexec); nodes:" \
  "$(for ((i = 0; i < nodes; i++)); do printf '%s=%s ' "${node_names[i]}" "$net.$((10 + i))"; done)"
say "mpiexec: $mpiexec"
say "command: ${command[*]}"

export FOURD_CLUSTER_NODES=$nodes FOURD_CLUSTER_RANKS_PER_NODE=$ranks_per_node
export FOURD_CLUSTER_TRANSPORT=$transport
export PATH="$pybin:$PATH"
genv=()
for kv in "${transport_env[@]}"; do
  export "${kv?}"
  genv+=(-genv "${kv%%=*}" "${kv#*=}")
done

# ---------------------------------------------------------------------------------------------
# Run the command once per rate.

for idx in "${!rates[@]}"; do
  rate=${rates[idx]}
  bps=${rates_bps[idx]}
  ((idx == 0)) || shape_links "$bps"
  export FOURD_CLUSTER_RATE=$rate FOURD_CLUSTER_RATE_BPS=$bps
  br_rx0=$(cat "/sys/class/net/$prefix-br/statistics/rx_bytes")
  br_tx0=$(cat "/sys/class/net/$prefix-br/statistics/tx_bytes")
  say "=== run $((idx + 1))/${#rates[@]}: rate $rate, tbf burst $shaped_burst bytes ==="

  launch=("$mpiexec" -launcher ssh -launcher-exec "$LAUNCHER" -hosts "$hosts_arg"
    -localhost "$head_name" -genvall "${genv[@]}" -n "$nranks" "${command[@]}")
  [[ $timeout_s -eq 0 ]] || launch=(timeout --kill-after=10 "$timeout_s" "${launch[@]}")
  # In the background + wait, so a TERM/INT to this script runs the trap at once instead of
  # after the job ends; the trap then stops the job.
  t0=$(date +%s.%N)
  "${launch[@]}" &
  job_pid=$!
  rc=0
  wait "$job_pid" || rc=$?
  job_pid=
  t1=$(date +%s.%N)
  [[ $rc -eq 124 && $timeout_s -ne 0 ]] && warn "run $((idx + 1)) timed out after $timeout_s s"

  # Counters. Bytes that left the nodes include the hydra control traffic to mpiexec, which the
  # bridge device counts as received (and what mpiexec sends back as transmitted); the rest went
  # node to node through the bridge.
  br_rx=$(($(cat "/sys/class/net/$prefix-br/statistics/rx_bytes") - br_rx0))
  br_tx=$(($(cat "/sys/class/net/$prefix-br/statistics/tx_bytes") - br_tx0))
  say "link counters (tc tbf 'Sent' and 'dropped', this run):"
  printf '[cluster]   %-22s %38s %38s\n' node "into node (host veth)" "out of node (eth0)"
  total_out=0
  drops=0
  for ((i = 0; i < nodes; i++)); do
    read -r in_b in_p in_d <<<"$(qdisc_sent - "$prefix-h$i")"
    read -r out_b out_p out_d <<<"$(qdisc_sent "${node_names[i]}" eth0)"
    total_out=$((total_out + out_b))
    drops=$((drops + in_d + out_d))
    printf '[cluster]   %-22s %16s %9s pkt %5s drop %16s %9s pkt %5s drop\n' "${node_names[i]}" \
      "$(human_bytes "$in_b")" "$in_p" "$in_d" "$(human_bytes "$out_b")" "$out_p" "$out_d"
  done
  if ((drops > 0)); then
    warn "the shaped links dropped $drops packets: TCP retransmitted them, and a retransmission" \
      "timeout stalls a transfer for 200 ms or more (a deeper tbf queue avoids it)"
  fi
  node_to_node=$((total_out - br_rx))
  ((node_to_node >= 0)) || node_to_node=0
  job_s=$(awk -v a="$t0" -v b="$t1" 'BEGIN { printf "%.2f", b - a }')
  say "node-to-node traffic ~ $(human_bytes "$node_to_node"); control traffic with mpiexec:" \
    "$(human_bytes "$br_rx") in, $(human_bytes "$br_tx") out; job time $job_s s, rc $rc"
  # One machine-readable line per run, for tests and scripts.
  echo "cluster-traffic run=$((idx + 1)) rate=$rate node_to_node_bytes=$node_to_node" \
    "control_in_bytes=$br_rx control_out_bytes=$br_tx dropped_packets=$drops rc=$rc"

  if [[ $rc -eq 0 && $nodes -gt 1 && $node_to_node -lt $min_traffic_bytes ]]; then
    echo "$PROG: error: only $node_to_node bytes crossed the node links (--min-traffic $min_traffic):" \
      "the job did not use the network between nodes" >&2
    rc=3
  elif [[ $rc -eq 0 && $nodes -gt 1 && $node_to_node -lt 65536 ]]; then
    warn "almost no traffic crossed the node links: does the command communicate across nodes?"
  fi
  if [[ $rc -ne 0 ]]; then
    [[ $final_rc -ne 0 ]] || final_rc=$rc
    if [[ $keep_going -eq 0 && $idx -lt $((${#rates[@]} - 1)) ]]; then
      warn "run $((idx + 1)) failed (rc $rc): skipping the remaining rates (use --keep-going to go on)"
      break
    fi
  fi
done

exit "$final_rc"

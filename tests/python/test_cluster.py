"""Smoke test of the emulated multi-node cluster harness (bench/cluster/run_cluster.sh).

The harness needs root, iproute2 (ip, tc) and util-linux (unshare, flock), and a kernel that lets
it create network namespaces; where that is missing the cluster test skips with the reason. The
argument-checking test runs everywhere.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
HARNESS = REPO / "bench" / "cluster" / "run_cluster.sh"
SELFCHECK = REPO / "bench" / "cluster" / "mpi_selfcheck.py"
MPIEXEC = Path(sys.executable).parent / "mpiexec"
TIMEOUT_S = 90  # the run takes ~1 s on 2 cores; this only guards against a hang


def _run(cmd: list[str], timeout: float) -> subprocess.CompletedProcess:
    """Run in its own session; on timeout TERM the whole group (the harness then tears down),
    then KILL it, then remove what a killed harness may have left behind."""
    proc = subprocess.Popen(
        cmd,
        cwd=REPO,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    try:
        out, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            out, _ = proc.communicate(timeout=15)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            out, _ = proc.communicate()
            subprocess.run(["bash", str(HARNESS), "--cleanup"], timeout=60, check=False)
        pytest.fail(f"{cmd} did not finish within {timeout} s; output:\n{out}")
    return subprocess.CompletedProcess(cmd, proc.returncode, out)


def _cluster_unavailable() -> str | None:
    """Why this machine cannot host the emulated cluster, or None if it can."""
    if not sys.platform.startswith("linux"):
        return "network namespaces are Linux only"
    if os.geteuid() != 0:
        return "needs root (network namespaces, veths, a bridge, /etc/hosts)"
    missing = [t for t in ("ip", "tc", "unshare", "flock", "timeout") if shutil.which(t) is None]
    if missing:
        return f"missing tools: {', '.join(missing)} (iproute2, util-linux, coreutils)"
    if not MPIEXEC.exists():
        return f"no mpiexec next to {sys.executable} (the mpich wheel is not installed)"
    # The harness drives MPICH's launcher (hydra: -launcher ssh -launcher-exec ...).
    version = subprocess.run(
        [str(MPIEXEC), "--version"], capture_output=True, text=True, check=False
    ).stdout
    if "HYDRA" not in version.upper():
        return f"the harness needs MPICH's hydra launcher; {MPIEXEC} is another MPI's"
    probe = f"fourd-probe-{os.getpid()}"
    r = subprocess.run(["ip", "netns", "add", probe], capture_output=True, text=True, check=False)
    if r.returncode != 0:
        return f"'ip netns add' fails here: {r.stderr.strip()}"
    subprocess.run(["ip", "netns", "del", probe], capture_output=True, check=False)
    return None


def _leftovers(prefix: str) -> list[str]:
    """Everything of run `prefix` still present: namespaces, links (qdiscs live on links), hosts."""
    found = []
    netns = subprocess.run(
        ["ip", "netns", "list"], capture_output=True, text=True, check=False
    ).stdout
    found += [
        f"netns {line.split()[0]}" for line in netns.splitlines() if line.startswith(prefix + "-")
    ]
    links = subprocess.run(
        ["ip", "-o", "link", "show"], capture_output=True, text=True, check=False
    ).stdout
    found += [
        f"link {m}"
        for m in re.findall(rf"^\d+: ({re.escape(prefix)}-[^:@\s]+)", links, re.MULTILINE)
    ]
    qdiscs = subprocess.run(
        ["tc", "qdisc", "show"], capture_output=True, text=True, check=False
    ).stdout
    found += [f"qdisc {m}" for m in re.findall(rf"dev ({re.escape(prefix)}-\S+)", qdiscs)]
    hosts = Path("/etc/hosts").read_text()
    found += [
        f"hosts: {line}" for line in hosts.splitlines() if line.endswith(f"fourd-cluster {prefix}")
    ]
    return found


@pytest.mark.parametrize(
    "args, message",
    [
        (["--nodes", "0"], "--nodes"),
        (["--ranks-per-node", "many"], "--ranks-per-node"),
        (["--rate", "fast"], "--rate"),
        (["--transport", "carrier-pigeon"], "--transport"),
        (["--no-such-option"], "unknown argument"),
    ],
)
def test_bad_argument_is_rejected(args: list[str], message: str) -> None:
    # Arguments are checked before anything else (root, tools), so this runs on any machine.
    r = _run(["bash", str(HARNESS), *args], timeout=30)
    assert r.returncode == 2, r.stdout
    assert "error" in r.stdout and message in r.stdout, r.stdout


def test_two_node_cluster_selfcheck() -> None:
    reason = _cluster_unavailable()
    if reason is not None:
        print(f"skipping the emulated cluster test: {reason}")
        pytest.skip(reason)

    # 8 Gbit/s: fast enough to keep the test short, slow enough that tbf does the shaping.
    harness = ["--nodes", "2", "--ranks-per-node", "2", "--rate", "8gbit"]
    harness += ["--timeout", "60", "--min-traffic", "4m"]
    job = [sys.executable, "-m", "mpi4py", str(SELFCHECK), "--mib", "4", "--iters", "3"]
    job += ["--expect-nodes", "2"]
    cmd = ["bash", str(HARNESS), *harness, "--python", sys.executable, "--", *job]
    r = _run(cmd, timeout=TIMEOUT_S)
    out = r.stdout
    prefix_match = re.search(r"\[cluster\] run (fdc\d+):", out)
    assert prefix_match, out
    prefix = prefix_match.group(1)
    assert r.returncode == 0, out
    assert "SELFCHECK OK" in out, out

    # Exactly two host names: ranks 0 and 1 on one node, ranks 2 and 3 on the other.
    hosts = dict(re.findall(r"^rank (\d+) host (\S+) ", out, re.MULTILINE))
    assert sorted(hosts) == ["0", "1", "2", "3"], out
    assert len(set(hosts.values())) == 2, hosts
    assert hosts["0"] == hosts["1"] != hosts["2"] == hosts["3"], hosts

    # The tc counters must show the Allreduce crossing the links: with 2 nodes each node sends
    # at least n bytes per Allreduce of n bytes (4 runs of 4 MiB: 1 warm-up + 3 timed).
    traffic = re.search(r"^cluster-traffic .*node_to_node_bytes=(\d+)", out, re.MULTILINE)
    assert traffic, out
    assert int(traffic.group(1)) >= 2 * 4 * 4 * 2**20, out
    # tbf's 50 ms queue is deep enough that the links drop nothing (a drop costs TCP a
    # retransmission, a timeout of 200 ms or more at worst).
    drops = re.search(r"^cluster-traffic .* dropped_packets=(\d+) ", out, re.MULTILINE)
    assert drops and int(drops.group(1)) == 0, out
    assert re.search(rf"\[cluster\]\s+{prefix}-node0\s+\S+ [kMG]?B", out), out

    # Torn down completely.
    assert "teardown: " + prefix + " removed" in out, out
    assert _leftovers(prefix) == [], out


def test_ranks_of_emulated_nodes_on_one_machine_share_its_cores(monkeypatch) -> None:
    """The emulated nodes are network namespaces of one kernel: their ranks share the
    machine's cores, so fourd must count them together when it decides how waits poll. Counted
    per MPI shared-memory domain (2 ranks per "node" on this 2-core machine) the progress
    threads of all 4 ranks spun and yielded against the training step's compute, and some DDP
    steps took 2-4 s (bench/README.md, the cluster's DDP step)."""
    reason = _cluster_unavailable()
    if reason is not None:
        print(f"skipping the emulated cluster test: {reason}")
        pytest.skip(reason)
    script = (
        "import sys, fourd\n"
        "g = fourd.init()\n"
        "c, n = g.core_share, g.topology('world')['num_nodes']\n"
        'sys.stdout.write(f\'rank {g.world_rank} share {c["ranks"]} {c["cores"]} \'\n'
        "                 f'{int(c[\"oversubscribed\"])} nodes {n}\\n')\n"
        "sys.stdout.flush()\n"
        "fourd.finalize()\n"
    )
    harness = ["--nodes", "2", "--ranks-per-node", "2", "--rate", "8gbit", "--timeout", "60"]
    job = [sys.executable, "-m", "mpi4py", "-c", script]
    cmd = ["bash", str(HARNESS), *harness, "--python", sys.executable, "--", *job]
    monkeypatch.setenv("FOURD_CALIBRATE", "0")  # the harness passes FOURD_* to the ranks
    r = _run(cmd, timeout=TIMEOUT_S)
    assert r.returncode == 0, r.stdout
    rows = re.findall(r"rank (\d) share (\d+) (\d+) ([01]) nodes (\d+)", r.stdout)
    assert sorted(int(x[0]) for x in rows) == [0, 1, 2, 3], r.stdout
    cores = len(os.sched_getaffinity(0))
    for _, ranks, their_cores, over, nodes in rows:
        assert int(nodes) == 2, r.stdout  # two nodes to MPI and fourd's topology ...
        assert int(ranks) == 4 and int(their_cores) == cores, r.stdout  # ... one machine's cores
        assert int(over) == int(4 > cores), r.stdout

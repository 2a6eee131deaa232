"""The set-up of a run of ``python -m fourd.bench`` (collective over the world): the grid, the
bandwidths of the bound, how every measured axis sits on the nodes, and the implementations
to time (fourd per algorithm, and the baselines that started on every rank).

Every step that can fail on one rank only (importing torch, starting torch.distributed) is
agreed on by an allgather, so the ranks leave it together and take the same path.
"""

from __future__ import annotations

import os
import statistics
import sys
import time
from dataclasses import dataclass, field

from . import bounds, progress
from .collectives import TABLE
from .printer import Printer
from .progress import Progress

PROG = "python -m fourd.bench"
# The baselines that run on torch.distributed, and the backend each one names.
TORCH_BACKENDS = {"torch": "gloo", "torch-fourd": "fourd"}
TORCH_BASELINES = tuple(TORCH_BACKENDS)


@dataclass
class Session:
    """What the stages after the command line share (cli.py)."""

    cfg: object  # options.Config
    world: object  # MPI.COMM_WORLD
    hosts: list  # host name of every rank
    argv: list
    start_time: str  # UTC, ISO
    t_start: float  # time.perf_counter() at start
    progress: Progress
    printer: Printer
    grid: object = None  # fourd.Grid
    notes: list = field(default_factory=list)
    torch_errs: list = field(default_factory=list)  # why torch is not importable, per rank
    intra_bps: float = 0.0  # Bi: the median over ranks of bw_all
    bw_all: list = field(default_factory=list)  # every rank's copy bandwidth
    copy_bytes: int = 0  # the array size of that measurement
    link_bps: float | None = None  # Be
    latency_s: float | None = None  # one-way latency of an 8-byte message (the plot's floor)
    latency_pair: tuple = ()  # the two world ranks it was measured between
    setup_s: float = 0.0  # seconds from the start to the end of the set-up
    load_start: list | None = None  # the load average before the set-up (load_average)
    placement: list = field(default_factory=list)  # Grid.placement()
    axis_info: dict = field(default_factory=dict)  # axis mask -> topology and bound model
    topo_doc: dict = field(default_factory=dict)  # axis name -> the JSON "topology" entry
    impls: list = field(default_factory=list)  # FourdImpl per algorithm, "auto" first
    baselines: list = field(default_factory=list)  # MpiImpl / TorchImpl / TorchFourdImpl
    base_doc: dict = field(default_factory=dict)  # the JSON "baselines" section
    cleanup: list = field(default_factory=list)  # called at exit

    @property
    def rank(self) -> int:
        return self.world.Get_rank()

    @property
    def nranks(self) -> int:
        return self.world.Get_size()


def start(cfg, world, hosts, argv, start_time, t_start) -> Session | int:
    """Builds the grid and everything the sweep measures on; an exit status instead when the
    grid cannot be built (every rank gets the same error from fourd.init)."""
    import fourd

    rank = world.Get_rank()
    progress = Progress(*progress_mode(cfg, rank))
    s = Session(
        cfg,
        world,
        hosts,
        argv,
        start_time,
        t_start,
        progress,
        Printer(rank == 0, cfg.quiet, progress),
        load_start=load_average(),
    )
    try:
        s.grid = fourd.init(**cfg.grid, order=cfg.order, ranks_per_node=cfg.ranks_per_node)
    except fourd.Error as e:  # raised on every rank (fourd.init checks that ranks agree)
        if rank == 0:
            print(f"{PROG}: error: could not build the grid: {e}", file=sys.stderr, flush=True)
        return 2
    s.notes = list(cfg.notes)
    _import_torch(s)
    _measure_bandwidths(s)
    s.placement = s.grid.placement()
    for axis in cfg.axes:
        s.axis_info[axis.mask], s.topo_doc[axis.name] = _axis_topology(s, axis)
    _start_implementations(s)
    s.setup_s = time.perf_counter() - t_start
    return s


def load_average() -> list | None:
    """The load average (1, 5, 15 minutes), where the system has one."""
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except OSError:
        return None


def progress_mode(cfg, rank: int) -> tuple:
    """(mode, stream) of the progress (progress.choose); off where /proc cannot be read."""
    try:
        return progress.choose(cfg, rank)
    except Exception:  # noqa: BLE001 - the progress is a convenience: never fail a run on it
        return "off", None


def _import_torch(s: Session) -> None:
    """torch, for the torch baselines only; every rank or none (s.torch_errs says why not)."""
    want_torch = any(n in TORCH_BASELINES for n in s.cfg.baselines)
    torch_err = None
    if want_torch:
        # c10d's C++ warnings (such as reverse DNS of peers in network namespaces) are noise
        # here.
        os.environ.setdefault("TORCH_CPP_LOG_LEVEL", "ERROR")
        try:
            import torch  # noqa: F401
        except Exception as e:  # noqa: BLE001
            torch_err = f"{type(e).__name__}: {e}"
    s.torch_errs = [e for e in s.world.allgather(torch_err) if e]
    if want_torch and s.torch_errs:
        sys.modules.pop("torch", None)
        s.notes.append(
            f"torch baseline: torch is not importable ({s.torch_errs[0]}); no torch rows"
        )


def _measure_bandwidths(s: Session) -> None:
    """Bi, every rank copying at once; Be from the command line; the latency of a small
    message between rank 0 and its nearest rank (the plot's latency floor)."""
    me = s.world.Get_rank()
    on_host = sum(1 for h in s.hosts if h == s.hosts[me])
    # One array size on every rank (the smallest any host allows), so all copy for as long.
    nbytes = min(s.world.allgather(bounds.copy_bytes(on_host)))
    s.copy_bytes = nbytes
    bw_local = bounds.memcpy_bandwidth(nbytes, comm=s.world)
    s.bw_all = s.world.allgather(bw_local)
    s.intra_bps = statistics.median(s.bw_all)
    s.link_bps = s.cfg.link_rate
    same_host = [r for r in range(1, s.nranks) if s.hosts[r] == s.hosts[0]]
    partner = same_host[0] if same_host else 1
    s.latency_pair = (0, partner)
    s.latency_s = s.world.bcast(bounds.pingpong_latency(s.world, 0, partner), root=0)


def _bound_model(s: Session, axis, nodes: int, k: int, one_host: bool) -> tuple:
    """(bound nodes, bound k, the header's text, the model's name) of an axis' groups."""
    p = axis.group_size
    if s.link_bps is None and one_host and nodes > 1:
        return (
            1,
            p,
            f"all on one host, so virtual nodes share memory: c(p-1)/p S/Bi with p={p}",
            "one host",
        )
    if nodes > 1 and s.link_bps is None:
        return (
            nodes,
            k,
            f"c(k-1)/k S/Bi with k={k} only (link rate unknown: pass --link-rate)",
            "intra only",
        )
    if nodes > 1:
        text = (
            f"max(c(N-1)/N S/Be, c(k-1)/k S/Bi) with N={nodes}, k={k}"
            if k > 1
            else f"c(N-1)/N S/Be with N={nodes}"
        )
        return nodes, k, text, "hierarchical"
    return nodes, k, f"c(k-1)/k S/Bi with k={k}", "one node"


def _axis_topology(s: Session, axis) -> tuple[dict, dict]:
    """(the sweep's info on the axis, its JSON "topology" entry). Collective (allgather)."""
    topo = s.grid.topology(axis.name)
    mine = s.grid.ranks(axis.name)
    all_groups = sorted(set(s.world.allgather(tuple(mine))))
    nodes = int(topo.get("num_nodes", 1))
    rpn = topo.get("ranks_per_node") or [axis.group_size]
    k = int(topo.get("k") or max(rpn))
    p = axis.group_size
    one_host = len({s.placement[r]["host"] for r in mine}) == 1
    bn, bk, btext, model = _bound_model(s, axis, nodes, k, one_host)
    info = {
        "nodes": nodes,
        "k": k,
        "groups": s.nranks // p,
        "description": topo.get("description", f"{nodes} nodes"),
        "bound_nodes": bn,
        "bound_k": bk,
        "bound_text": btext,
        "bound_model": model,
    }
    doc = {
        "mask": axis.mask,
        "group_size": p,
        "groups": s.nranks // p,
        "nodes": nodes,
        "ranks_per_node": k,
        "ranks_per_node_list": list(rpn),
        "uniform": bool(topo.get("uniform", True)),
        "description": info["description"],
        "group_ranks": [list(g) for g in all_groups],
        "bound_model": model,
        "bound_nodes": bn,
        "bound_k": bk,
    }
    return info, doc


def _start_implementations(s: Session) -> None:
    """fourd per algorithm, then the baselines in the order asked for (the torch ones, gloo
    and fourd's backend, start together, at the first of them)."""
    from .libraries import FourdImpl

    s.impls = [FourdImpl(s.grid, a, s.cfg.timeout) for a in s.cfg.algorithms]
    torch_started = False
    for name in s.cfg.baselines:
        if name == "mpi":
            _start_mpi(s)
        elif name in TORCH_BASELINES and not torch_started:
            torch_started = True
            _start_torch(s)


def _start_mpi(s: Session) -> None:
    from mpi4py import MPI

    from .libraries import MpiImpl

    m = MpiImpl(s.grid)
    m.setup(s.cfg.axes)
    s.baselines.append(m)
    s.cleanup.append(m.free)
    s.base_doc["mpi"] = {
        "available": True,
        "library": " ".join(MPI.Get_library_version().splitlines()[0].split()),
        "how": f"{' / '.join(c.mpi_name for c in TABLE.values())} through mpi4py on "
        "MPI_Comm_split of the grid's communicator, same ranks in fourd's group order",
    }


def _start_torch(s: Session) -> None:
    """torch.distributed on gloo (torch) and on fourd's backend (torch-fourd), those asked for,
    on every rank or on none (agreed by an allgather)."""
    from .libraries import quiet_torch_warnings

    names = [n for n in s.cfg.baselines if n in TORCH_BASELINES]
    if s.torch_errs:
        for name in names:
            s.base_doc[name] = {"available": False, "reason": s.torch_errs[0]}
        return
    quiet_torch_warnings()
    if "torch-fourd" in names and not _fourd_backend_imports(s):
        names.remove("torch-fourd")
    if names:
        _start_torch_session(s, names)


def _start_torch_session(s: Session, names: list) -> None:
    """The torch session of the baselines `names`; a note when it did not start."""
    from .libraries import TorchFourdImpl, TorchImpl, TorchSession

    session = terr = None
    impls = []
    try:
        session = TorchSession(s.grid, timeout_s=max(60.0, s.cfg.timeout or 0.0))
        impls = [TorchImpl(session) if n == "torch" else TorchFourdImpl(session) for n in names]
        session.setup(s.world, s.hosts, s.cfg.axes, impls)
    except Exception as e:  # noqa: BLE001 - agreed on below
        terr = f"{type(e).__name__}: {e}"
    terrs = [e for e in s.world.allgather(terr) if e]
    if terrs:
        backends = ", ".join(TORCH_BACKENDS[n] for n in names)
        s.notes.append(f"torch baseline: torch.distributed ({backends}) did not start: {terrs[0]}")
        if session is not None:
            session.close()
        for name in names:
            s.base_doc[name] = {"available": False, "reason": terrs[0]}
        return
    s.baselines.extend(impls)
    s.cleanup.append(session.close)
    for impl in impls:
        s.base_doc[impl.library] = impl.doc()


def _fourd_backend_imports(s: Session) -> bool:
    """Whether fourd.distributed (the backend "fourd") imports on every rank (agreed by an
    allgather); a note and the JSON say why not."""
    err = None
    try:
        import fourd.distributed  # noqa: F401 - registers the backend
    except Exception as e:  # noqa: BLE001 - agreed on below
        err = f"{type(e).__name__}: {e}"
    errs = [e for e in s.world.allgather(err) if e]
    if errs:
        s.notes.append(f"torch-fourd baseline: fourd.distributed did not import: {errs[0]}")
        s.base_doc["torch-fourd"] = {"available": False, "reason": errs[0]}
    return not errs

"""What happens at ``fourd.init()``, and the one public calibration, ``fourd.calibrate()``.

``fourd.init()`` ends with :func:`apply` (registered in ``fourd/__init__.py`` as an init hook
of grid.py, which imports nothing of this package), which gives the grid's native cost model
(``MachineProfile``, the alpha-beta-gamma model of cpp/src/cost_model.cpp) figures of the
machine it runs on, identical on every rank (rank 0 decides and broadcasts):

1. ``FOURD_PROFILE=<file.json>``: load that profile (a calibration file, or a planner file
   written by ``fourd.calibrate()`` / ``python -m fourd.plan --calibrate``), no measurement.
2. ``FOURD_CALIBRATE=0`` (or false/no/off): keep the built-in defaults.
3. Otherwise the cached profile of this machine and layout (store.cache_path), or, when there
   is none, it was written by another store.VERSION, or ``FOURD_CALIBRATE=force``, a short
   measurement (measure.measure: 3-10 seconds on a 2-core machine with 2-8 ranks) saved there
   for next time. Whatever the file says, ranks_per_node is this grid's.

:func:`calibrate` (``fourd.calibrate``, and ``python -m fourd.plan --calibrate``) measures
the planner's profile of this machine on a grid of its own (x = ranks per node, y = nodes:
measure.collective_timer and measure.measure_node, fitted by fit.fit_profile) and saves it as
a planner file. The two profiles come from one set of measuring functions (measure.py) and
one set of fits (fit.py); they differ in what they are for: the init profile prices the
algorithms of this grid's own layout, measured corrections included; the planner's is a
least-squares fit over a sweep of sizes, with notes, for configurations of any size.
"""

from __future__ import annotations

import os
import socket
import time

from mpi4py import MPI

from ..errors import InvalidArgumentError
from ..grid import init
from .fields import FIELDS, Profile, to_native
from .fit import fit_profile
from .measure import collective_timer, measure, measure_node
from .store import VERSION, cache_path, load, save, save_profile

_memo: dict = {}  # path -> profile dict (rank 0 only), so repeated init() reads a file once


def _off(v: str) -> bool:
    return v.strip().lower() in ("0", "false", "no", "off")


def _decide(grid):
    """Rank 0: ("profile", dict, source) | ("defaults", None, why) | ("measure", None, path)
    | ("error", message, None)."""
    path = os.environ.get("FOURD_PROFILE", "").strip()
    if path:
        try:
            return ("profile", load(path), path)
        except InvalidArgumentError as e:
            return ("error", str(e), None)
    flag = os.environ.get("FOURD_CALIBRATE", "").strip()
    if _off(flag):
        return ("defaults", None, "FOURD_CALIBRATE=0")
    if grid.world_size < 2:
        return ("defaults", None, "one rank")
    cache = cache_path(grid)
    if flag.lower() != "force":
        if cache in _memo:
            return ("profile", _memo[cache], cache)
        if os.path.exists(cache):
            try:
                d = load(cache, version=VERSION)
                _memo[cache] = d
                return ("profile", d, cache)
            except InvalidArgumentError:
                pass  # unreadable or outdated cache: measure again and overwrite it
    return ("measure", None, cache)


def _measure_and_save(grid, path: str) -> dict:
    """Measures the grid's profile (collective) and, on rank 0, caches it at `path`."""
    payload = measure(grid)
    if grid.mpi_comm.Get_rank() == 0:
        _memo[path] = {k: v for k, v in payload.items() if k in FIELDS}
        try:
            save(
                _memo[path],
                path,
                {
                    "version": VERSION,
                    "host": socket.gethostname(),
                    "world_size": grid.world_size,
                    "nodes": grid.num_nodes,
                    "virtual_topology": grid.virtual_topology,
                    "seconds": payload.get("calibration_seconds"),
                    "measured_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
                },
            )
        except OSError:
            pass  # a read-only home: the profile still applies to this run
    return payload


def apply(grid) -> dict:
    """Gives `grid` its machine profile (see the module docstring). Collective: every rank of
    the grid calls it (fourd.init does). Returns {"source": ..., "profile": dict}."""
    comm = grid.mpi_comm
    kind, payload, source = comm.bcast(_decide(grid) if comm.Get_rank() == 0 else None, root=0)
    if kind == "error":
        raise InvalidArgumentError(payload)
    if kind == "defaults":
        return {"source": f"defaults ({source})", "profile": grid.profile.to_dict()}
    if kind == "measure":
        payload = _measure_and_save(grid, source)
    d = {k: v for k, v in payload.items() if k in FIELDS}
    # The node layout is this grid's, whatever the file says.
    nodes = [grid.node_of(r) for r in range(grid.world_size)]
    d["ranks_per_node"] = max(nodes.count(k) for k in set(nodes))
    grid.set_profile(to_native(d, grid.profile))
    return {
        "source": source if kind == "profile" else f"measured, saved to {source}",
        "profile": grid.profile.to_dict(),
    }


def _ranks_per_node(comm, ranks_per_node: int | None) -> int:
    """The calibration grid's ranks per node: the argument, else FOURD_RANKS_PER_NODE, else
    the ranks sharing this host's memory. Raises ValueError unless it divides the ranks."""
    world = comm.Get_size()
    if ranks_per_node is None:
        env = os.environ.get("FOURD_RANKS_PER_NODE", "").strip()
        if env:
            ranks_per_node = int(env)
        else:
            shared = comm.Split_type(MPI.COMM_TYPE_SHARED)
            ranks_per_node = shared.Get_size()
            shared.Free()
    if ranks_per_node < 1 or world % ranks_per_node:
        raise ValueError(
            f"ranks_per_node: expected a divisor of the {world} ranks; found {ranks_per_node}"
        )
    return ranks_per_node


def calibrate(
    ranks_per_node: int | None = None,
    out: str | None = None,
    name: str = "calibrated",
    base: Profile | None = None,
) -> Profile:
    """Measure this machine's profile with fourd's own collectives (collective: every rank
    of MPI.COMM_WORLD calls it) on the grid x = `ranks_per_node`, y = nodes, which becomes the
    current grid. Saves JSON to `out` on rank 0 (default ./fourd-profile.json) and returns the
    Profile on every rank. Figures that cannot be measured here (no second node) are kept
    from `base`. Load the file with ``fourd.plan.load_profile`` or ``FOURD_PROFILE``."""
    comm = MPI.COMM_WORLD
    world = comm.Get_size()
    if world < 2:
        raise ValueError(
            "calibrate: needs at least 2 ranks (found 1); run it under "
            "mpiexec -n P with P >= 2, e.g. mpiexec -n 8 python -m mpi4py -m "
            "fourd.plan --calibrate --ranks-per-node 4"
        )
    ranks_per_node = _ranks_per_node(comm, ranks_per_node)
    nodes = world // ranks_per_node
    grid = init(
        x=ranks_per_node, y=nodes, z=1, data=1, order="x-y-z-data", ranks_per_node=ranks_per_node
    )
    timer = collective_timer(grid, comm)
    cache, local = measure_node(comm, ranks_per_node)
    prof = fit_profile(
        timer,
        ranks_per_node=ranks_per_node,
        nodes=nodes,
        base=base,
        name=name,
        local=local,
        cache=cache,
    )
    if comm.Get_rank() == 0:
        save_profile(prof, out or "fourd-profile.json")
    return prof

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

With a profile from 1 or 3, what tuning in use settled on in the last run of the same layout
and profile seeds the grid's communicators, and what this run settles on is saved at finalize
(tuning.py; not with the built-in defaults of 2).

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
import sys
import time
import warnings

from mpi4py import MPI

from ..errors import InvalidArgumentError
from ..grid import init
from .fields import FIELDS, Profile, to_native
from .fit import fit_profile
from .measure import collective_timer, measure, measure_node
from .store import VERSION, cache_path, load, save, save_profile
from .tuning import attach as attach_tuning

_memo: dict = {}  # path -> profile dict (rank 0 only), so repeated init() reads a file once


_CALIBRATE_VALUES = {
    "": "auto",
    "auto": "auto",
    "1": "auto",
    "on": "auto",
    "true": "auto",
    "yes": "auto",
    "force": "force",
    "0": "off",
    "off": "off",
    "false": "off",
    "no": "off",
}


def calibrate_mode() -> str:
    """FOURD_CALIBRATE as "auto" (use the cache, measure when there is none), "force" or
    "off"; InvalidArgumentError for any other value."""
    raw = os.environ.get("FOURD_CALIBRATE", "")
    mode = _CALIBRATE_VALUES.get(raw.strip().lower())
    if mode is None:
        raise InvalidArgumentError(
            f"FOURD_CALIBRATE: expected 1 (or unset: use the cache, measure without one), "
            f"force (measure again) or 0 (keep the built-in defaults); found {raw!r}"
        )
    return mode


def _cached(cache: str):
    """("profile", dict, cache) from a valid cache file, else None: missing, or written by
    another calibration version (measured again silently), or unreadable or invalid (measured
    again, with a warning naming the file)."""
    if cache in _memo:
        return ("profile", _memo[cache], cache)
    if not os.path.exists(cache):
        return None
    try:
        d = load(cache, version=VERSION)
    except InvalidArgumentError as e:
        if "another calibration version" not in str(e):
            warnings.warn(
                f"fourd: the cached profile {cache} is not valid ({e}); measuring again and "
                f"replacing it (FOURD_CALIBRATE=force does this on purpose)",
                RuntimeWarning,
                stacklevel=2,
            )
        return None
    _memo[cache] = d
    return ("profile", d, cache)


def _decide_here(grid):
    path = os.environ.get("FOURD_PROFILE", "").strip()
    if path:
        return ("profile", load(path), path)
    mode = calibrate_mode()
    if mode == "off":
        return ("defaults", None, "FOURD_CALIBRATE=0")
    if grid.world_size < 2:
        return ("defaults", None, "one rank")
    cache = cache_path(grid)
    return (_cached(cache) if mode == "auto" else None) or ("measure", None, cache)


def _decide(grid):
    """Rank 0: ("profile", dict, source) | ("defaults", None, why) | ("measure", None, path)
    | ("error", message, None). Never raises: whatever goes wrong here is broadcast as an
    error, so that no rank is left waiting for rank 0's decision."""
    try:
        return _decide_here(grid)
    except Exception as e:  # noqa: BLE001 - every failure must reach the other ranks
        return (
            "error",
            f"{type(e).__name__}: {e}" if not isinstance(e, InvalidArgumentError) else str(e),
            None,
        )


# The median spread of the calibration's repeated timings (interquartile range over median)
# above which the machine counts as busy: the profile serves this run and is not cached.
BUSY_SPREAD = 0.25


def _say(grid, msg: str) -> None:
    """A line on rank 0's stderr: the calibration says what it is doing."""
    if grid.mpi_comm.Get_rank() == 0:
        sys.stderr.write(f"fourd: {msg}\n")
        sys.stderr.flush()


def _measure_and_save(grid, path: str) -> tuple[dict, bool]:
    """Measures the grid's profile (collective) and, on rank 0, caches it at `path` unless the
    timings show a busy machine. Returns the payload and whether it counts as cached (the
    same on every rank: the spread is common)."""
    _say(
        grid,
        f"measuring this machine for algorithm='auto' ({grid.world_size} ranks, "
        f"{grid.num_nodes} node{'s' if grid.num_nodes > 1 else ''}): 5-60 s, once per "
        f"layout (FOURD_CALIBRATE=0 skips it, `python -m fourd calibrate` does it ahead)",
    )
    payload = measure(grid)
    spread = payload.get("calibration_spread", 0.0)
    load = payload.get("calibration_load", (0.0, 0.0))
    busy = spread > BUSY_SPREAD
    if grid.mpi_comm.Get_rank() == 0:
        _memo[path] = {k: v for k, v in payload.items() if k in FIELDS}
        meta = {
            "version": VERSION,
            "host": socket.gethostname(),
            "world_size": grid.world_size,
            "nodes": grid.num_nodes,
            "virtual_topology": grid.virtual_topology,
            "seconds": payload.get("calibration_seconds"),
            "spread": spread,
            "load_1min": list(load),
            "cores": os.cpu_count(),
            "measured_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        }
        if busy:
            _memo.pop(path, None)  # measured again by the next init
            warnings.warn(
                f"fourd: the calibration's repeated timings spread by {100 * spread:.0f}% "
                f"(median; a quiet machine stays under {100 * BUSY_SPREAD:.0f}%; load "
                f"{load[0]:.1f} before, {load[1]:.1f} after, {os.cpu_count()} cores): the "
                f"machine looks busy. This profile serves this run only and is not cached; "
                f"measure on a quiet machine with `python -m fourd calibrate`",
                RuntimeWarning,
                stacklevel=2,
            )
        else:
            _save_cache(path, _memo[path], meta)
    _say(
        grid,
        f"measured in {payload.get('calibration_seconds', 0.0):.1f} s "
        f"(spread {100 * spread:.0f}%)"
        + ("; not cached (busy)" if busy else f"; cached at {path}"),
    )
    return payload, not busy


def _save_cache(path: str, fields: dict, meta: dict) -> None:
    try:
        save(fields, path, meta)
    except OSError as e:  # a read-only home, a directory in the way
        warnings.warn(
            f"fourd: cannot cache the measured profile at {path} ({e}); it applies to this "
            f"run only, and the next init of this layout measures again",
            RuntimeWarning,
            stacklevel=3,
        )


def apply(grid) -> dict:
    """Gives `grid` its machine profile (see the module docstring). Collective: every rank of
    the grid calls it (fourd.init does). Returns {"source": ..., "profile": dict}."""
    comm = grid.mpi_comm
    kind, payload, source = comm.bcast(_decide(grid) if comm.Get_rank() == 0 else None, root=0)
    if kind == "error":
        raise InvalidArgumentError(payload)
    if kind == "defaults":
        return {"source": f"defaults ({source})", "profile": grid.profile.to_dict()}
    cached = True
    if kind == "measure":
        payload, cached = _measure_and_save(grid, source)
    d = {k: v for k, v in payload.items() if k in FIELDS}
    # The node layout is this grid's, whatever the file says.
    nodes = [grid.node_of(r) for r in range(grid.world_size)]
    d["ranks_per_node"] = max(nodes.count(k) for k in set(nodes))
    grid.set_profile(to_native(d, grid.profile))
    # What tuning in use settled on in the last run of this layout and profile (tuning.py).
    attach_tuning(grid, cache_path(grid))
    return {
        "source": source
        if kind == "profile"
        else (f"measured, saved to {source}" if cached else "measured, not cached (busy)"),
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

"""Saved choices of tuning in use: what `auto` settled on in one run, kept beside the machine
profile, so that the next run of the same layout starts settled (docs/algorithms.md, "Tuning
in use").

The file is the profile cache's path (store.cache_path) with ``-tuning.json`` for ``.json``::

    {"fourd_tuning": {"version": VERSION, "profile": "<digest of the profile's fields>"},
     "groups": {"<mask>:<size>:<nodes>x<ranks per node>": [CALL, ...]}}

where a CALL is ``[collective, nbytes, dtype, algorithm]`` for a final choice, or
``[collective, nbytes, dtype, algorithm, calls, [candidates], [seconds], gap]`` for a
provisional switch (one not yet re-checked): the calls it has run since its exploration, the
shortlist, the exploration's common figures (one per candidate, or two, out of place then in
place, where it timed both) and the calls it runs before its re-check (decided with the switch
from the key's call period; a CALL of 7 items, without it, gets the default gap). A key whose
calls agree on their placement (docs/algorithms.md, "Placement") adds its in-place algorithm
as a last item: 5 items final, 9 provisional. The next run runs a switch at once and re-checks
it when its calls, counted over the runs, reach the gap, so a run shorter than the gap still
starts settled, and a switch is still confirmed once before it is final.

- ``fourd.init()`` (policy.apply, after the profile is set): rank 0 reads the file and
  broadcasts it; every communicator of the grid, made then or later, is seeded with the
  choices saved for a group of its mask and shape (Communicator.seed_tuning takes a choice only
  where it is one of the call's candidates). Every rank gets the same list, so every group
  agrees. A file written under another profile (a new calibration, another FOURD_PROFILE)
  counts as empty and is overwritten.
- ``Grid.finalize()`` (also at interpreter exit): rank 0 merges the final choices of its own
  communicators into the file (atomically) when they add or change something. The choices of
  a group rank 0 is not in are not saved: the next run gives every group of that mask and
  shape the choices of rank 0's.

``FOURD_TUNE_CACHE=0`` neither reads nor writes the file (the test suite's default, so that
no test depends on what an earlier one saved). With FOURD_TUNE=0 the communicators take no
seed and have nothing to save.
"""

from __future__ import annotations

import hashlib
import json
import os
import warnings

from ..errors import InvalidArgumentError
from .store import write_json

# The file's format and the code whose speed its choices reflect: raised when a change to the
# algorithms can change what tuning should settle on, so that choices saved by earlier code are
# not carried over (a file of another version counts as empty and is overwritten). 2: flat's
# small calls through persistent MPI requests, in-place reduce_scatter without a copy. 3: shm's
# out-of-place all_gather reading the peers' inputs. 4: shm's copies without glibc's rep movsb,
# its large out-of-place all_gather through the window with streamed stores. 5: shm's in-place
# all_gather reading the peers directly; tuning's figures from each timed call's slowest rank.
# 6: explorations time both placements; a key may run another algorithm when all are in place.
VERSION = 6

_OFF = ("0", "off", "false", "no")
_ON = ("", "1", "on", "true", "yes")


def enabled() -> bool:
    """FOURD_TUNE_CACHE (default on). With FOURD_TUNE=0 the communicators have no choice to
    save and take no seed (Communicator.tuned_calls, seed_tuning)."""
    raw = os.environ.get("FOURD_TUNE_CACHE", "")
    v = raw.strip().lower()
    if v not in _OFF + _ON:
        raise InvalidArgumentError(f"FOURD_TUNE_CACHE: expected 1 (or unset) or 0; found {raw!r}")
    return v not in _OFF


def path_for(profile_cache: str) -> str:
    base = profile_cache[: -len(".json")] if profile_cache.endswith(".json") else profile_cache
    return base + "-tuning.json"


def digest(profile: dict) -> str:
    """What ties a saved choice to the profile that priced its shortlist."""
    text = json.dumps(profile, sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:20]


def group_key(comm) -> str:
    """A group's mask and shape: the groups of one mask and shape share saved choices."""
    t = comm.topology
    return f"{comm.mask}:{comm.size}:{t['num_nodes']}x{t['k']}"


def read(path: str, profile_digest: str) -> dict:
    """The saved groups of `path` ({group key: [[collective, nbytes, dtype, algorithm]]}), or
    {} when the file is missing, unreadable or written under another profile."""
    try:
        with open(path, encoding="utf-8") as f:
            doc = json.load(f)
    except FileNotFoundError:
        return {}
    except (OSError, ValueError, RecursionError) as e:
        warnings.warn(
            f"fourd: ignoring the saved tuning {path} ({type(e).__name__}: {e})", stacklevel=2
        )
        return {}
    meta = doc.get("fourd_tuning") if isinstance(doc, dict) else None
    if not isinstance(meta, dict) or meta.get("version") != VERSION:
        return {}
    if meta.get("profile") != profile_digest:
        return {}
    groups = doc.get("groups")
    if not isinstance(groups, dict):
        return {}
    out = {}
    for key, calls in groups.items():
        if isinstance(calls, list):
            out[str(key)] = [c for c in (_call(c) for c in calls) if c is not None]
    return out


def _call(c) -> tuple | None:
    """One saved call as seed_tuning takes it, or None for an entry this version cannot read
    (the same file on every rank, so every rank skips it)."""
    if not isinstance(c, list) or len(c) not in (4, 5, 7, 8, 9):
        return None
    if not isinstance(c[1], int) or isinstance(c[1], bool) or c[1] <= 0:
        return None
    if len(c) in (5, 9) and not isinstance(c[-1], str):  # the in-place algorithm's name
        return None
    head = (str(c[0]), int(c[1]), str(c[2]), str(c[3]))
    if len(c) in (4, 5):
        return head + tuple(str(a) for a in c[4:])
    calls, cands, seconds = c[4:7]
    gap = c[7] if len(c) >= 8 else 0
    tail = (str(c[8]),) if len(c) == 9 else ()
    for v in (calls, gap):
        if not isinstance(v, int) or isinstance(v, bool) or not 0 <= v < 2**31:
            return None
    if not isinstance(cands, list) or not isinstance(seconds, list):
        return None
    if not all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in seconds):
        return None
    return (*head, calls, [str(a) for a in cands], [float(v) for v in seconds], gap, *tail)


class SavedTuning:
    """The saved choices of one grid: seeds its communicators and saves theirs (grid.py calls
    seed() for every communicator it makes and save(grid) when it is finalized)."""

    def __init__(self, path: str, profile_digest: str, groups: dict, writer: bool):
        self.path = path
        self.digest = profile_digest
        self.groups = groups  # group key -> [CALL as a tuple]
        self.writer = writer  # rank 0 of the grid

    def seed(self, comm) -> int:
        calls = self.groups.get(group_key(comm))
        if not calls:
            return 0
        try:
            return comm.seed_tuning(calls)
        except (InvalidArgumentError, ValueError, TypeError) as e:
            # A name this build does not know: the same on every rank, so every rank skips it.
            warnings.warn(f"fourd: ignoring the saved tuning {self.path} ({e})", stacklevel=2)
            return 0

    def save(self, grid) -> bool:
        """Rank 0: merges the final choices of the grid's communicators into the file, unless
        the grid's profile is no longer the one read at init (Grid.set_profile since: its
        choices were priced by another). Never raises (a finalize at interpreter exit must
        not); returns whether the file was written."""
        if not self.writer:
            return False
        try:
            if digest(grid.profile.to_dict()) != self.digest:
                return False
            comms = list(grid._comms.values())
            merged = {k: {tuple(c[:3]): c for c in v} for k, v in self.groups.items()}
            changed = False
            for comm in comms:
                if comm.poisoned:
                    continue
                mine = merged.setdefault(group_key(comm), {})
                for c in comm.tuned_calls():
                    if mine.get(tuple(c[:3])) != tuple(c):
                        mine[tuple(c[:3])] = tuple(c)
                        changed = True
            if not changed:
                return False
            groups = {k: sorted(list(c) for c in v.values()) for k, v in merged.items() if v}
            write_json(
                self.path,
                {"fourd_tuning": {"version": VERSION, "profile": self.digest}, "groups": groups},
            )
            self.groups = {k: [tuple(c) for c in v] for k, v in groups.items()}
            return True
        except Exception as e:  # noqa: BLE001 - a cache that cannot be written costs a re-tune
            warnings.warn(
                f"fourd: cannot save the tuning in use to {self.path} ({e})", stacklevel=2
            )
            return False


def attach(grid, profile_cache: str) -> SavedTuning | None:
    """Collective over the grid (policy.apply): rank 0 reads the saved choices for the grid's
    current profile and broadcasts them; every rank seeds its communicators made so far and
    hands the grid the object that seeds later ones and saves at finalize."""
    comm = grid.mpi_comm

    def decide():
        try:
            return ("ok", enabled())
        except InvalidArgumentError as e:
            return ("error", str(e))

    kind, on = comm.bcast(decide() if comm.Get_rank() == 0 else None, root=0)
    if kind == "error":
        raise InvalidArgumentError(on)
    if not on:
        return None
    d = digest(grid.profile.to_dict())
    path = path_for(profile_cache)
    groups = comm.bcast(read(path, d) if comm.Get_rank() == 0 else None, root=0)
    saved = SavedTuning(path, d, groups, writer=comm.Get_rank() == 0)
    grid._attach_tuning(saved)
    return saved

"""Profile files: reading, writing (atomically), and where this machine's profile is cached.

Two JSON formats, both read by :func:`load` (fields only) and :func:`load_profile` (a
:class:`~fourd.profile.fields.Profile`):

- the calibration file that ``fourd.init()`` caches (:func:`save`):
  ``{"fourd_calibration": {"version": VERSION, ...}, "profile": {field: value, ...}}``, at
  ``$XDG_CACHE_HOME/fourd/profile-<host>-<nranks>-<nodes>n[-v<rpn>].json`` (``~/.cache`` when
  XDG_CACHE_HOME is unset; :func:`cache_path`). A cached file of another VERSION is measured
  again and overwritten (policy.py), so a change of the model or of the fits never reuses old
  figures;
- the planner's file that ``fourd.calibrate()`` writes (:func:`save_profile`): a flat dict of
  the Profile's fields and its ``notes``.

Files of either format written before a field existed still load: the missing field takes its
native default.
"""

from __future__ import annotations

import json
import os
import socket

from ..errors import InvalidArgumentError
from .fields import FIELDS, Profile

VERSION = 10  # bumped whenever the model or the fits change: older cache files are re-measured


def load(path: str, version: int | None = None) -> dict:
    """Reads a profile file: ``{"profile": {...}}`` as written by :func:`save`, or a flat dict of
    fields (the planner's format). With `version`, a file written by another calibration
    version is rejected too. Raises InvalidArgumentError naming the file."""
    try:
        with open(path, encoding="utf-8") as f:
            d = json.load(f)
    except (OSError, ValueError, RecursionError) as e:  # deep nesting: RecursionError
        raise InvalidArgumentError(
            f"cannot read profile file {path!r}: {type(e).__name__}: {str(e)[:200]}"
        ) from None
    if version is not None:
        meta = d.get("fourd_calibration") if isinstance(d, dict) else None
        if not isinstance(meta, dict) or meta.get("version") != version:
            raise InvalidArgumentError(f"{path!r}: written by another calibration version")
    if isinstance(d, dict) and isinstance(d.get("profile"), dict):
        d = d["profile"]
    if not isinstance(d, dict) or not any(k in d for k in FIELDS):
        raise InvalidArgumentError(
            f"{path!r} holds no profile fields; expected some of {', '.join(FIELDS)}"
        )
    fields = {k: v for k, v in d.items() if k in FIELDS}
    check(fields, path)
    return fields


def check(fields: dict, path: str) -> None:
    """Raises InvalidArgumentError naming `path` and the field when the values do not make a
    valid profile (a string where a number belongs, a negative or NaN bandwidth, zero
    chunks, a malformed correction)."""
    from .. import _C

    try:
        _C.MachineProfile(**fields).check()
    except (InvalidArgumentError, TypeError, ValueError, RecursionError) as e:
        raise InvalidArgumentError(f"{path!r}: {str(e)[:300]}") from None


def save(d: dict, path: str, meta: dict | None = None) -> None:
    """Writes a calibration file atomically (write_json)."""
    write_json(path, {"fourd_calibration": meta or {"version": VERSION}, "profile": d})


def write_json(path: str, doc: dict) -> None:
    """Writes `doc` as JSON atomically (a temporary file, then rename), so that ranks of
    another job reading the cache never see half a file."""
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    if os.path.isdir(path):
        raise IsADirectoryError(f"{path!r} is a directory")
    tmp = f"{path}.{os.getpid()}.tmp"
    # A new file of our own: never follow a link planted under the temporary name.
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            json.dump(doc, f, indent=2, sort_keys=True)
            f.write("\n")
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


def cache_path(grid) -> str:
    """Where this machine's profile for this grid's layout is cached."""
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    n = grid.world_size
    layout = f"{grid.num_nodes}n"
    if grid.virtual_topology:
        per = max(sum(1 for r in range(n) if grid.node_of(r) == k) for k in range(grid.num_nodes))
        layout += f"-v{per}"
    host = socket.gethostname().replace(os.sep, "_") or "host"
    return os.path.join(base, "fourd", f"profile-{host}-{n}-{layout}.json")


def load_profile(path: str) -> Profile:
    """Reads a planner profile saved by :func:`save_profile` (or a calibration file's
    fields)."""
    with open(path, encoding="utf-8") as f:
        d = json.load(f)
    if "profile" in d and isinstance(d["profile"], dict):
        d = d["profile"]
    return Profile.from_dict(d)


def save_profile(profile: Profile, path: str) -> None:
    """Writes a planner profile as a flat JSON dict of its fields and notes."""
    with open(path, "w", encoding="utf-8") as f:
        json.dump(profile.to_dict(), f, indent=2, sort_keys=True)
        f.write("\n")

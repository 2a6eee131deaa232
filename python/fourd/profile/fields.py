"""The profile's fields, as the native core defines them.

``fourd._C.MachineProfile.FIELDS`` names every field once (cost_model.hpp, profileFields) and
``fourd._C.MachineProfile()`` holds their defaults; nothing here repeats either. A profile
takes two forms:

- the native ``MachineProfile`` that a grid prices ``auto`` with (``Grid.profile``,
  ``Grid.set_profile``), and the plain dicts of its fields that profile files hold
  (:func:`to_native` turns one into the other, on top of a base profile);
- :class:`Profile`, the planner's record of the same fields with the same defaults, plus
  ``notes`` (field -> where its figure comes from): a dataclass built from the native list, so
  a field added in C++ appears here with its C++ default.
"""

from __future__ import annotations

import dataclasses

from .. import _C

#: Every MachineProfile field, in the native order.
FIELDS = tuple(_C.MachineProfile.FIELDS)


def to_native(d: dict, base):
    """A native ``MachineProfile``: `base` (a MachineProfile) with the fields of `d` applied,
    each converted to the type of the base's value (a JSON file may write 4.0 for an integer).
    Unknown keys (such as a planner file's ``notes``) are ignored."""
    merged = base.to_dict()
    for k, v in d.items():
        if k in merged:
            merged[k] = list(v) if isinstance(merged[k], list) else type(merged[k])(v)
    return _C.MachineProfile(**merged)


def _native(self):
    """The profile as a ``fourd._C.MachineProfile`` (what the C++ model takes)."""
    return _C.MachineProfile(**{k: getattr(self, k) for k in FIELDS})


def _node_injection_bw(self) -> float:
    return self.nic_bw * self.nics_per_node


def _to_dict(self) -> dict:
    """Every field and the notes. Measured corrections are left out while there are none
    (the planner's calibration writes none), so that planner files read as they always have."""
    d = dataclasses.asdict(self)
    if not d["corrections"]:
        del d["corrections"]
    return d


def _from_dict(cls, d: dict):
    known = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(d) - known)
    if unknown:
        raise ValueError(f"profile: unknown fields {unknown}; expected some of {sorted(known)}")
    return cls(**d)


def _replace(self, **changes):
    return dataclasses.replace(self, **changes)


def _profile_fields() -> list:
    """(name, type, dataclasses.field) of every native field with its native default, then
    ``notes``."""
    defaults = _C.MachineProfile().to_dict()
    out = []
    for name in FIELDS:
        value = defaults[name]
        if isinstance(value, list):  # the corrections: a fresh list per profile
            spec = dataclasses.field(default_factory=list)
        else:
            spec = dataclasses.field(default=value)
        out.append((name, type(value), spec))
    out.append(("notes", dict, dataclasses.field(default_factory=dict)))
    return out


Profile = dataclasses.make_dataclass(
    "Profile",
    _profile_fields(),
    namespace={
        "native": _native,
        "node_injection_bw": _node_injection_bw,
        "to_dict": _to_dict,
        "from_dict": classmethod(_from_dict),
        "replace": _replace,
    },
)
Profile.__module__ = __name__  # make_dataclass names its caller's module only from 3.12 on
Profile.__doc__ = """Costs of one machine for the planner and the collective model, in SI units
(seconds, bytes per second, FLOP/s, bytes). Bandwidths are achievable (not peak) figures.

The fields are ``fourd._C.MachineProfile.FIELDS`` with the native defaults (cost_model.hpp
documents each), plus ``notes``: field -> where the figure comes from. ``native()`` gives the
``MachineProfile``; ``replace(**changes)``, ``to_dict()`` and ``Profile.from_dict(d)`` as for a
dataclass (``from_dict`` refuses unknown keys)."""

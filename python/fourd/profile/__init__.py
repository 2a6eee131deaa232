"""fourd.profile: the machine profile behind ``algorithm="auto"`` and the planner.

One package above ``fourd.grid`` (grid.py imports nothing of it; ``fourd/__init__.py``
registers :func:`~fourd.profile.policy.apply` as an init hook):

- ``fields``: the profile's fields as the native core lists them (``fourd._C.MachineProfile``),
  dicts of fields <-> MachineProfile, and the planner's :class:`Profile` record;
- ``store``: profile files, the cache path, atomic saves;
- ``measure``: every timing (ping-pongs, kernels, the cache sweep, collectives, measured
  corrections), through the public API;
- ``fit``: pure functions from timings to figures;
- ``policy``: what ``fourd.init()`` does (``apply``) and ``fourd.calibrate()``.
"""

from .fields import FIELDS, Profile
from .policy import apply, calibrate

__all__ = ["FIELDS", "Profile", "apply", "calibrate"]

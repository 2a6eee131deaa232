"""fourd.plan: choose a 4D configuration (Gx, Gy, Gz, Gdata, order, algorithm per axis).

    from fourd import plan
    result = plan.search("gpt-20b", gpus=1024, machine="perlmutter")
    best = result.plans[0]
    print(plan.format_table(result))      # the ranking, why #1 wins, what that assumes
    grid = fourd.init(plan=best)          # under mpiexec

``python -m fourd.plan --model gpt-20b --gpus 1024 --machine perlmutter`` prints the ranking.
Collective times come from the C++ cost model (fourd._C), the one the ``auto`` algorithm uses.
See docs/planner.md.
"""

from ..profile.policy import calibrate  # fourd.calibrate, the one calibration
from .model import PRESETS, TransformerSpec, get_model
from .profiles import Profile, builtin_names, get_profile, load_profile, save_profile
from .search import Plan, SearchResult, assumptions, explain, format_table, search

__all__ = [
    "PRESETS",
    "Plan",
    "Profile",
    "SearchResult",
    "TransformerSpec",
    "assumptions",
    "builtin_names",
    "calibrate",
    "explain",
    "format_table",
    "get_model",
    "get_profile",
    "load_profile",
    "save_profile",
    "search",
]

"""Ranking the 4D configurations of a model on a machine.

Every (Gx, Gy, Gz, Gdata) whose product is the GPU count and every axis order that places the
groups differently is evaluated (fourd.plan.model.evaluate); configurations whose memory per
GPU does not fit, or whose batch or heads do not split, are excluded, and the rest are sorted by
predicted step time.

Beside the ranking, a SearchResult holds what explains it: the best flat-only configuration,
the best configuration of each structure the winner does not have (model.STRUCTURES), and
how the winner's step grows when its hidden traffic runs slower. report.py puts them in words.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field

from .model import (
    AXES,
    SLOWDOWN,
    STRUCTURES,
    CollectiveModel,
    Evaluation,
    batch_split,
    distinct_orders,
    divisor_grids,
    evaluate,
    fits,
    get_model,
    grid_placements,
    memory,
    messages,
)
from .profiles import get_profile
from .report import assumptions, explain, format_table

# format_table, explain and assumptions live in report.py and belong to this module's interface
# too (fourd.plan.search.explain).
__all__ = [
    "Alternative",
    "Plan",
    "SearchResult",
    "assumptions",
    "explain",
    "format_table",
    "search",
]


@dataclass
class Plan:
    """One ranked configuration. ``fourd.init(plan=plan)`` builds its grid."""

    x: int
    y: int
    z: int
    data: int
    order: str
    algorithms: dict  # axis -> "flat" | "ring" | "rhd" | "hierarchical" | "shm" | "auto" | "-"
    step_time: float
    compute_time: float
    comm_time: dict
    exposed_time: dict
    memory: dict
    baseline_step_time: float  # the same grid and order with the library's flat collectives
    baseline_exposed_time: dict
    model: str = ""
    machine: str = ""
    gpus: int = 0
    rank: int = 0
    micro_batch: int = 1
    accumulation: int = 1
    placements: dict = field(default_factory=dict)  # axis -> [size, nodes, ranks/node, uniform]

    def grid_kwargs(self) -> dict:
        """Arguments of fourd.init: {"x", "y", "z", "data", "order"}."""
        return {"x": self.x, "y": self.y, "z": self.z, "data": self.data, "order": self.order}

    @property
    def exposed_total(self) -> float:
        return sum(self.exposed_time.values())

    def to_dict(self) -> dict:
        return {k: getattr(self, k) for k in self.__dataclass_fields__}

    @classmethod
    def from_dict(cls, d: dict) -> Plan:
        return cls(**{k: v for k, v in d.items() if k in cls.__dataclass_fields__})

    def save(self, path: str) -> None:
        with open(path, "w", encoding="utf-8") as f:
            json.dump(self.to_dict(), f, indent=2)
            f.write("\n")

    @classmethod
    def load(cls, path: str) -> Plan:
        with open(path, encoding="utf-8") as f:
            d = json.load(f)
        if isinstance(d, dict) and "plans" in d:
            d = d["plans"][0]
        return cls.from_dict(d)

    def label(self) -> str:
        return f"Gx={self.x} Gy={self.y} Gz={self.z} Gdata={self.data} order={self.order}"


@dataclass
class Alternative:
    """The best configuration of a structure the best plan does not have (with tensor
    parallelism when the best has none, without z sharding when it shards, ...), or, when
    none of that structure fits, the grid of it that needs the least memory."""

    structure: str  # e.g. "with tensor parallelism on x/y (Gx Gy > 1)"
    plan: Plan | None  # its best configuration, None when none fits
    least_memory: float | None = None  # bytes per GPU of its leanest grid, when none fits
    least_memory_grid: str = ""

    def to_dict(self) -> dict:
        return {
            "structure": self.structure,
            "plan": self.plan.to_dict() if self.plan else None,
            "least_memory": self.least_memory,
            "least_memory_grid": self.least_memory_grid,
        }


@dataclass
class SearchResult:
    plans: list  # the top-k Plans, best first
    evaluated: int
    excluded_memory: int
    excluded_split: int
    seconds: float
    model: object
    profile: object
    gpus: int
    best_flat: Plan | None = None  # the best configuration with flat collectives only
    alternatives: dict = field(default_factory=dict)  # STRUCTURES key -> Alternative
    # axis -> {"hidden", "window", "slower_step"}: the best plan's traffic that hides under
    # compute, the compute it hides under, and the step time were that axis SLOWDOWN slower
    sensitivity: dict = field(default_factory=dict)
    overlap_data: bool = False
    # the grid that needs the least memory of those excluded for it: {"grid", "memory"}
    leanest: dict = field(default_factory=dict)

    def vs_best_flat(self, plan: Plan) -> float | None:
        """The best flat-only configuration's step time over `plan`'s (above 1: `plan` is
        faster)."""
        if self.best_flat is None:
            return None
        return self.best_flat.step_time / plan.step_time

    def to_dict(self) -> dict:
        spec = self.model
        return {
            "model": {k: getattr(spec, k) for k in spec.__dataclass_fields__},
            "parameters": spec.params(),
            "machine": self.profile.name,
            "gpus": self.gpus,
            "evaluated": self.evaluated,
            "excluded_memory": self.excluded_memory,
            "excluded_split": self.excluded_split,
            "search_seconds": self.seconds,
            "plans": [{**p.to_dict(), "vs_best_flat": self.vs_best_flat(p)} for p in self.plans],
            "best_flat": self.best_flat.to_dict() if self.best_flat else None,
            "alternatives": {k: a.to_dict() for k, a in self.alternatives.items()},
            "sensitivity": self.sensitivity,
            "why": explain(self),
            "assumptions": assumptions(self),
        }


def _plan_of(ev: Evaluation, base: Evaluation, spec, profile, gpus: int) -> Plan:
    g = ev.grid
    return Plan(
        x=g.x,
        y=g.y,
        z=g.z,
        data=g.data,
        order=ev.order,
        algorithms=dict(ev.algorithms),
        step_time=ev.step_time,
        compute_time=ev.compute_time,
        comm_time=dict(ev.comm_time),
        exposed_time=dict(ev.exposed_time),
        memory=dict(ev.memory),
        baseline_step_time=base.step_time,
        baseline_exposed_time=dict(base.exposed_time),
        model=spec.name,
        machine=profile.name,
        gpus=gpus,
        micro_batch=ev.detail["micro_batch"],
        accumulation=ev.detail["accumulation"],
        placements={
            a: [p.size, p.nodes, p.ranks_per_node, p.uniform] for a, p in ev.placements.items()
        },
    )


@dataclass
class _Sweep:
    """Every configuration of one search: the evaluated ones, (configuration, same grid with
    flat collectives) pairs, and the grids excluded for memory with their bytes per GPU."""

    results: list = field(default_factory=list)
    too_big: list = field(default_factory=list)  # (Grid4D, bytes per GPU)
    evaluated: int = 0
    excluded_split: int = 0
    best_flat: tuple | None = None  # the pair whose flat evaluation is fastest (first found)


def _sweep(spec, gpus: int, profile, cm, policy, overlap_data) -> _Sweep:
    """Evaluates every grid of `gpus` and every order that places its groups differently."""
    sw = _Sweep()
    for g in divisor_grids(gpus):
        if not spec.splits(g) or batch_split(spec, g) is None:
            sw.excluded_split += 1
            continue
        mem = memory(spec, g)
        if not fits(mem, profile):  # memory does not depend on the order
            sw.too_big.append((g, mem["total"]))
            sw.evaluated += 1
            continue
        msgs = messages(spec, g)
        seen = set()
        for order in distinct_orders(g):
            # Orders that place every axis's groups the same way predict the same time.
            key = tuple(grid_placements(g.sizes(), order, profile.ranks_per_node).values())
            if key in seen:
                continue
            seen.add(key)
            sw.evaluated += 1
            ev, base = evaluate(
                spec,
                g,
                order,
                profile,
                cm,
                policy=policy,
                overlap_data=overlap_data,
                msgs=msgs,
                baseline="flat",
            )
            sw.results.append((ev, base))
            if sw.best_flat is None or base.step_time < sw.best_flat[1].step_time:
                sw.best_flat = (ev, base)
    sw.results.sort(key=lambda eb: (eb[0].step_time, eb[0].memory["total"]))
    return sw


def _alternatives(sw: _Sweep, make_plan) -> dict:
    """STRUCTURES key -> the Alternative to the best configuration's structure."""
    if not sw.results:
        return {}
    best = sw.results[0][0].grid
    out = {}
    for key, (test, yes, no) in STRUCTURES.items():
        want = not test(best)
        found = next(((ev, b) for ev, b in sw.results if test(ev.grid) == want), None)
        alt = Alternative(structure=yes if want else no, plan=None)
        if found is not None:
            alt.plan = make_plan(*found)
        else:
            lean = _leanest([(g, m) for g, m in sw.too_big if test(g) == want])
            alt.least_memory = lean.get("memory")
            alt.least_memory_grid = lean.get("grid", "")
        out[key] = alt
    return out


def _grid_label(g) -> str:
    return f"Gx={g.x} Gy={g.y} Gz={g.z} Gdata={g.data}"


def _leanest(too_big: list) -> dict:
    """{"grid", "memory"} of the grid that needs the least memory of `too_big`, or {}."""
    if not too_big:
        return {}
    g, mem = min(too_big, key=lambda gm: gm[1])
    return {"grid": _grid_label(g), "memory": mem}


def _sensitivity(spec, ev: Evaluation, profile, cm, policy, overlap_data) -> dict:
    """Axis -> what the best configuration's step depends on hiding: for every axis whose
    hidden traffic is over 1% of the step, that traffic, the compute it hides under and the
    step time with the axis SLOWDOWN slower."""
    out = {}
    for a in AXES:
        hidden = ev.comm_time[a] - ev.exposed_time[a]
        if hidden <= 0.01 * ev.step_time:
            continue
        slower = evaluate(
            spec.with_(micro_batch=ev.detail["micro_batch"]),
            ev.grid,
            ev.order,
            profile,
            cm,
            policy=policy,
            overlap_data=overlap_data,
            slowdown={a: SLOWDOWN},
        )
        out[a] = {
            "hidden": hidden,
            "window": ev.detail["windows"][a],
            "slower_step": slower.step_time,
            "slowdown": SLOWDOWN,
        }
    return out


def search(
    model,
    gpus: int,
    machine,
    top_k: int = 5,
    *,
    overlap_data: bool = False,
    policy=None,
    **model_overrides,
) -> SearchResult:
    """Ranks the configurations of `model` (a preset name or TransformerSpec) on `gpus` GPUs
    of `machine` (a profile name, JSON path or Profile). `policy` forces one algorithm on
    every axis (e.g. "flat" for the library baseline); by default each axis gets its best."""
    t0 = time.perf_counter()
    spec = get_model(model, **model_overrides)
    profile = get_profile(machine)
    if not isinstance(gpus, int) or gpus < 1:
        raise ValueError(f"gpus: expected an integer >= 1, found {gpus!r}")
    cm = CollectiveModel(profile)
    sw = _sweep(spec, gpus, profile, cm, policy, overlap_data)

    def make_plan(ev, base):
        return _plan_of(ev, base, spec, profile, gpus)

    plans = []
    for i, (ev, base) in enumerate(sw.results[:top_k]):
        p = make_plan(ev, base)
        p.rank = i + 1
        plans.append(p)
    flat = sw.best_flat
    return SearchResult(
        plans=plans,
        evaluated=sw.evaluated,
        excluded_memory=len(sw.too_big),
        excluded_split=sw.excluded_split,
        seconds=time.perf_counter() - t0,
        model=spec,
        profile=profile,
        gpus=gpus,
        best_flat=make_plan(flat[1], flat[1]) if flat else None,
        alternatives=_alternatives(sw, make_plan),
        sensitivity=(
            _sensitivity(spec, sw.results[0][0], profile, cm, policy, overlap_data)
            if sw.results
            else {}
        ),
        overlap_data=overlap_data,
        leanest=_leanest(sw.too_big),
    )

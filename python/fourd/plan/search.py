"""Ranking the 4D configurations of a model on a machine.

Every (Gx, Gy, Gz, Gdata) whose product is the GPU count and every axis order that places the
groups differently is evaluated (fourd.plan.model.evaluate); configurations whose memory per
GPU does not fit, or whose batch or heads do not split, are excluded, and the rest are sorted by
predicted step time.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field

from .model import (
    AXES,
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
    model_flops_per_step,
)
from .profiles import get_profile


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

    def to_dict(self) -> dict:
        spec = self.model
        return {
            "model": {k: getattr(spec, k) for k in spec.__dataclass_fields__},
            "machine": self.profile.name,
            "gpus": self.gpus,
            "evaluated": self.evaluated,
            "excluded_memory": self.excluded_memory,
            "excluded_split": self.excluded_split,
            "search_seconds": self.seconds,
            "plans": [p.to_dict() for p in self.plans],
            "best_flat": self.best_flat.to_dict() if self.best_flat else None,
            "why": explain(self),
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
    evaluated = excluded_memory = excluded_split = 0
    results = []
    best_flat = None
    for g in divisor_grids(gpus):
        if (
            spec.hidden % g.x
            or spec.hidden % g.y
            or spec.heads % g.y
            or batch_split(spec, g) is None
        ):
            excluded_split += 1
            continue
        if not fits(memory(spec, g), profile):  # memory does not depend on the order
            excluded_memory += 1
            evaluated += 1
            continue
        msgs = messages(spec, g)
        seen = set()
        for order in distinct_orders(g):
            # Orders that place every axis's groups the same way predict the same time.
            key = tuple(grid_placements(g.sizes(), order, profile.ranks_per_node).values())
            if key in seen:
                continue
            seen.add(key)
            evaluated += 1
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
            results.append((ev, base))
            if best_flat is None or base.step_time < best_flat[1].step_time:
                best_flat = (ev, base)
    results.sort(key=lambda eb: (eb[0].step_time, eb[0].memory["total"]))
    plans = []
    for i, (ev, base) in enumerate(results[:top_k]):
        p = _plan_of(ev, base, spec, profile, gpus)
        p.rank = i + 1
        plans.append(p)
    flat_plan = None
    if best_flat is not None:
        flat_plan = _plan_of(best_flat[1], best_flat[1], spec, profile, gpus)
    return SearchResult(
        plans=plans,
        evaluated=evaluated,
        excluded_memory=excluded_memory,
        excluded_split=excluded_split,
        seconds=time.perf_counter() - t0,
        model=spec,
        profile=profile,
        gpus=gpus,
        best_flat=flat_plan,
    )


# ---- explanations and printing ---------------------------------------------------------------


def _ms(s: float) -> str:
    return f"{s * 1e3:.1f} ms"


def explain(result: SearchResult) -> list:
    """Sentences saying why the best configuration wins."""
    if not result.plans:
        return [
            "no configuration fits: every grid either runs out of memory per GPU or does "
            "not split the batch/heads; try more GPUs, recomputation or a smaller "
            "micro-batch"
        ]
    best = result.plans[0]
    out = []

    def comps(p):
        return {"compute": p.compute_time, **{f"exposed {a}": p.exposed_time[a] for a in AXES}}

    if len(result.plans) > 1:
        second = result.plans[1]
        d = second.step_time - best.step_time
        diffs = {k: comps(second)[k] - comps(best)[k] for k in comps(best)}
        key = max(diffs, key=lambda k: diffs[k])
        out.append(
            f"#1 ({best.label()}) beats #2 ({second.label()}) by {_ms(d)} per step "
            f"({100 * d / second.step_time:.1f}%); the largest difference is {key} "
            f"({_ms(comps(second)[key])} vs {_ms(comps(best)[key])})."
        )
    gain = best.baseline_step_time - best.step_time
    if gain <= 0:
        out.append(
            "On this grid the library's flat collectives are predicted as good as any of "
            "fourd's algorithms on every axis (rail-striped rings, no latency-bound "
            "message)."
        )
    else:
        axis = max(AXES, key=lambda a: best.baseline_exposed_time[a] - best.exposed_time[a])
        out.append(
            f"On this grid fourd's algorithms save {_ms(gain)} per step over the library's flat "
            f"collectives ({best.baseline_step_time / best.step_time:.2f}x), most on axis "
            f"'{axis}' ({best.algorithms[axis]}: exposed {_ms(best.baseline_exposed_time[axis])}"
            f" -> {_ms(best.exposed_time[axis])})."
        )
    if result.best_flat is not None:
        out.append(
            f"The best grid with flat collectives only ({result.best_flat.label()}) predicts "
            f"{_ms(result.best_flat.step_time)} per step "
            f"({result.best_flat.step_time / best.step_time:.2f}x the best plan)."
        )
    mem = best.memory["total"] / 1e9
    cap = result.profile.memory_bytes / 1e9
    out.append(
        f"Memory per GPU {mem:.1f} GB of {cap:.0f} GB; {result.excluded_memory} of "
        f"{result.evaluated} configurations evaluated were excluded for memory, "
        f"{result.excluded_split} grids because the batch or heads do not split."
    )
    exposed_frac = best.exposed_total / best.step_time
    out.append(
        f"Exposed communication is {100 * exposed_frac:.0f}% of the step; compute "
        f"{_ms(best.compute_time)}."
    )
    return out


def format_table(result: SearchResult) -> str:
    spec = result.model
    prof = result.profile
    lines = []
    lines.append(
        f"{spec.name}: {spec.params() / 1e9:.1f}B parameters, {spec.layers} layers, hidden "
        f"{spec.hidden}, {spec.heads} heads, seq {spec.seq_len}, global batch "
        f"{spec.global_batch}, micro-batch {spec.micro_batch}, {spec.dtype}, recompute "
        f"{'on' if spec.recompute else 'off'}"
    )
    lines.append(
        f"machine {prof.name}: {result.gpus} GPUs = {result.gpus / prof.ranks_per_node:g} nodes "
        f"x {prof.ranks_per_node}; {result.evaluated} configurations evaluated in "
        f"{result.seconds:.1f} s"
    )
    lines.append("")
    hdr = (
        f"{'#':>2} {'Gx':>4} {'Gy':>4} {'Gz':>4} {'Gd':>5} {'order':<12} "
        f"{'algorithms x/y/z/data':<34} {'step':>9} {'compute':>9} "
        f"{'x':>15} {'y':>15} {'z':>15} {'data':>15} {'exposed':>9} {'mem/GPU':>8} "
        f"{'vs flat':>7}"
    )
    lines.append(hdr)
    lines.append(f"{'':>58}{'':>20}{'comm (exposed) per step, ms':^64}")
    for p in result.plans:
        algos = "/".join(p.algorithms[a] for a in AXES)
        cols = " ".join(
            f"{p.comm_time[a] * 1e3:>7.1f}({p.exposed_time[a] * 1e3:>6.1f})" for a in AXES
        )
        lines.append(
            f"{p.rank:>2} {p.x:>4} {p.y:>4} {p.z:>4} {p.data:>5} {p.order:<12} {algos:<34} "
            f"{p.step_time * 1e3:>7.0f}ms {p.compute_time * 1e3:>7.0f}ms {cols} "
            f"{p.exposed_total * 1e3:>7.0f}ms {p.memory['total'] / 1e9:>6.1f}GB "
            f"{p.baseline_step_time / p.step_time:>6.2f}x"
        )
    lines.append("")
    if result.plans:
        b = result.plans[0]
        tokens = spec.global_batch * spec.seq_len
        tflops = model_flops_per_step(spec) / b.step_time / result.gpus / 1e12
        lines.append(
            f"best: {b.step_time:.3f} s per step, {tokens / b.step_time:,.0f} tokens/s, "
            f"{tflops:.0f} model TFLOP/s per GPU; micro-batch {b.micro_batch} x "
            f"{b.accumulation} accumulation steps per (data, z) shard"
        )
        m = b.memory
        lines.append(
            "memory per GPU: "
            + ", ".join(
                f"{k} {m[k] / 1e9:.1f} GB"
                for k in ("weights", "gradients", "optimizer", "transient", "activations", "total")
            )
        )
    lines.append("why:")
    for s in explain(result):
        lines.append(f"  - {s}")
    return "\n".join(lines)

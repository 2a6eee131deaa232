"""A search's result in words: why the best configuration wins ("why"), what that rests on
("assumes"), and the table that ``python -m fourd.plan`` prints.

The printed output fits 100 columns; every figure it leaves out is in
``SearchResult.to_dict()`` (``--json``). Nothing here computes a prediction: the figures come
from the search (search.py) and the model (model.py).
"""

from __future__ import annotations

import textwrap

from .. import _C
from .model import AXES, MODEL_ERROR, SLOWDOWN, USABLE_MEMORY_FRACTION, model_flops_per_step

WIDTH = 100  # columns of the printed output


# ---- numbers and words -----------------------------------------------------------------------


def _ms(s: float) -> str:
    """Seconds as milliseconds: "3,080 ms" from 100 ms on, "12.3 ms" below."""
    v = s * 1e3
    return f"{v:,.0f} ms" if abs(v) >= 99.95 else f"{v:.1f} ms"


def _signed_ms(s: float) -> str:
    return ("+" if s >= 0 else "-") + _ms(abs(s))


def _count(n, word: str, plural: str | None = None) -> str:
    """ "1 grid", "3 grids", "1,024 GPUs" ("%g" for a count that is not whole)."""
    text = f"{int(n):,}" if float(n).is_integer() else f"{n:g}"
    return f"{text} {word if n == 1 else plural or word + 's'}"


def _parameters(n: float) -> str:
    """ "20.0B parameters", "124.4M parameters", "5,248 parameters"."""
    if n >= 1e9:
        return f"{n / 1e9:.1f}B parameters"
    if n >= 1e6:
        return f"{n / 1e6:.1f}M parameters"
    return _count(int(n), "parameter")


def _gb(b: float) -> str:
    """Bytes as "16.1 GB", or "0.04 GB" under 1 GB."""
    return f"{b / 1e9:.1f} GB" if b >= 0.995e9 else f"{b / 1e9:.2f} GB"


def _where(placement: list) -> str:
    """ "inside one node" or "across 8 nodes, 4 per node", from [size, nodes, k, uniform]."""
    size, nodes, k, _ = placement
    if nodes == 1:
        return "inside one node"
    return f"across {nodes} nodes, {k} per node" if k > 1 else f"across {nodes} nodes"


def _abbreviations() -> dict:
    """Algorithm name -> its shortest unique prefix of at least 4 letters (hierarchical ->
    hier), from the native list, so that the table's algorithm column stays narrow."""
    names = list(_C.ALGORITHMS)
    for n in range(4, max(map(len, names)) + 1):
        short = {a: a[:n] for a in names}
        if len(set(short.values())) == len(names):
            return {"-": "-", **short}
    return {"-": "-", **{a: a for a in names}}


def _wrap(text: str, first: str = "", rest: str = "") -> list:
    return textwrap.wrap(text, WIDTH, initial_indent=first, subsequent_indent=rest)


# ---- why: the structure and the comparisons ---------------------------------------------------


def _components(p) -> dict:
    return {"compute": p.compute_time, **{f"exposed {a}": p.exposed_time[a] for a in AXES}}


def _differences(p, best) -> str:
    """The components where `p` differs from `best` most, largest first: "exposed x +110 ms,
    exposed z -40.0 ms". Differences under 1% of the best's step are left out."""
    a, b = _components(p), _components(best)
    diffs = sorted(((a[k] - b[k], k) for k in a), key=lambda dk: -abs(dk[0]))
    shown = [f"{k} {_signed_ms(d)}" for d, k in diffs if abs(d) >= 0.01 * best.step_time]
    return ", ".join(shown[:3]) or "no component differs by 1% of the step"


def _relative(p, best) -> str:
    """ "+7.9%, +190 ms", and a flag when that is inside the model's error."""
    d = p.step_time - best.step_time
    text = f"{100 * d / best.step_time:+.1f}%, {_signed_ms(d)}"
    if abs(d) < MODEL_ERROR * best.step_time:
        text += f"; inside the model's error of about {100 * MODEL_ERROR:.0f}%"
    return text


def _structure(best) -> str:
    """What the best grid does with each axis, and where its groups sit."""
    pl = best.placements
    if best.x * best.y == 1:
        tensor = "no tensor parallelism"
    else:
        where = " x ".join(f"G{a}={pl[a][0]} {_where(pl[a])}" for a in ("x", "y") if pl[a][0] > 1)
        tensor = f"tensor parallelism over {_count(best.x * best.y, 'GPU')} ({where})"
    if best.z > 1:
        z = f"z shards weights, gradients and optimizer state {best.z} ways ({_where(pl['z'])})"
    else:
        z = "no z sharding"
    if best.data > 1:
        data = f"{best.data} data-parallel replicas ({_where(pl['data'])})"
    else:
        data = "no data parallelism"
    mb, acc = best.micro_batch, best.accumulation
    return (
        f"Structure of #1: {tensor}; {z}; {data}; "
        f"{_count(mb, 'sequence')} per micro-batch, {_count(acc, 'micro-batch', 'micro-batches')} "
        f"per step on each (data, z) shard."
    )


def _alternative(alt, best, ranked: list, usable: float) -> str:
    """The best plan of another structure, against #1; or why none of it fits."""
    if alt.plan is not None:
        p = alt.plan
        listed = next((q.rank for q in ranked if q.label() == p.label()), None)
        where = f" (#{listed} above)" if listed else ""
        return (
            f"Best {alt.structure}: {p.label()}{where}, {_ms(p.step_time)} per step "
            f"({_relative(p, best)}): {_differences(p, best)}."
        )
    if alt.least_memory is not None:
        return (
            f"No plan {alt.structure} fits: the leanest ({alt.least_memory_grid}) needs "
            f"{_gb(alt.least_memory)} per GPU, {_gb(usable)} usable."
        )
    return f"No grid {alt.structure} splits the batch, hidden size and heads."


def _times(n: int) -> str:
    return {1: "once", 2: "twice"}.get(n, f"{n:,} times")


def _gathers(p) -> str:
    """What one GPU of plan `p` gathers over z per step."""
    if p.z == 1:
        return "gathers no weights over z"
    share = "all" if p.x * p.y == 1 else f"1/{p.x * p.y}"
    return (
        f"gathers {share} of the weights over z {_times(p.accumulation)} per step "
        f"({_count(p.micro_batch, 'sequence')} per micro-batch)"
    )


def _why_tensor(result, best) -> str | None:
    """Why #1 does or does not run tensor parallelism, against the best plan of the other
    choice: what its x/y all-reduces cost, what it saves of the exposed z and data traffic,
    and how much of the weights each GPU gathers with and without it. (At one micro-batch
    size tensor parallelism saves no z volume: Gx Gy times as many micro-batches each gather
    1/(Gx Gy) of the weights. It saves z traffic where its smaller activations let a
    micro-batch hold more sequences.)"""
    alt = result.alternatives.get("tensor")
    if alt is None or alt.plan is None:
        return None
    has = best.x * best.y > 1
    tp, no = (best, alt.plan) if has else (alt.plan, best)
    cost = tp.exposed_time["x"] + tp.exposed_time["y"]
    saved = sum(no.exposed_time[a] - tp.exposed_time[a] for a in ("z", "data"))
    balance = (
        f"its x/y all-reduces cost {_ms(cost)} exposed (the forward ones wait for their "
        f"result) and it saves {_ms(saved)} of exposed z and data traffic"
    )
    how = (
        f"with it each GPU {_gathers(tp)}, without it {_gathers(no)}: z moves "
        f"{_ms(tp.comm_time['z'])} per step against {_ms(no.comm_time['z'])} (exposed "
        f"{_ms(tp.exposed_time['z'])} vs {_ms(no.exposed_time['z'])}), data "
        f"{_ms(tp.comm_time['data'])} vs {_ms(no.comm_time['data'])}"
    )
    if has:
        return f"Why tensor parallelism: {balance}; {how}."
    return (
        f"Why no tensor parallelism: the model fits without it "
        f"({_gb(best.memory['total'])} per GPU). With it, {balance}; {how}."
    )


def _versus_second(result, best) -> str | None:
    if len(result.plans) < 2:
        return None
    second = result.plans[1]
    d = second.step_time - best.step_time
    a, b = _components(second), _components(best)
    key = max(a, key=lambda k: a[k] - b[k])
    text = (
        f"#1 beats #2 ({second.label()}) by {_ms(d)} per step "
        f"({100 * d / second.step_time:.1f}%); the largest difference is {key} "
        f"({_ms(a[key])} vs {_ms(b[key])})."
    )
    if d < MODEL_ERROR * second.step_time:
        text += (
            f" That is inside the model's error (about {100 * MODEL_ERROR:.0f}%): the model "
            "cannot tell the two apart."
        )
    return text


def _versus_flat(result, best) -> list:
    out = []
    gain = best.baseline_step_time - best.step_time
    if gain <= 0:
        out.append(
            "On this grid the library's flat collectives are predicted as good as any of "
            "fourd's algorithms on every axis (rail-striped rings, no latency-bound message)."
        )
    else:
        axis = max(AXES, key=lambda a: best.baseline_exposed_time[a] - best.exposed_time[a])
        out.append(
            f"On this grid fourd's algorithms save {_ms(gain)} per step over the library's flat "
            f"collectives ({best.baseline_step_time / best.step_time:.2f}x), most on axis "
            f"'{axis}' ({best.algorithms[axis]}: exposed {_ms(best.baseline_exposed_time[axis])}"
            f" -> {_ms(best.exposed_time[axis])})."
        )
    flat = result.best_flat
    if flat is not None:
        out.append(
            f"The best grid with flat collectives only ({flat.label()}) predicts "
            f"{_ms(flat.step_time)} per step, {result.vs_best_flat(best):.2f}x #1's time "
            "(the table's 'vs flat')."
        )
    return out


def _memory(result, best) -> str:
    cap = result.profile.memory_bytes
    return (
        f"Memory per GPU {_gb(best.memory['total'])} of {_gb(cap)} "
        f"({_gb(USABLE_MEMORY_FRACTION * cap)} usable); "
        f"{_count(result.evaluated, 'configuration')} evaluated, "
        f"{result.excluded_memory:,} of them excluded for memory; "
        f"{_count(result.excluded_split, 'grid')} skipped because the batch or heads do not "
        "split."
    )


def explain(result) -> list:
    """Sentences saying why the best configuration wins: its structure against the best plan
    of each other structure, #1 against #2, fourd's algorithms against flat collectives, its
    memory and its exposed communication."""
    if not result.plans:
        out = [
            "no configuration fits: every grid either runs out of memory per GPU or does "
            "not split the batch/heads; try more GPUs, recomputation or a smaller "
            "micro-batch"
        ]
        if result.leanest:
            usable = USABLE_MEMORY_FRACTION * result.profile.memory_bytes
            out.append(
                f"The leanest grid ({result.leanest['grid']}) needs "
                f"{_gb(result.leanest['memory'])} per GPU, {_gb(usable)} usable."
            )
        return out
    best = result.plans[0]
    usable = USABLE_MEMORY_FRACTION * result.profile.memory_bytes
    out = [_structure(best)]
    out += [_alternative(a, best, result.plans, usable) for a in result.alternatives.values()]
    out += [s for s in (_why_tensor(result, best), _versus_second(result, best)) if s]
    out += _versus_flat(result, best)
    out.append(_memory(result, best))
    out.append(
        f"Exposed communication is {100 * best.exposed_total / best.step_time:.0f}% of the "
        f"step; compute {_ms(best.compute_time)}."
    )
    return out


# ---- assumes: what the result rests on --------------------------------------------------------


def _hidden(axis: str, s: dict, best) -> str:
    """One axis's traffic that the prediction hides under compute, and whether the result
    rests on hiding it: with the axis SLOWDOWN slower, the step grows by over 1% more than
    the axis's exposed part alone accounts for."""
    under = "compute"
    if axis in ("x", "y"):
        under = "its Linears' dW GEMMs"
    elif axis == "data":
        under = "the last backward pass (--overlap-data)"
    share = s["hidden"] / s["window"] if s["window"] else float("inf")
    d = s["slower_step"] - best.step_time
    unhidden = d - (SLOWDOWN - 1) * best.exposed_time[axis]
    slower = f"{axis} {100 * (SLOWDOWN - 1):.0f}% slower"
    pct = f"{100 * d / best.step_time:+.1f}%"
    verdict = (
        f"the result rests on it: with {slower} the step is {_ms(s['slower_step'])} ({pct}), "
        f"{_ms(unhidden)} of it traffic that no longer hides"
        if unhidden > 0.01 * best.step_time
        else f"with {slower} it still hides (the step: {pct})"
    )
    return (
        f"{axis} traffic hidden under {under}: {_ms(s['hidden'])} per step under "
        f"{_ms(s['window'])} ({100 * share:.0f}%), exposed {_ms(best.exposed_time[axis])}. That "
        "takes perfect overlap (no contention for the GPU's memory and SMs, every prefetch on "
        f"time); {verdict}."
    )


def _micro_batch(result, best) -> str:
    mb = result.model.micro_batch
    if mb:
        return (
            f"The micro-batch is held at {_count(mb, 'sequence')} per pass (--micro-batch) on "
            "every grid, or the shard's whole batch where that is smaller: each micro-batch "
            "gathers the z share of the weights again, even where memory leaves room for a "
            "larger one (--micro-batch auto chooses per grid)."
        )
    return (
        "The micro-batch is chosen per grid: the one with the least step time that fits "
        f"(#1: {_count(best.micro_batch, 'sequence')}). A larger one gathers the z share of "
        "the weights fewer times per step and costs nothing else in the model, which fills "
        f"memory up to its {100 * USABLE_MEMORY_FRACTION:.0f}% limit and does not model GEMM "
        "efficiency."
    )


def assumptions(result) -> list:
    """Sentences naming what the best configuration's prediction rests on: traffic that it
    takes to hide entirely under compute (and what the step is if that traffic runs
    SLOWDOWN slower), the micro-batch it holds fixed, and profile figures that are assumed
    rather than measured."""
    if not result.plans:
        return []
    best = result.plans[0]
    out = [_hidden(a, s, best) for a, s in result.sensitivity.items()]
    out.append(_micro_batch(result, best))
    assumed = sorted(k for k, v in result.profile.notes.items() if "assumed" in str(v))
    if assumed:
        out.append(
            f"Assumed, not measured, in the '{result.profile.name}' profile: "
            f"{', '.join(assumed)}; `python -m fourd.plan --calibrate` measures a machine."
        )
    return out


# ---- the table -------------------------------------------------------------------------------


def _header(result) -> list:
    spec, prof = result.model, result.profile
    model = (
        f"{spec.name}: {_parameters(spec.params())}, {_count(spec.layers, 'layer')}, hidden "
        f"{spec.hidden}, {_count(spec.heads, 'head')}, seq {spec.seq_len}, global batch "
        f"{spec.global_batch}, micro-batch {spec.micro_batch or 'chosen per grid'}, "
        f"{spec.dtype}, recompute "
        f"{'on' if spec.recompute else 'off'}"
    )
    machine = (
        f"machine {prof.name}: {_count(result.gpus, 'GPU')} = "
        f"{_count(result.gpus / prof.ranks_per_node, 'node')} x {prof.ranks_per_node}; "
        f"{_count(result.evaluated, 'configuration')} evaluated in {result.seconds:.1f} s"
    )
    return _wrap(model) + _wrap(machine)


_COLUMNS = (
    f"{'#':>2} {'Gx':>3} {'Gy':>3} {'Gz':>4} {'Gd':>4} {'order':<10} "
    f"{'algorithms x/y/z/data':<21} {'step':>7} {'compute':>7} {'exposed':>7} {'most':<4} "
    f"{'mem':>5} {'vs flat':>7}"
)


def _row(result, p, short: dict) -> str:
    algos = "/".join(short.get(p.algorithms[a], p.algorithms[a]) for a in AXES)
    most = max(AXES, key=lambda a: p.exposed_time[a]) if p.exposed_total > 0 else "-"
    vs = result.vs_best_flat(p)
    return (
        f"{p.rank:>2} {p.x:>3} {p.y:>3} {p.z:>4} {p.data:>4} {p.order:<10} {algos:<21} "
        f"{p.step_time * 1e3:>7,.0f} {p.compute_time * 1e3:>7,.0f} "
        f"{p.exposed_total * 1e3:>7,.0f} {most:<4} {p.memory['total'] / 1e9:>5.1f} "
        f"{vs:>6.2f}x"
    )


def _legend(result, short: dict) -> list:
    used = {p.algorithms[a] for p in result.plans for a in AXES}
    names = ", ".join(f"{short[a]} = {a}" for a in sorted(used) if short.get(a, a) != a)
    text = (
        "step, compute, exposed: ms per step; most: the axis with the most exposed time; "
        "mem: GB per GPU; vs flat: the best flat-only plan's step time over this one's"
        + (f"; {names}" if names else "")
        + ". Per-axis times, placements and the rest: --json."
    )
    return _wrap(text)


def _summary(result) -> list:
    spec, b = result.model, result.plans[0]
    tokens = spec.global_batch * spec.seq_len
    tflops = model_flops_per_step(spec) / b.step_time / result.gpus / 1e12
    m = b.memory
    parts = ("weights", "gradients", "optimizer", "transient", "activations", "total")
    return _wrap(
        f"best: {b.step_time:.3f} s per step, {tokens / b.step_time:,.0f} tokens/s, "
        f"{tflops:.0f} model TFLOP/s per GPU; {_count(b.micro_batch, 'sequence')} per "
        f"micro-batch x {_count(b.accumulation, 'accumulation step')} per (data, z) shard"
    ) + _wrap("memory per GPU: " + ", ".join(f"{k} {_gb(m[k])}" for k in parts))


def format_table(result) -> str:
    """The printed form of a search: the model and machine, the ranked configurations in 100
    columns, the best one's throughput and memory, then "why" and "assumes"."""
    short = _abbreviations()
    lines = _header(result) + [""]
    lines.append(_COLUMNS)
    lines += [_row(result, p, short) for p in result.plans]
    if result.plans:
        lines += _legend(result, short) + [""] + _summary(result)
    lines.append("why:")
    for s in explain(result):
        lines += _wrap(s, "  - ", "    ")
    notes = assumptions(result)
    if notes:
        lines.append("assumes:")
        for s in notes:
            lines += _wrap(s, "  - ", "    ")
    return "\n".join(lines)

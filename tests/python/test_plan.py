"""The planner (fourd.plan): placement, volume formulas, memory, ranking, profiles,
validation report and the command line. Serial; no mpiexec. The calibration's fits and
profile files: test_profile.py."""

import importlib
import json
import math
import re
import shlex
import time
from pathlib import Path

import pytest

from fourd.plan import Plan
from fourd.plan import model as M
from fourd.plan import profiles as P
from fourd.plan import validate as V
from fourd.plan.__main__ import main as plan_main

S = importlib.import_module("fourd.plan.search")  # the module; fourd.plan.search is a function
C = M.native_module()


# ---- placement -----------------------------------------------------------------------------------


def test_placement_by_hand():
    # 16 ranks, 4 per node, x=2 y=4 z=2 (order x-y-z-data): x is consecutive ranks (one node),
    # y has stride 2: ranks 0,2,4,6 -> nodes 0,0,1,1; z has stride 8: ranks 0,8 -> 2 nodes.
    sizes = {"x": 2, "y": 4, "z": 2, "data": 1}
    pl = M.grid_placements(sizes, "x-y-z-data", 4)
    assert pl["x"] == M.Placement(2, 1, 2, True)
    assert pl["y"] == M.Placement(4, 2, 2, True)
    assert pl["z"] == M.Placement(2, 2, 1, True)
    assert pl["data"] == M.Placement(1, 1, 1, True)
    # The order changes it: z innermost puts the z pair on one node, y spans 4 nodes.
    pl = M.grid_placements(sizes, "z-x-y-data", 4)
    assert pl["z"] == M.Placement(2, 1, 2, True)
    assert pl["y"] == M.Placement(4, 4, 1, True)


def test_placement_uneven_nodes():
    # 3 ranks per node, groups of 4 consecutive ranks: [0..3] -> nodes 0,0,0,1: not uniform.
    pl = M.placement(4, 1, 12, 3)
    assert pl.nodes == 2 and not pl.uniform
    # 6 ranks per node: [4..7] -> nodes 0,0,1,1 is the worst group, and it is uniform.
    assert M.placement(4, 1, 12, 6) == M.Placement(4, 2, 2, True)


@pytest.mark.parametrize("rpn", [1, 2, 4, 8])
def test_placement_closed_form_matches_enumeration(rpn):
    world = 64
    for size in (1, 2, 4, 8, 16, 32, 64):
        for stride in (1, 2, 4, 8, 16, 32, 64):
            if world % (size * stride):
                continue
            pl = M.placement(size, stride, world, rpn)
            k = M.closed_form_ranks_per_node(size, stride, rpn)
            assert pl.ranks_per_node == k, (size, stride, rpn)
            assert pl.nodes == size // k and pl.uniform


def test_strides_and_orders():
    assert M.strides({"x": 2, "y": 3, "z": 4, "data": 5}, "x-y-z-data") == {
        "x": 1,
        "y": 2,
        "z": 6,
        "data": 24,
    }
    assert M.strides({"x": 2, "y": 3, "z": 4, "data": 5}, "data-z-y-x") == {
        "data": 1,
        "z": 5,
        "y": 20,
        "x": 60,
    }
    with pytest.raises(ValueError, match="permutation"):
        M.parse_order("x-y-z")
    # size-1 axes do not multiply the orders
    assert len(M.distinct_orders(M.Grid4D(2, 1, 4, 1))) == 2
    assert len(M.distinct_orders(M.Grid4D(2, 2, 2, 2))) == 24


# ---- volume formulas -----------------------------------------------------------------------------


def tiny_spec(**kw):
    base = dict(
        name="tiny",
        layers=1,
        hidden=8,
        heads=4,
        seq_len=4,
        vocab=16,
        global_batch=4,
        micro_batch=1,
        recompute=False,
    )
    base.update(kw)
    return M.TransformerSpec(**base)


def by_key(msgs):
    return {(m.linear, m.role): m for m in msgs}


def test_volumes_plain_and_transposed_by_hand():
    # Gx=2, Gy=4, Gz=2, Gdata=2; batch 4 over 4 (data, z) shards: 1 sequence of t=4 tokens.
    g = M.Grid4D(2, 4, 2, 2)
    msgs = by_key(M.messages(tiny_spec(), g))
    # qkv: plain, k=8 -> n=24. Forward AR over x of t*n/Gy; backward AR over y of t*k/Gx.
    assert (msgs["qkv", "fwd_ar"].axis, msgs["qkv", "fwd_ar"].elements) == ("x", 4 * 24 // 4)
    assert (msgs["qkv", "bwd_ar"].axis, msgs["qkv", "bwd_ar"].elements) == ("y", 4 * 8 // 2)
    # z: all-gather output and reduce-scatter input k*n/(Gx*Gy); data AR k*n/(Gx*Gy*Gz).
    assert msgs["qkv", "fwd_ag"].elements == 8 * 24 // 8
    assert msgs["qkv", "bwd_ag"].elements == 8 * 24 // 8
    assert msgs["qkv", "rs"].elements == 8 * 24 // 8
    assert (msgs["qkv", "data_ar"].elements, msgs["qkv", "data_ar"].dtype) == (12, "float32")
    # fc2: transposed, k=32 -> n=8. Forward AR over y of t*n/Gx = 16; backward AR over x of
    # t*k/Gy = 32: the factor 4 rides on the backward message (not AxoNN's script's slip).
    assert (msgs["fc2", "fwd_ar"].axis, msgs["fc2", "fwd_ar"].elements) == ("y", 4 * 8 // 2)
    assert (msgs["fc2", "bwd_ar"].axis, msgs["fc2", "bwd_ar"].elements) == ("x", 4 * 32 // 4)
    # proj: transposed, k=n=8
    assert (msgs["proj", "fwd_ar"].axis, msgs["proj", "fwd_ar"].elements) == ("y", 16)
    assert (msgs["proj", "bwd_ar"].axis, msgs["proj", "bwd_ar"].elements) == ("x", 8)
    # fc1: plain, 8 -> 32
    assert (msgs["fc1", "fwd_ar"].axis, msgs["fc1", "fwd_ar"].elements) == ("x", 32)
    assert (msgs["fc1", "bwd_ar"].axis, msgs["fc1", "bwd_ar"].elements) == ("y", 16)
    # bytes follow the dtype
    assert msgs["fc1", "fwd_ar"].nbytes == 64


def test_volumes_counts_recompute_accumulation_and_trivial_axes():
    g = M.Grid4D(2, 1, 2, 1)
    spec = tiny_spec(layers=3, heads=2, global_batch=8, micro_batch=2, recompute=True)
    # 8 sequences over 2 z shards: 4 per shard, micro-batch 2 -> 2 accumulation steps
    assert M.batch_split(spec, g) == (2, 2)
    msgs = by_key(M.messages(spec, g))
    assert msgs["qkv", "fwd_ar"].count == 3 * 2 * 2  # layers x accumulation x (1 + recompute)
    assert msgs["qkv", "fwd_ar"].elements == 2 * 4 * 24  # t = 2 sequences x 4 tokens
    assert msgs["qkv", "bwd_ag"].count == 3 * 2 * 2  # backward + recomputed forward gathers
    assert msgs["qkv", "fwd_ag"].count == 3 * 2
    assert msgs["qkv", "rs"].count == 3 * 2
    assert msgs["head", "fwd_ar"].count == 1 * 2 * 2
    # Gy = Gdata = 1: no backward AR of plain layers, no data AR
    assert ("qkv", "bwd_ar") not in msgs and ("qkv", "data_ar") not in msgs
    assert ("fc2", "fwd_ar") not in msgs  # the transposed forward AR is over y
    assert msgs["fc2", "bwd_ar"].axis == "x"
    with pytest.raises(ValueError, match="does not split"):
        M.messages(tiny_spec(global_batch=3), M.Grid4D(1, 1, 2, 1))


# ---- memory --------------------------------------------------------------------------------------


def test_param_counts_of_presets():
    for name, billions in (("gpt-5b", 5.0), ("gpt-20b", 20.0), ("gpt-80b", 76.7)):
        spec = M.PRESETS[name]
        assert abs(spec.params() / 1e9 - billions) / billions < 0.03, name
    spec = tiny_spec()
    assert spec.tp_params() == 1 * (8 * 24 + 8 * 8 + 8 * 32 + 32 * 8) + 8 * 16


def test_memory_accounting_by_hand():
    spec = tiny_spec()
    g = M.Grid4D(2, 4, 2, 2)
    mem = M.memory(spec, g)
    local = spec.tp_params() / 16 + spec.replicated_params()
    assert mem["weights"] == pytest.approx(2 * local)
    assert mem["gradients"] == pytest.approx(4 * local)
    assert mem["optimizer"] == pytest.approx(12 * local)
    largest = max(8 * 32, 8 * 16) / 8
    assert mem["transient"] == pytest.approx(3 * 2 * largest)
    t, h = 4, 8
    layer = 10 * t * h / 2 + 24 * t * h / 4 + 4 * 1 * (4 / 4) * 4
    logits = 6 * t * 16 / 4
    assert mem["activations"] == pytest.approx(layer + layer + logits)
    parts = ("weights", "gradients", "optimizer", "transient", "activations")
    assert mem["total"] == pytest.approx(sum(mem[k] for k in parts))
    # Without sharding, the per-layer activations are the classic 34 s b h bytes (+ softmax
    # statistics) and recomputation keeps only each layer's input (2 s b h).
    big = M.TransformerSpec("b", layers=10, hidden=1024, heads=8, seq_len=512, global_batch=1)
    g1 = M.Grid4D(1, 1, 1, 1)
    full = M.memory(big.with_(recompute=False), g1)["activations"]
    ckpt = M.memory(big.with_(recompute=True), g1)["activations"]
    per_layer = 34 * 512 * 1024 + 4 * 8 * 512
    logits = 6 * 512 * big.vocab
    assert full == pytest.approx(11 * per_layer + logits)
    assert ckpt == pytest.approx(10 * 2 * 512 * 1024 + 2 * per_layer + logits)


def test_configurations_that_do_not_fit_are_excluded():
    small = P.get_profile("perlmutter").replace(memory_bytes=2e9)
    res = S.search("gpt-20b", 64, small)
    assert res.plans == [] and res.excluded_memory > 0
    assert "no configuration fits" in S.explain(res)[0]
    ok = S.search("gpt-20b", 64, "perlmutter", top_k=50)
    assert ok.plans
    for p in ok.plans:
        assert p.memory["total"] <= M.USABLE_MEMORY_FRACTION * 40e9


# ---- the collective model through fourd._C -------------------------------------------------------


def test_collective_model_is_the_cpp_model():
    prof = P.Profile(
        name="unit",
        ranks_per_node=4,
        intra_alpha=1.0,
        intra_bw=1.0,
        inter_alpha=1.0,
        nic_bw=1.0,
        nics_per_node=4,
        reduce_bw=2.0,
        memcpy_bw=1.0,
    )
    cm = M.CollectiveModel(prof)
    pl = M.Placement(4, 1, 4, True)
    # ring all-reduce, p=4, n=8: 6 (alpha + 2) + 0.75*8*0.5 = 21 (as in the C++ unit test)
    assert cm.predict("all_reduce", "ring", 8, "float32", pl) == pytest.approx(21.0)
    t = cm.times("all_reduce", 8, "float32", pl)
    assert set(t) == set(M.ALGORITHMS)
    assert math.isinf(t["hierarchical"])
    assert cm.predict("all_reduce", "auto", 8, "float32", pl) == min(t.values())
    assert C.choose("all_reduce", 8, "float32", pl.native(), prof.native()) != "auto"


# ---- ranking -------------------------------------------------------------------------------------


def test_ranking_is_sorted_and_exhaustive_on_a_small_case():
    spec = M.PRESETS["gpt-5b"]
    prof = P.get_profile("perlmutter")
    res = S.search(spec, 16, prof, top_k=1000)
    times = [p.step_time for p in res.plans]
    assert times == sorted(times)
    assert all(p.x * p.y * p.z * p.data == 16 for p in res.plans)
    # the best equals the minimum over a direct evaluation of every valid configuration
    cm = M.CollectiveModel(prof)
    best = math.inf
    for g in M.divisor_grids(16):
        if spec.hidden % g.x or spec.hidden % g.y or spec.heads % g.y:
            continue
        if M.batch_split(spec, g) is None:
            continue
        for order in M.distinct_orders(g):
            ev = M.evaluate(spec, g, order, prof, cm)
            if ev.fits:
                best = min(best, ev.step_time)
    assert res.plans[0].step_time == pytest.approx(best)
    # a forced-flat search is never better than the free choice
    flat = S.search(spec, 16, prof, top_k=1, policy="flat")
    assert flat.plans[0].step_time >= res.plans[0].step_time * (1 - 1e-12)


def test_step_time_pieces_add_up():
    spec = M.PRESETS["gpt-5b"]
    prof = P.get_profile("perlmutter")
    cm = M.CollectiveModel(prof)
    ev = M.evaluate(spec, M.Grid4D(2, 2, 4, 8), "x-y-z-data", prof, cm)
    # step = compute + exposed communication (each axis's exposed part <= its total)
    assert ev.step_time == pytest.approx(ev.compute_time + ev.exposed_total)
    for a in M.AXES:
        assert -1e-12 <= ev.exposed_time[a] <= ev.comm_time[a] * (1 + 1e-9)
    assert ev.exposed_time["x"] > 0  # the forward all-reduce is synchronous


def test_hierarchical_wins_where_the_library_is_slow_across_nodes():
    # Frontier's RCCL efficiency across nodes: hierarchical z gathers beat flat ones.
    res = S.search("gpt-80b", 1024, "frontier", top_k=3)
    best = res.plans[0]
    assert best.baseline_step_time > best.step_time
    assert "hierarchical" in best.algorithms.values()


def test_plan_object_round_trip_and_grid_kwargs(tmp_path):
    res = S.search("gpt-5b", 64, "perlmutter", top_k=2)
    p = res.plans[0]
    kw = p.grid_kwargs()
    assert set(kw) == {"x", "y", "z", "data", "order"}
    assert kw["x"] * kw["y"] * kw["z"] * kw["data"] == 64
    assert sorted(kw["order"].split("-")) == sorted(M.AXES)
    path = tmp_path / "plan.json"
    p.save(str(path))
    q = Plan.load(str(path))
    assert q.grid_kwargs() == kw and q.algorithms == p.algorithms
    assert set(p.algorithms) == set(M.AXES)
    d = res.to_dict()
    json.dumps(d)
    assert d["why"] and d["plans"][0]["rank"] == 1


# ---- profiles ------------------------------------------------------------------------------------


def test_builtin_profiles_and_files(tmp_path):
    for name in ("perlmutter", "frontier", "dgx-h100", "cpu"):
        prof = P.get_profile(name)
        n = prof.native()
        assert n.ranks_per_node == prof.ranks_per_node and n.intra_bw == prof.intra_bw
    pm = P.get_profile("perlmutter")
    assert (pm.ranks_per_node, pm.nics_per_node, pm.memory_bytes) == (4, 4, 40e9)
    assert pm.intra_mesh and pm.notes["nic_bw"]
    path = tmp_path / "p.json"
    P.save_profile(pm, str(path))
    assert P.get_profile(str(path)) == pm
    with pytest.raises(ValueError, match="perlmutter"):
        P.get_profile("summit")


# ---- validation report ---------------------------------------------------------------------------


def test_validate_reports_the_median_error(tmp_path):
    prof = P.get_profile("cpu")
    native = prof.native()
    rows = []
    for coll in ("all_reduce", "all_gather", "reduce_scatter"):
        for algo in ("flat", "ring", "rhd", "hierarchical"):
            for n in (1 << 10, 1 << 16, 1 << 20):
                shape = C.GroupShape(8, 2, 4, True)
                t = C.predict(coll, algo, n, "float32", shape, native) * 1e6
                rows.append(
                    dict(
                        collective=coll,
                        axis="x",
                        algorithm=algo,
                        size_bytes=n,
                        dtype="float32",
                        time_us=t * 1.1,
                        group_size=8,
                        nodes=2,
                        ranks_per_node=4,
                    )
                )
    rows.append(
        dict(
            collective="all_reduce",
            axis="x",
            algorithm="mpi4py",
            size_bytes=1024,
            dtype="float32",
            time_us=5.0,
            group_size=8,
            nodes=2,
            ranks_per_node=4,
        )
    )
    path = tmp_path / "bench.json"
    path.write_text(json.dumps({"rows": rows}))
    out = tmp_path / "v.md"
    assert V.main([str(path), "--machine", "cpu", "--out", str(out)]) == 0
    compared = V.compare(V.load_rows(str(path)), prof)
    assert len(compared) == len(rows) - 1  # the non-fourd row is skipped
    s = V.summary(compared)
    assert s["median_abs_error"] == pytest.approx(0.1 / 1.1, rel=1e-6) and s["pass"]
    assert "Median absolute error" in out.read_text()
    assert V.main([str(path), "--machine", "cpu", "--threshold", "0.05"]) == 1


# ---- command line --------------------------------------------------------------------------------


def test_cli_json(capsys):
    assert (
        plan_main(
            ["--model", "gpt-5b", "--gpus", "64", "--machine", "perlmutter", "--json", "--top", "3"]
        )
        == 0
    )
    d = json.loads(capsys.readouterr().out)
    assert len(d["plans"]) == 3 and d["gpus"] == 64 and d["machine"] == "perlmutter"
    assert d["plans"][0]["step_time"] <= d["plans"][1]["step_time"]


def test_cli_table_and_custom_model(capsys):
    assert (
        plan_main(
            [
                "--layers",
                "4",
                "--hidden",
                "1024",
                "--heads",
                "8",
                "--gpus",
                "8",
                "--machine",
                "dgx-h100",
                "--global-batch",
                "64",
            ]
        )
        == 0
    )
    out = capsys.readouterr().out
    assert "why:" in out and "Gx" in out
    assert plan_main(["--gpus", "8"]) == 2


def test_cli_gpt20b_on_1024_perlmutter_is_fast(capsys):
    t0 = time.perf_counter()
    assert plan_main(["--model", "gpt-20b", "--gpus", "1024", "--machine", "perlmutter"]) == 0
    elapsed = time.perf_counter() - t0
    out = capsys.readouterr().out
    assert " 1 " in out and "why:" in out
    assert elapsed < 60  # a few seconds on a free core; generous for a loaded CI machine


# ---- published shapes ----------------------------------------------------------------------------


def test_model_reproduces_axonn_bus_bandwidth_table():
    reproduce = importlib.import_module("fourd.plan.reproduce")
    _, rows = reproduce.axonn_table()
    for r in rows:
        ratio = r["flat_gbps"] / r["axonn_gbps"]
        assert 0.85 < ratio < 1.1, r


def test_hierarchical_advantage_grows_with_nodes_as_in_pccl():
    reproduce = importlib.import_module("fourd.plan.reproduce")
    _, rows = reproduce.pccl_table("frontier")
    for coll in ("all_gather", "reduce_scatter"):
        sel = [
            r["speedup_vs_flat"] for r in rows if r["collective"] == coll and r["bytes"] == 16 << 20
        ]
        assert sel == sorted(sel) and sel[0] > 1 and sel[-1] > 10 * sel[0] / 2


# ---- Llama-shaped layers and presets -------------------------------------------------------------


def test_llama_presets_match_the_published_parameter_counts():
    # Hugging Face meta-llama/Llama-2-{7,13,70}b-hf; their input embedding is not tied to the
    # head (h x vocab more), their norms are RMSNorms without biases (under 0.1% apart).
    published = {
        "llama2-7b": 6_738_415_616,
        "llama2-13b": 13_015_864_320,
        "llama2-70b": 68_976_648_192,
    }
    for name, count in published.items():
        spec = M.PRESETS[name]
        untied = spec.params() + spec.hidden * spec.vocab
        assert abs(untied - count) / count < 0.001, name
    s = M.PRESETS["llama2-70b"]
    assert (s.seq_len, s.vocab, s.global_batch, s.key_value_heads) == (4096, 32000, 1024, 8)


def test_gated_mlp_and_grouped_query_attention_by_hand():
    spec = tiny_spec(hidden=8, heads=4, kv_heads=2, ffn_hidden=12, gated_mlp=True)
    # qkv: 8 queries + 2 x 2 key/value heads of 2 elements; fc1: gate and up, 2 x 12
    assert spec.linears() == [
        ("qkv", 8, 16, False),
        ("proj", 8, 8, True),
        ("fc1", 8, 24, False),
        ("fc2", 12, 8, True),
    ]
    g = M.Grid4D(2, 2, 1, 1)
    msgs = by_key(M.messages(spec, g))
    t = 4  # one sequence of 4 tokens
    assert msgs["qkv", "fwd_ar"].elements == t * 16 // 2
    assert msgs["fc1", "fwd_ar"].elements == t * 24 // 2
    assert msgs["fc2", "bwd_ar"].elements == t * 12 // 2
    # activations split over y: qkv out, attention out, fc1 out, the gated product (2 B each)
    mem = M.memory(spec, g)
    layer = 10 * t * 8 / 2 + 2 * (16 + 8 + 24 + 12) * t / 2 + 4 * 1 * (4 / 2) * 4
    assert mem["activations"] == pytest.approx(spec.layers * layer + layer + 6 * t * 16 / 2)
    # the key/value heads must split over y too
    assert spec.splits(M.Grid4D(1, 2, 1, 1)) and not spec.splits(M.Grid4D(1, 4, 1, 1))


# ---- the micro-batch -----------------------------------------------------------------------------


def test_auto_micro_batch_is_the_best_that_fits_and_a_fixed_one_is_kept():
    prof = P.get_profile("perlmutter")
    cm = M.CollectiveModel(prof)
    spec = M.PRESETS["gpt-20b"]
    assert spec.micro_batch == M.AUTO_MICRO_BATCH
    g = M.Grid4D(1, 2, 512, 1)  # 2 sequences per (data, z) shard
    assert M.micro_batch_choices(spec, g) == [1, 2]
    assert M.micro_batch_choices(spec.with_(micro_batch=1), g) == [1]
    auto, _ = M.evaluate(spec, g, "z-y-x-data", prof, cm, baseline="flat")
    fixed = [M.evaluate(spec.with_(micro_batch=mb), g, "z-y-x-data", prof, cm) for mb in (1, 2)]
    assert auto.step_time == min(ev.step_time for ev in fixed if ev.fits)
    assert auto.detail["micro_batch"] == 2 and auto.detail["accumulation"] == 1
    # a micro-batch that does not fit is not chosen
    small = prof.replace(memory_bytes=auto.memory["total"] / M.USABLE_MEMORY_FRACTION * 0.99)
    ev = M.evaluate(spec, g, "z-y-x-data", small, M.CollectiveModel(small))
    assert ev.detail["micro_batch"] == 1
    # --micro-batch N holds it on every grid
    res = S.search("gpt-20b", 1024, "perlmutter", top_k=20, micro_batch=1)
    assert {p.micro_batch for p in res.plans} == {1}


def test_at_one_micro_batch_tensor_parallelism_gathers_the_same_z_volume():
    # Gx Gy times as many micro-batches, each gathering 1/(Gx Gy) of the weights.
    spec = M.PRESETS["gpt-20b"].with_(micro_batch=1)

    def z_volume(g):
        return sum(m.count * m.elements for m in M.messages(spec, g) if m.axis == "z")

    assert z_volume(M.Grid4D(1, 1, 32, 32)) == z_volume(M.Grid4D(1, 2, 32, 16))
    assert z_volume(M.Grid4D(1, 1, 32, 32)) == z_volume(M.Grid4D(2, 2, 32, 8))
    # with the micro-batch the split frees, the shard gathers its half once
    both = spec.with_(micro_batch=2)
    assert 2 * sum(
        m.count * m.elements for m in M.messages(both, M.Grid4D(1, 2, 32, 16)) if m.axis == "z"
    ) == z_volume(M.Grid4D(1, 1, 32, 32))


# ---- the explanation -----------------------------------------------------------------------------


def _all_plans(model, gpus, machine, **kw):
    return S.search(model, gpus, machine, top_k=100000, **kw)


def test_the_alternatives_are_the_best_plans_of_the_other_structures():
    res = _all_plans("gpt-20b", 1024, "perlmutter")
    best = res.plans[0]
    alt = res.alternatives
    assert set(alt) == {"tensor", "z", "data"}
    tp = [p for p in res.plans if p.x * p.y > 1]
    no_tp = [p for p in res.plans if p.x * p.y == 1]
    mine, other = (tp, no_tp) if best.x * best.y > 1 else (no_tp, tp)
    assert mine[0] is best and alt["tensor"].plan.step_time == pytest.approx(other[0].step_time)
    assert alt["tensor"].plan.label() == other[0].label()
    z1 = [p for p in res.plans if (p.z > 1) != (best.z > 1)]
    assert alt["z"].plan.label() == z1[0].label()
    # a structure none of whose grids fits names its leanest grid instead
    # (5 GB per GPU: only tensor parallelism fits GPT-20B)
    small = P.get_profile("perlmutter").replace(memory_bytes=5e9)
    res = S.search("gpt-20b", 1024, small)
    lean = res.alternatives["tensor"]
    assert lean.plan is None and lean.least_memory > M.USABLE_MEMORY_FRACTION * 5e9
    assert lean.least_memory_grid == "Gx=1 Gy=1 Gz=1024 Gdata=1"
    assert any(
        s.startswith("No plan without tensor parallelism") and "leanest" in s
        for s in S.explain(res)
    )


def test_why_explains_the_structural_choice_for_the_issue_queries():
    # GPT-20B on 1,024 GPUs: the 2-way split lets a micro-batch hold 2 sequences, so z is
    # gathered half as much; held at 1 sequence, no tensor parallelism wins, as before.
    res = S.search("gpt-20b", 1024, "perlmutter")
    best = res.plans[0]
    why = " ".join(S.explain(res))
    assert best.x * best.y > 1 and best.micro_batch == 2
    assert "Structure of #1: tensor parallelism" in why
    assert "Why tensor parallelism" in why and "Best without tensor parallelism" in why
    fixed = S.search("gpt-20b", 1024, "perlmutter", micro_batch=1)
    assert fixed.plans[0].x * fixed.plans[0].y == 1
    assert fixed.alternatives["tensor"].plan.step_time > fixed.plans[0].step_time
    assert "Why no tensor parallelism" in " ".join(S.explain(fixed))
    # at one micro-batch size, twice the micro-batches each gather half the weights
    text = " ".join(" ".join(S.explain(fixed)).split())
    assert "with it each GPU gathers 1/2 of the weights over z twice per step" in text
    assert "without it gathers all of the weights over z once per step" in text
    # A 7B model on 64 GPUs is compute-bound: tensor parallelism only adds exposed all-reduces.
    res = S.search("llama2-7b", 64, "perlmutter")
    best, tp = res.plans[0], res.alternatives["tensor"].plan
    assert best.x * best.y == 1 and best.exposed_total < 0.01 * best.step_time
    assert tp.exposed_time["x"] + tp.exposed_time["y"] > 0
    assert "Why no tensor parallelism" in " ".join(S.explain(res))


def test_close_calls_are_flagged_as_inside_the_model_error():
    res = S.search("gpt-20b", 1024, "perlmutter")
    first, second = res.plans[:2]
    assert second.step_time - first.step_time < M.MODEL_ERROR * second.step_time
    assert any("#1 beats #2" in s and "inside the model's error" in s for s in S.explain(res))
    z = res.alternatives["z"].plan  # without z sharding: far slower
    assert z.step_time > (1 + M.MODEL_ERROR) * first.step_time
    line = next(s for s in S.explain(res) if s.startswith("Best without z sharding"))
    assert "inside the model's error" not in line


def test_hidden_traffic_is_flagged_with_what_a_slower_one_costs():
    res = S.search("gpt-20b", 1024, "perlmutter")
    best = res.plans[0]
    s = res.sensitivity["z"]
    assert s["hidden"] == pytest.approx(best.comm_time["z"] - best.exposed_time["z"])
    assert s["window"] == pytest.approx(best.compute_time)
    assert s["slower_step"] > best.step_time
    notes = S.assumptions(res)
    assert any(n.startswith("z traffic hidden under compute") and "rests on it" in n for n in notes)
    # compute-bound: the z traffic still hides when slower, and the note says so
    res7 = S.search("llama2-7b", 64, "perlmutter")
    assert any("still hides" in n for n in S.assumptions(res7))
    # the slowdown stretches one axis and nothing else
    prof = P.get_profile("perlmutter")
    cm = M.CollectiveModel(prof)
    spec, g = M.PRESETS["gpt-5b"].with_(micro_batch=1), M.Grid4D(2, 2, 4, 8)
    ev = M.evaluate(spec, g, "x-y-z-data", prof, cm)
    same = M.evaluate(spec, g, "x-y-z-data", prof, cm, slowdown={"z": 1.0})
    assert same.step_time == ev.step_time
    slow = M.evaluate(spec, g, "x-y-z-data", prof, cm, slowdown={"x": 2.0})
    assert slow.comm_time["x"] == pytest.approx(2 * ev.comm_time["x"])
    assert slow.comm_time["z"] == ev.comm_time["z"]
    # the micro-batch assumption and the profile's assumed figures are named
    assert any("micro-batch is chosen per grid" in n for n in notes)
    assert any("Assumed, not measured" in n and "compute_flops" in n for n in notes)


def test_vs_flat_is_against_the_best_flat_grid():
    res = _all_plans("gpt-20b", 1024, "frontier")
    flat = min(p.baseline_step_time for p in res.plans)
    assert res.best_flat.step_time == pytest.approx(flat)
    worst = max(p.baseline_step_time for p in res.plans)
    assert worst > 1.5 * flat  # the same-grid baseline can be far worse than the best flat grid
    for p in res.plans[:5]:
        assert res.vs_best_flat(p) == pytest.approx(flat / p.step_time)
    top = S.search("gpt-20b", 1024, "frontier", top_k=3)
    table = S.format_table(top)
    for p in top.plans:
        row = next(line for line in table.splitlines() if line.startswith(f"{p.rank:>2} "))
        assert row.endswith(f"{flat / p.step_time:.2f}x")
    d = top.to_dict()
    assert d["plans"][0]["vs_best_flat"] == pytest.approx(flat / top.plans[0].step_time)


# ---- the printed output --------------------------------------------------------------------------


QUERIES = [
    "--model gpt-20b --gpus 1024 --machine perlmutter".split(),
    "--model llama2-7b --gpus 64".split(),
    "--model llama2-70b --gpus 512 --machine dgx-h100 --top 10".split(),
    "--model gpt-80b --gpus 4096 --machine frontier".split(),
    "--model gpt-20b --gpus 8".split(),  # nothing fits
    "--layers 1 --hidden 8 --heads 2 --vocab 16 --seq-len 4 --gpus 1 --machine cpu "
    "--global-batch 1".split(),
]


@pytest.mark.parametrize("argv", QUERIES, ids=lambda a: "-".join(a[1:4:2]))
def test_cli_output_fits_100_columns(argv, capsys):
    plan_main(argv)
    out = capsys.readouterr().out
    assert "why:" in out
    wide = [line for line in out.splitlines() if len(line) > 100]
    assert not wide, wide


def test_cli_help_shows_the_defaults(capsys):
    with pytest.raises(SystemExit):
        plan_main(["--help"])
    out = capsys.readouterr().out
    assert not [line for line in out.splitlines() if len(line) > 100]
    words = " ".join(out.split())  # argparse wraps the help to the terminal
    assert "(default: perlmutter)" in words and "(default: 5)" in words
    assert "(default: auto)" in words and "(custom: 2048)" in words
    assert "(custom: 1024)" in words and "llama2-7b" in words and "llama2-70b" in words


def test_cli_micro_batch_flag(capsys):
    assert plan_main("--model gpt-20b --gpus 1024 --micro-batch 1 --json --top 2".split()) == 0
    d = json.loads(capsys.readouterr().out)
    assert d["model"]["micro_batch"] == 1 and {p["micro_batch"] for p in d["plans"]} == {1}
    assert plan_main("--model gpt-20b --gpus 1024 --micro-batch auto --json --top 1".split()) == 0
    d = json.loads(capsys.readouterr().out)
    assert d["model"]["micro_batch"] == M.AUTO_MICRO_BATCH
    assert set(d) >= {"alternatives", "sensitivity", "assumptions", "why", "parameters"}
    with pytest.raises(SystemExit):
        plan_main("--model gpt-20b --gpus 64 --micro-batch 0".split())
    assert "micro-batch" in capsys.readouterr().err


def test_plurals_and_number_formatting(capsys):
    R = importlib.import_module("fourd.plan.report")
    assert (R._count(1, "grid"), R._count(3, "grid"), R._count(1024, "GPU")) == (
        "1 grid",
        "3 grids",
        "1,024 GPUs",
    )
    assert R._count(256.0, "node") == "256 nodes" and R._count(0.25, "node") == "0.25 nodes"
    assert R._parameters(20.1e9) == "20.1B parameters"
    assert R._parameters(124.4e6) == "124.4M parameters"
    assert R._parameters(1016) == "1,016 parameters"
    assert (R._ms(3.0804), R._ms(0.0123), R._ms(0)) == ("3,080 ms", "12.3 ms", "0.0 ms")
    assert R._gb(16.1e9) == "16.1 GB" and R._gb(0.04e9) == "0.04 GB"
    plan_main(QUERIES[-1])
    out = capsys.readouterr().out
    for wrong in ("1 grids", "1 configurations", "1 layers", "0.0B parameters", " 1 GPUs"):
        assert wrong not in out, wrong
    assert "1,016 parameters, 1 layer," in out and "1 configuration evaluated" in out


def _doc_commands():
    """(argv, printed output) of each `$ python -m fourd.plan ...` console block in
    docs/planner.md that shows its output."""
    text = (Path(__file__).resolve().parents[2] / "docs" / "planner.md").read_text()
    out = []
    for block in re.findall(r"```console\n(.*?)```", text, re.S):
        lines = block.splitlines()
        commands = [line for line in lines if line.startswith("$ ")]
        if len(commands) == 1 and len(lines) > 1 and lines[0].startswith("$ python -m fourd.plan "):
            out.append((shlex.split(lines[0][2:])[3:], "\n".join(lines[1:])))
    return out


def test_docs_show_the_planner_output_as_it_is(capsys):
    cases = _doc_commands()
    assert len(cases) >= 2  # GPT-20B on 1,024 GPUs and a 7B model on 64 GPUs
    timing = re.compile(r"evaluated in [0-9.]+ s")
    for argv, shown in cases:
        plan_main(argv)
        out = capsys.readouterr().out.rstrip("\n")
        assert timing.sub("evaluated in _ s", out) == timing.sub("evaluated in _ s", shown), argv

"""Multi-rank tests of the profile package (fourd.profile): the policy at init measures,
caches and reloads one profile on every rank; `auto` follows measured corrections; the axes
the calibration measures, the calls it times and the points it measures across nodes.

The closed-form oracles are those of par_algorithms.py.
"""

import glob
import json
import shutil
import tempfile

import numpy as np
import pytest
from mpi4py import MPI
from par_algorithms import check, make
from patterns import oracle, values

import fourd
from fourd.profile import policy, store
from fourd.profile.fields import FIELDS

WORLD = MPI.COMM_WORLD
N = WORLD.Get_size()
ME = WORLD.Get_rank()


def _tuning_cache(monkeypatch, prefix):
    """A cache directory of the test's own (the same on every rank) with saved tuning on and
    the default schedule; returns its path."""
    tmp = WORLD.bcast(tempfile.mkdtemp(prefix=prefix) if ME == 0 else None)
    monkeypatch.setenv("XDG_CACHE_HOME", tmp)
    monkeypatch.setenv("FOURD_TUNE_CACHE", "1")
    monkeypatch.delenv("FOURD_TUNE", raising=False)
    monkeypatch.setattr(policy, "_memo", {})
    return tmp


def test_init_measures_caches_and_reloads_one_profile_on_every_rank(monkeypatch):
    """A fresh measurement on one node (FOURD_CALIBRATE=force, a cache of this test's own),
    identical on every rank, saved, then read back from the cache as the same profile."""
    if N == 1:
        return
    tmp = WORLD.bcast(tempfile.mkdtemp(prefix="fourd-par-profile-") if ME == 0 else None)
    monkeypatch.setenv("XDG_CACHE_HOME", tmp)
    monkeypatch.delenv("FOURD_PROFILE", raising=False)
    monkeypatch.setenv("FOURD_CALIBRATE", "0")
    monkeypatch.setattr(policy, "_memo", {})
    # The cache is what this tests: a busy machine (the suite's previous test still in the load
    # average, or another job) would keep the measurement for this run only.
    monkeypatch.setattr(policy, "BUSY_SPREAD", float("inf"))
    try:
        g = fourd.init(x=N, ranks_per_node=N)
        defaults = g.profile
        monkeypatch.setenv("FOURD_CALIBRATE", "force")
        first = policy.apply(g)
        path = store.cache_path(g)
        assert first["source"] == f"measured, saved to {path}", first["source"]
        mine = g.profile.to_dict()
        assert first["profile"] == mine
        assert all(d == mine for d in WORLD.allgather(mine)) and mine != defaults.to_dict()
        assert mine["ranks_per_node"] == N and mine["name"].startswith("calibrated:")
        assert mine["corrections"] and all(
            (c["group_size"], c["nodes"]) == (N, 1) for c in mine["corrections"]
        )
        WORLD.Barrier()  # rank 0 has written the file
        assert store.load(path, version=store.VERSION)["intra_bw"] == mine["intra_bw"]
        monkeypatch.setenv("FOURD_CALIBRATE", "")
        monkeypatch.setattr(policy, "_memo", {})  # read the file, not rank 0's memo
        g.set_profile(defaults)
        again = policy.apply(g)
        assert again["source"] == path and again["profile"] == mine
        fourd.finalize()
    finally:
        WORLD.Barrier()
        if ME == 0:
            shutil.rmtree(tmp, ignore_errors=True)


def _settle(g, axis, count):
    """Runs auto all_reduce calls of `count` int32 (exact) until its tuning is final."""
    for i in range(5000):
        t = make(np.int32, values(ME, count, i % 3))
        fourd.all_reduce(t, axis, algorithm="auto")
        check(t, oracle("sum", g.ranks(axis), count, i % 3), "sum", np.int32, f"auto #{i}")
        tu = g.explain("all_reduce", 4 * count, axis, "int32", True)["tuning"]
        if tu["state"] in ("settled", "provisional", "single"):
            return tu
    raise AssertionError(tu)


def test_saved_tuning_starts_the_next_run_of_the_layout_settled(monkeypatch):
    """What tuning in use settled on is saved at finalize beside the profile and seeds the
    next init of the same layout and profile (profile/tuning.py); another profile, or
    FOURD_TUNE_CACHE=0, starts afresh; a bad FOURD_TUNE_CACHE is refused on every rank."""
    if N == 1:
        return
    tmp = _tuning_cache(monkeypatch, "fourd-par-tuning-")
    counts = (1021, 3001)  # below 256 KiB: every supported algorithm is a candidate
    try:
        prof = f"{tmp}/profile.json"
        g = fourd.init(x=N, ranks_per_node=N)
        fields = {k: v for k, v in g.profile.to_dict().items() if k in FIELDS}
        if ME == 0:
            store.save(fields, prof)
        WORLD.Barrier()
        monkeypatch.setenv("FOURD_PROFILE", prof)
        fourd.finalize()
        g = fourd.init(x=N, ranks_per_node=N)
        first = {c: _settle(g, "world", c) for c in counts}
        decided = ("settled", "provisional")
        assert any(t["state"] in decided for t in first.values()), first  # something to save
        fourd.finalize()  # rank 0 saves
        WORLD.Barrier()
        g = fourd.init(x=N, ranks_per_node=N)
        for c in counts:
            tu = g.explain("all_reduce", 4 * c, "world", "int32", True)["tuning"]
            if first[c]["state"] == "single":
                assert tu["state"] == "not yet run", tu
                continue
            assert tu["state"] == first[c]["state"] and tu["saved"], (tu, first[c])
            assert tu["settled"] == first[c]["settled"], (tu, first[c])
            t = make(np.int32, values(ME, c))
            fourd.all_reduce(t, "world", algorithm="auto")
            check(t, oracle("sum", g.ranks("world"), c), "sum", np.int32, "seeded auto")
        fourd.finalize()
        # Another profile: the saved choices were priced by the old one.
        other = f"{tmp}/other.json"
        if ME == 0:
            store.save({**fields, "intra_bw": fields["intra_bw"] * 1.5}, other)
        WORLD.Barrier()
        monkeypatch.setenv("FOURD_PROFILE", other)
        g = fourd.init(x=N, ranks_per_node=N)
        assert (
            g.explain("all_reduce", 4 * counts[0], "world", "int32", True)["tuning"]["state"]
            == "not yet run"
        )
        fourd.finalize()
        monkeypatch.setenv("FOURD_PROFILE", prof)
        monkeypatch.setenv("FOURD_TUNE_CACHE", "0")
        g = fourd.init(x=N, ranks_per_node=N)
        assert (
            g.explain("all_reduce", 4 * counts[0], "world", "int32", True)["tuning"]["state"]
            == "not yet run"
        )
        fourd.finalize()
        monkeypatch.setenv("FOURD_TUNE_CACHE", "maybe")
        with pytest.raises(fourd.InvalidArgumentError, match="FOURD_TUNE_CACHE"):
            fourd.init(x=N, ranks_per_node=N)
        fourd.finalize()
    finally:
        WORLD.Barrier()
        if ME == 0:
            shutil.rmtree(tmp, ignore_errors=True)


def _saved_calls(tmp: str, count: int) -> list:
    """The saved tuning file's entries for an in-place int32 all_reduce of `count` (rank 0)."""
    (path,) = glob.glob(f"{tmp}/**/*-tuning.json", recursive=True)
    with open(path, encoding="utf-8") as f:
        doc = json.load(f)
    return [
        c for v in doc["groups"].values() for c in v if c[:3] == ["all_reduce", 4 * count, "int32"]
    ]


def test_a_saved_switch_runs_at_once_and_is_rechecked_once_its_calls_reach_the_gap(
    monkeypatch,
):
    """A provisional switch (one not yet re-checked) is saved with its calls, shortlist and
    figures; the next run runs it from its first call, counts its calls on from the saved
    count, and re-checks it when they reach the gap, over as many runs as that takes; the
    re-checked choice is saved as final. The switch here is written into the file, so the
    test does not depend on which algorithm the machine's timings favour."""
    if N == 1:
        return
    tmp = _tuning_cache(monkeypatch, "fourd-par-switch-")
    c = 1021  # below 256 KiB: every supported algorithm is a candidate
    try:
        prof = f"{tmp}/profile.json"
        g = fourd.init(x=N, ranks_per_node=N)
        if ME == 0:
            store.save({k: v for k, v in g.profile.to_dict().items() if k in FIELDS}, prof)
        WORLD.Barrier()
        monkeypatch.setenv("FOURD_PROFILE", prof)
        fourd.finalize()
        g = fourd.init(x=N, ranks_per_node=N)
        first = _settle(g, "world", c)
        cands, gap = first["candidates"], first["recheck_gap"]
        assert len(cands) >= 2 and gap > 0, first
        fourd.finalize()  # rank 0 saves
        WORLD.Barrier()
        switch = cands[1]
        if ME == 0:
            (path,) = glob.glob(f"{tmp}/**/*-tuning.json", recursive=True)
            with open(path, encoding="utf-8") as f:
                doc = json.load(f)
            for calls in doc["groups"].values():
                for i, e in enumerate(calls):
                    if e[:3] == ["all_reduce", 4 * c, "int32"]:
                        figures = [2.0, 1.0] + [3.0] * (len(cands) - 2)
                        # 7 items: without a re-check gap of its own (the default)
                        calls[i] = e[:3] + [switch, gap - 2, cands, figures]
            with open(path, "w", encoding="utf-8") as f:
                json.dump(doc, f)
        WORLD.Barrier()

        def run(g, what):
            t = make(np.int32, values(ME, c))
            fourd.all_reduce(t, "world", algorithm="auto")
            check(t, oracle("sum", g.ranks("world"), c), "sum", np.int32, what)
            return g.explain("all_reduce", 4 * c, "world", "int32", True)["tuning"]

        g = fourd.init(x=N, ranks_per_node=N)
        tu = g.explain("all_reduce", 4 * c, "world", "int32", True)["tuning"]
        assert tu["state"] == "provisional" and tu["saved"] and tu["settled"] == switch, tu
        assert g.algorithm_for("all_reduce", 4 * c, "world", "int32", True) == switch
        tu = run(g, "the seeded switch")
        assert tu["state"] == "provisional" and tu["settled"] == switch, tu
        fourd.finalize()
        WORLD.Barrier()
        if ME == 0:  # one more call of the switch, counted on
            assert _saved_calls(tmp, c) == [
                # 0: its call period is not agreed yet (it agrees after 4 intervals)
                ["all_reduce", 4 * c, "int32", switch, gap - 1, cands, figures, 0]
            ]
        g = fourd.init(x=N, ranks_per_node=N)
        tu = run(g, "the switch's last call before its re-check")
        assert tu["state"] == "provisional" and tu["saved"], tu
        tu = run(g, "the call that re-checks it")
        assert tu["state"] == "settled" and not tu["saved"], tu
        final = tu["settled"]
        assert final in cands, tu
        assert all(s < 1.0 for s in tu["measured_s"]), tu  # this run's figures, below the file's
        fourd.finalize()
        WORLD.Barrier()
        if ME == 0:
            assert _saved_calls(tmp, c) == [["all_reduce", 4 * c, "int32", final]]
    finally:
        WORLD.Barrier()
        if ME == 0:
            shutil.rmtree(tmp, ignore_errors=True)


def test_auto_follows_measured_corrections_of_both_placements_alike():
    """auto prices each candidate by the geometric mean of its in-place and out-of-place
    corrected predictions, so that ranks whose calls differ in placement choose alike
    (docs/algorithms.md); a correction measured in one placement still moves the choice."""
    g = fourd.init(x=N, ranks_per_node=N)  # one node: flat, ring, rhd and shm compete
    if N == 1:
        fourd.finalize()
        return
    n = 1 << 20
    saved = g.profile
    g.set_profile({"corrections": []})
    plain_out = g.explain("all_reduce", n, "x")["choice"]  # the model alone
    for winner in ("ring", "rhd"):
        # Every other algorithm measured 100x slower in place than the model says.
        corr = [
            {
                "collective": "all_reduce",
                "algorithm": a,
                "group_size": N,
                "nodes": 1,
                "half16": False,
                "in_place": True,
                "nbytes": float(n),
                "factor": 100.0,
            }
            for a in ("flat", "ring", "rhd", "shm")
            if a != winner
        ]
        # Out of place: points of its own, all exact (without them the in-place ones apply).
        corr += [
            {
                "collective": "all_reduce",
                "algorithm": a,
                "group_size": N,
                "nodes": 1,
                "half16": False,
                "in_place": False,
                "nbytes": float(n),
                "factor": 1.0,
            }
            for a in ("flat", "ring", "rhd", "shm")
        ]
        g.set_profile({"corrections": corr})
        e = g.explain("all_reduce", n, "x", in_place=True)
        assert e["choice"] == winner and e["in_place"], e
        assert g.algorithm_for("all_reduce", n, "x", in_place=True) == winner
        rows = {r["algorithm"]: r for r in e["candidates"]}
        assert rows[winner]["correction"] == 1.0 and all(
            abs(rows[a]["correction"] - 10.0) < 1e-9  # sqrt(100 in place x 1 out of place)
            for a in ("flat", "ring", "rhd", "shm")
            if a != winner
        )
        # Out of place: the same choice (the same prices), whatever the placement.
        assert g.explain("all_reduce", n, "x")["choice"] == winner
        assert plain_out in ("flat", "ring", "rhd", "shm")
        # auto runs (the per-communicator memo follows the new profile) and is exact.
        t = make(np.int32, values(ME, n // 4))
        fourd.all_reduce(t, "x", algorithm="auto")
        check(t, oracle("sum", g.ranks("x"), n // 4), "sum", np.int32, f"auto ({winner})")
    g.set_profile(saved)
    fourd.finalize()


def test_calibration_axes_raw_calls_and_spanning_points():
    """The calibration's three axes (one node, rails, both levels), the raw calls it times
    (exact, both placements), and points measured across nodes carrying the group's shape."""
    from fourd.profile import measure as cal

    if N % 2:
        return
    g = fourd.init(x=2, data=N // 2, ranks_per_node=2)
    assert cal._one_node_axis(g) == ("x",)
    if N >= 4:
        assert cal._rail_axis(g) == ("data",) and cal._mixed_axis(g) == ("x", "data")
    else:
        assert cal._rail_axis(g) is None and cal._mixed_axis(g) is None
    # The same order on every rank (a set's order of strings differs between processes).
    for axis in dict.fromkeys((("x",), cal._rail_axis(g) or ("x",), cal._mixed_axis(g) or ("x",))):
        _check_raw_calls(cal, g, axis)
    if N >= 4:
        _check_spanning_points(cal, g)
    fourd.finalize()


def _check_raw_calls(cal, g, axis):
    """Every call the calibration times on `axis`, against the closed forms."""
    p, r, ranks = g.size(axis), g.rank(axis), g.ranks(axis)
    count = 5 * p
    mine = values(ME, count).astype(np.float32)
    for coll, in_place in (
        ("all_reduce", False),
        ("all_reduce", True),
        ("all_gather", False),
        ("all_gather", True),
        ("reduce_scatter", False),
    ):
        for algo in ("flat", "ring", "rhd") + (("hierarchical",) if len(axis) == 2 else ()):
            a_in, a_out = np.zeros(count * 4, np.uint8), np.zeros(count * 4, np.uint8)
            src, out = a_in.view(np.float32), a_out.view(np.float32)
            src[:] = mine
            if coll == "all_gather" and in_place:
                out[r * 5 : (r + 1) * 5] = mine[:5]
            cal._raw_call(
                g, axis, coll, algo, a_in, a_out, count, np.float32, "float32", in_place
            )()
            what = f"raw {coll} {algo} {axis} in_place={in_place}"
            if coll == "all_reduce":
                check(
                    src if in_place else out, oracle("sum", ranks, count), "sum", np.float32, what
                )
            elif coll == "all_gather":
                want = np.concatenate([values(q, count)[:5] for q in ranks])
                np.testing.assert_array_equal(out, want.astype(np.float32), what)
            else:
                check(
                    out[:5],
                    oracle("sum", ranks, count)[r * 5 : (r + 1) * 5],
                    "sum",
                    np.float32,
                    what,
                )


def _check_spanning_points(cal, g):
    """Points measured on the rails and on the two-level axis carry the group's shape."""
    plan = (("all_gather", ("float32",), (False,)),)
    for axis, nodes in ((cal._rail_axis(g), N // 2), (cal._mixed_axis(g), N // 2)):
        pts = cal.measure_corrections(g, axis, 1.0, plan, (64 << 10,))
        algs = {
            c["algorithm"]
            for c in g.explain("all_gather", 64 << 10, axis)["candidates"]
            if c["candidate"]
        }
        assert {x["algorithm"] for x in pts} == algs, (pts, algs)
        for x in pts:
            assert x["collective"] == "all_gather" and x["nodes"] == nodes
            assert x["group_size"] == g.size(axis) and not x["half16"]
            assert 0.1 <= x["factor"] <= 10.0 and x["measured_s"] > 0

"""python -m fourd.bench: command line, check oracle, bounds and JSON schema (serial), plus one
short real run and one bad-argument run under mpiexec."""

import csv
import json
import math

import numpy as np
import pytest

from fourd.bench import bounds, check, report
from fourd.bench.options import DTYPES, HelpRequested, UsageError, default_grid, parse, parse_rate
from mpirun import run_mpi


def p4(*argv, hosts=None, environ=None):
    return parse(list(argv), 4, hosts or ["h"] * 4, environ or {})


# ---- command line ------------------------------------------------------------------------------


def test_defaults_on_four_ranks():
    cfg = p4()
    assert cfg.grid == {"x": 2, "y": 1, "z": 1, "data": 2}
    assert cfg.ranks_per_node == 2
    assert [a.name for a in cfg.axes] == ["x", "data", "world"]
    assert [a.group_size for a in cfg.axes] == [2, 2, 4]
    assert cfg.sizes == [1 << k for k in range(10, 25, 2)]  # 1K .. 16M by 4
    assert cfg.collectives == ["all_reduce", "all_gather", "reduce_scatter"]
    assert cfg.dtypes == ["float32"] and cfg.ops == ["sum"]
    assert cfg.algorithms[0] == "auto" and not cfg.algorithms_requested
    assert cfg.baselines == ["mpi", "torch"]
    assert cfg.iters is None and cfg.warmup == 5 and cfg.check == 1
    assert cfg.link_rate is None
    assert cfg.timing == "iteration"


def test_nccl_tests_names_and_lists():
    cfg = p4(
        "-b",
        "8",
        "-e",
        "128K",
        "-f",
        "2",
        "-n",
        "5",
        "-w",
        "0",
        "-c",
        "0",
        "-d",
        "half,bf16",
        "-o",
        "all",
        "--collective",
        "all",
        "--algorithm",
        "flat,auto",
        "--baseline",
        "none",
    )
    assert cfg.sizes[0] == 8 and cfg.sizes[-1] == 128 * 1024 and len(cfg.sizes) == 15
    assert (cfg.iters, cfg.warmup, cfg.check) == (5, 0, 0)
    assert cfg.dtypes == ["float16", "bfloat16"]
    assert cfg.ops == ["sum", "prod", "min", "max", "avg"]
    assert cfg.collectives == ["all_reduce", "all_gather", "reduce_scatter", "broadcast"]
    assert cfg.algorithms == ["flat", "auto"] and cfg.algorithms_requested
    assert cfg.baselines == []
    assert p4("-d", "all").dtypes == list(DTYPES)
    assert p4("-b", "1K", "-e", "4K", "-i", "1K").sizes == [1024, 2048, 3072, 4096]


def test_grid_axes_and_rates():
    cfg = p4("--grid", "x=2,y=2", "--order", "data-z-y-x", "--axis", "x,y+x,world,z")
    assert cfg.grid == {"x": 2, "y": 2, "z": 1, "data": 1}
    assert cfg.order == "data-z-y-x"
    # y+x is the same group as world on this grid; z is a group of one rank (noted, skipped)
    assert [a.name for a in cfg.axes] == ["x", "world"]
    assert any("axis z" in n for n in cfg.notes)
    assert len(p4("--grid", "x=2,y=2", "--axis", "all").axes) == 3
    assert parse_rate("4gbit") == pytest.approx(0.5e9)
    assert parse_rate("1.25gbps") == pytest.approx(1.25e9)
    assert p4(environ={"FOURD_CLUSTER_RATE_BPS": "8000000000"}).link_rate == pytest.approx(1e9)
    assert p4(
        "--link-rate", "800mbit", environ={"FOURD_CLUSTER_RATE_BPS": "1"}
    ).link_rate == pytest.approx(1e8)


def test_default_grid_follows_hosts():
    assert default_grid(4, ["a", "a", "b", "b"])[:2] == ({"x": 2, "y": 1, "z": 1, "data": 2}, None)
    assert default_grid(6, ["a"] * 3 + ["b"] * 3)[0]["x"] == 3
    assert default_grid(2, ["a", "a"])[:2] == ({"x": 1, "y": 1, "z": 1, "data": 2}, 1)
    assert default_grid(3, ["a"] * 3)[0]["data"] == 3
    assert default_grid(4, ["a", "b", "a", "b"])[0]["data"] == 4  # interleaved hosts


@pytest.mark.parametrize(
    "argv, fragment",
    [
        (["-b", "1M", "-e", "1K"], "-e/--maxbytes"),
        (["-b", "12Q"], "argument -b/--minbytes"),
        (["-f", "1"], "-f/--stepfactor"),
        (["-f", "2", "-i", "1K"], "found both"),
        (["-n", "0"], "-n/--iters"),
        (["-c", "-1"], "-c/--check"),
        (["-d", "uint32"], "-d/--datatype"),
        (["-d", "all,float"], "'all' cannot be combined"),
        (["-o", "mulsum"], "-o/--op"),
        (["--collective", "alltoall"], "--collective"),
        (["--algorithm", "tree"], "--algorithm"),
        (["--baseline", "nccl"], "--baseline"),
        (["--baseline", "mpi,none"], "'none' cannot be combined"),
        (["--axis", "w"], "--axis"),
        (["--axis", "y"], "nothing to measure"),
        (["--grid", "x=3"], "must divide"),
        (["--grid", "x=2,data=3"], "must equal the number of ranks (4)"),
        (["--grid", "q=2"], "--grid"),
        (["--order", "x-y-z"], "--order"),
        (["--ranks-per-node", "0"], "--ranks-per-node"),
        (["--link-rate", "fast"], "--link-rate"),
        (["--json", "/nonexistent-folder/x.json"], "does not exist"),
        (["--plot", "x.txt"], "--plot"),
        (["--frobnicate"], "unrecognized arguments"),
        (["-T", "0"], "-T/--timeout"),
        (["--timing", "wall"], "--timing"),
        (["-R", "0"], "-R/--rounds"),
        (["--target-time", "0"], "--target-time"),
        (["--target-time", "0.1", "-n", "5"], "give one"),
    ],
)
def test_bad_arguments(argv, fragment):
    with pytest.raises(UsageError) as e:
        p4(*argv)
    assert fragment in str(e.value), str(e.value)


def test_help():
    with pytest.raises(HelpRequested) as h:
        p4("-h")
    for flag in (
        "--minbytes",
        "--maxbytes",
        "--stepfactor",
        "--iters",
        "--warmup_iters",
        "--check",
        "--datatype",
        "--op",
        "--collective",
        "--axis",
        "--algorithm",
        "--grid",
        "--order",
        "--ranks-per-node",
        "--baseline",
        "--json",
        "--csv",
        "--plot",
        "--quiet",
    ):
        assert flag in h.value.text


# ---- check oracle ------------------------------------------------------------------------------


def _simulate(op, dtype, inputs):
    vals = np.stack([check.from_storage(a, dtype) for a in inputs])
    if op in ("sum", "avg"):
        out = vals.sum(0)
        out = out / len(inputs) if op == "avg" else out
    elif op == "prod":
        out = vals.prod(0)
    else:
        out = vals.min(0) if op == "min" else vals.max(0)
    return check.to_storage(out, dtype)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("p", [2, 3, 4, 8, 130])
def test_oracle_is_exact_for_every_dtype_and_op(dtype, p):
    n = 1000
    for op in ("sum", "prod", "min", "max", "avg"):
        if op == "avg" and dtype not in ("float32", "float64", "float16", "bfloat16"):
            continue
        inputs = [check.to_storage(check.reduce_input(op, dtype, p, g, n), dtype) for g in range(p)]
        for g, a in enumerate(inputs):  # inputs are exact in the storage type
            assert np.array_equal(
                check.from_storage(a, dtype), check.reduce_input(op, dtype, p, g, n)
            )
        got = _simulate(op, dtype, inputs)
        assert check.count_wrong(got, dtype, check.reduced(op, dtype, p, 0, n), op) == 0, (
            op,
            dtype,
            p,
        )
        # a block at an offset (reduce-scatter) is the same slice of the full result
        full = check.reduced(op, dtype, p, 0, n)
        assert np.array_equal(check.reduced(op, dtype, p, 123, 456), full[123:579])
        # a missing rank is detected
        partial = _simulate(op, dtype, inputs[:-1])
        if op == "sum":
            assert check.count_wrong(partial, dtype, full, op) > 0


def test_oracle_detects_misplaced_and_unwritten_data():
    p, n = 4, 64
    exp = check.gathered(p, n)
    got = check.to_storage(exp, "float32")
    assert check.count_wrong(got, "float32", exp) == 0
    got[n : 2 * n] = 0
    assert check.count_wrong(got, "float32", exp) == n
    swapped = np.concatenate([check.gather_input(1, n), check.gather_input(0, n)])
    assert check.count_wrong(check.to_storage(swapped, "int8"), "int8", check.gathered(2, n)) > 0
    assert check.to_storage(np.array([1.0, 256.0]), "bfloat16").tolist() == [0x3F80, 0x4380]


# ---- bounds ------------------------------------------------------------------------------------


def test_bus_factors_and_bounds():
    assert bounds.bus_factor("all_reduce", 4) == 1.5
    assert bounds.bus_factor("all_gather", 4) == 0.75
    assert bounds.bus_factor("reduce_scatter", 2) == 0.5
    assert bounds.bus_factor("broadcast", 8) == 1.0
    algbw, busbw = bounds.bandwidths("all_reduce", 2_000_000, 4, 0.001)
    assert algbw == pytest.approx(2.0) and busbw == pytest.approx(3.0)
    # all-reduce of 1 GB, N=2 nodes x k=4, Be=1 GB/s, Bi=10 GB/s: net 1 s, intra 0.15 s
    b = bounds.bound("all_reduce", 10**9, 2, 4, 10e9, 1e9)
    assert b["t_net_s"] == pytest.approx(1.0) and b["t_intra_s"] == pytest.approx(0.15)
    assert b["t_min_s"] == pytest.approx(1.0) and b["t_sum_s"] == pytest.approx(1.15)
    assert bounds.bound("all_gather", 10**9, 1, 2, 1e9, None)["t_min_s"] == pytest.approx(0.5)
    assert bounds.bound("all_reduce", 10**9, 2, 1, 1e9, None) is None  # only an unknown link
    assert bounds.bound("broadcast", 10**9, 2, 1, None, 2e9)["t_min_s"] == pytest.approx(0.5)
    assert bounds.memcpy_bandwidth(1 << 20, 2) > 1e6


# ---- JSON schema, CSV, plot --------------------------------------------------------------------


def _row(**kw):
    r = {k: None for k, _ in report.ROW_FIELDS}
    r.update(
        collective="all_reduce",
        axis="x",
        library="fourd",
        algorithm="flat",
        in_place=False,
        size_bytes=1024,
        requested_bytes=1024,
        count=256,
        dtype="float32",
        op="sum",
        group_size=2,
        groups=2,
        nodes=1,
        ranks_per_node=2,
        iters=5,
        warmup=1,
        check_iters=1,
        rounds=1,
        time_us=10.0,
        time_us_min=9.0,
        time_us_median=10.0,
        time_us_p99=12.0,
        time_us_max=12.0,
        time_us_rank_avg=9.5,
        algbw_gbps=0.1,
        busbw_gbps=0.1,
        bus_factor=1.0,
        wrong=0,
        times_us=[9.0, 10.0, 12.0],
        round_times_us=[10.0],
    )
    r.update(kw)
    return r


def _doc(rows):
    doc = {k: (t() if isinstance(t, type) else None) for k, t in report.TOP_FIELDS}
    doc.update(
        schema=report.SCHEMA,
        schema_version=report.SCHEMA_VERSION,
        start_time="now",
        duration_s=1.0,
        rows=rows,
        ok=True,
        summary=report.summarize(rows),
    )
    return doc


def test_schema_validation_and_writers(tmp_path):
    rows = [
        _row(),
        _row(library="mpi", algorithm="mpi", time_us=20.0),
        _row(in_place=True, ratio_vs_mpi=2.0),
    ]
    doc = _doc(rows)
    assert report.validate(doc) == []
    bad = json.loads(json.dumps(doc))
    del bad["rows"][0]["busbw_gbps"]
    bad["rows"][1]["time_us"] = "fast"
    bad["schema_version"] = 99
    problems = report.validate(bad)
    assert any("busbw_gbps" in p for p in problems)
    assert any("rows[1].time_us" in p for p in problems)
    assert any("schema_version" in p for p in problems)
    assert report.validate([]) != []

    s = doc["summary"]
    assert s["wrong_total"] == 0 and s["rows"] == 3
    assert s["best_per_size"][0]["best_algorithm"] == "flat"
    assert s["best_per_size"][0]["fastest"] == "flat"

    jp, cp, pp = tmp_path / "x.json", tmp_path / "x.csv", tmp_path / "x.png"
    rows[0]["efficiency"] = float("nan")  # written as null
    report.write_json(str(jp), doc)
    assert json.loads(jp.read_text())["rows"][0]["efficiency"] is None
    auto = _row(
        algorithm="auto",
        auto_choice="ring",
        auto_choices=["ring", "shm"],
        auto_tuning={"state": "settled", "candidates": ["ring", "shm"]},
    )
    report.write_csv(str(cp), rows + [auto])
    with open(cp) as f:
        table = list(csv.DictReader(f))
    assert len(table) == 4 and table[1]["library"] == "mpi" and table[0]["times_us"] == "9 10 12"
    # Lists as space-separated names, objects as JSON; None as an empty field.
    assert table[3]["auto_choices"] == "ring shm" and table[0]["auto_choices"] == ""
    assert json.loads(table[3]["auto_tuning"])["candidates"] == ["ring", "shm"]
    report.write_plot(str(pp), rows, "test")
    assert pp.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


# ---- auto check --------------------------------------------------------------------------------


def test_auto_check_counts_cells_and_the_run_noise():
    def cell(alg, t, med, size, choice=None):
        return _row(
            algorithm=alg, time_us=t, time_us_median=med, size_bytes=size, auto_choice=choice
        )

    rows = [
        # 1 KiB: auto ran ring, 1.05x the fastest (rhd) by time, 1.0x by median: within.
        cell("auto", 10.5, 9.0, 1024, "ring"),
        cell("ring", 12.0, 9.5, 1024),
        cell("rhd", 10.0, 9.0, 1024),
        # 4 KiB: auto ran rhd, 1.5x by time (a stall) but 1.05x by median.
        cell("auto", 30.0, 10.5, 4096, "rhd"),
        cell("rhd", 20.0, 10.0, 4096),
        _row(library="mpi", algorithm="mpi", time_us=1.0, size_bytes=4096),  # not a fourd cell
        # 16 KiB: no auto cell, not counted.
        cell("ring", 5.0, 5.0, 16384),
        # 64 KiB: the groups settled on ring and shm: counted by time (1.2x, a miss), but no
        # single cell ran what auto ran, so not in the noise or the choice figures.
        dict(cell("auto", 12.0, 12.0, 65536, "ring"), auto_choices=["ring", "shm"]),
        cell("ring", 10.0, 10.0, 65536),
        cell("shm", 11.0, 11.0, 65536),
    ]
    ac = report.auto_check(rows)
    assert (ac["cells"], ac["within_by_time"], ac["within_by_median"]) == (3, 1, 2)
    assert ac["groups_split_cells"] == 1
    assert ac["worst"]["size_bytes"] == 4096 and ac["worst"]["ratio"] == pytest.approx(1.5)
    assert ac["worst"]["auto_choice"] == "rhd" and ac["worst"]["best_algorithm"] == "rhd"
    # auto vs the algorithm it ran: |10.5/12 - 1| = 0.125 and |30/20 - 1| = 0.5.
    assert ac["same_algorithm_cells"] == 2
    assert ac["same_algorithm_diff_median"] == pytest.approx(0.125)
    assert ac["same_algorithm_diff_max"] == pytest.approx(0.5)
    # The choice alone: ring's own cell is 1.2x rhd's at 1 KiB (a miss), rhd is the fastest at
    # 4 KiB (within, though auto's cell read 1.5x).
    assert ac["choice_within"] == 1
    assert report.auto_check([cell("ring", 5.0, 5.0, 1024)]) is None
    assert report.summarize(rows)["auto_check"] == ac


# ---- under mpiexec ----------------------------------------------------------------------------


def test_bench_runs_under_mpi(tmp_path):
    """A short real sweep on 4 ranks: every check passes, fourd and baseline rows exist, and the
    three files are valid."""
    jp, cp, pp = tmp_path / "b.json", tmp_path / "b.csv", tmp_path / "b.png"
    r = run_mpi(
        4,
        [
            "-m",
            "fourd.bench",
            "-b",
            "1K",
            "-e",
            "4K",
            "-n",
            "2",
            "--collective",
            "all",
            "-d",
            "float,bf16",
            "--axis",
            "x,world",
            "--json",
            str(jp),
            "--csv",
            str(cp),
            "--plot",
            str(pp),
        ],
        timeout=300,
    )
    out = r.stdout
    assert "# Out of bounds values : 0 OK" in out, out[-3000:]
    assert "Collective test concluded" in out
    assert "# auto within 10% of the fastest single algorithm: " in out, out[-3000:]
    assert (
        "# auto's choice: the algorithm it ran, in its own cell, within 10% of the fastest in "
        in out
    ), out[-3000:]
    doc = json.loads(jp.read_text())
    assert report.validate(doc) == [], report.validate(doc)[:5]
    rows = doc["rows"]
    assert doc["ok"] is True and all(r["wrong"] == 0 for r in rows)
    libs = {r["library"] for r in rows}
    assert {"fourd", "mpi"} <= libs, libs
    assert "torch" in libs or "torch" in json.dumps(doc["skipped"]), doc["skipped"]
    colls = {r["collective"] for r in rows}
    assert colls == {"all_reduce", "all_gather", "reduce_scatter", "broadcast"}
    assert {r["axis"] for r in rows} == {"x", "world"}
    assert {r["dtype"] for r in rows} == {"float32", "bfloat16"}
    auto = [r for r in rows if r["algorithm"] == "auto"]
    assert auto and all(r["auto_choice"] for r in auto)
    # One choice per group of the axis (x: 2 groups), rank 0's group first.
    assert all(
        len(r["auto_choices"]) == r["groups"] and r["auto_choices"][0] == r["auto_choice"]
        for r in auto
    ), [(r["axis"], r["groups"], r["auto_choices"]) for r in auto]
    ar = [r for r in rows if r["library"] == "fourd" and r["collective"] == "all_reduce"]
    assert any(r["ratio_vs_mpi"] for r in ar)
    for r in rows:
        assert r["busbw_gbps"] == pytest.approx(r["algbw_gbps"] * r["bus_factor"], rel=1e-9)
        assert math.isclose(r["algbw_gbps"], r["size_bytes"] / r["time_us"] / 1e3, rel_tol=1e-9)
    assert len(cp.read_text().splitlines()) == len(rows) + 1
    assert pp.read_bytes()[:4] == b"\x89PNG"


def test_batch_timing_under_mpi(tmp_path):
    """--timing batch (nccl-tests' way): one clock read per batch on each rank, so every
    iteration carries the batch average, and the JSON says which timing was used."""
    jp = tmp_path / "b.json"
    r = run_mpi(
        2,
        [
            "-m",
            "fourd.bench",
            "-b",
            "8",
            "-e",
            "64",
            "-n",
            "50",
            "--collective",
            "all_reduce",
            "--algorithm",
            "flat",
            "--baseline",
            "mpi",
            "--timing",
            "batch",
            "--json",
            str(jp),
        ],
        timeout=120,
    )
    assert "--timing batch" in r.stdout, r.stdout[-2000:]
    doc = json.loads(jp.read_text())
    assert report.validate(doc) == [], report.validate(doc)[:5]
    assert doc["timing"]["mode"] == "batch"
    rows = doc["rows"]
    assert {r["library"] for r in rows} == {"fourd", "mpi"}
    for row in rows:
        assert row["wrong"] == 0 and row["iters"] == 50
        assert row["time_us_min"] == pytest.approx(row["time_us_max"], rel=1e-12), row


def test_rounds_under_mpi(tmp_path):
    """--rounds 3: every cell is measured three times and reports its median round, with every
    round's time kept; every round's checks count in #wrong."""
    jp = tmp_path / "b.json"
    r = run_mpi(
        2,
        [
            "-m",
            "fourd.bench",
            "-b",
            "1K",
            "-e",
            "64K",
            "-n",
            "3",
            "-c",
            "2",
            "-R",
            "3",
            "--collective",
            "all_reduce,all_gather",
            "--baseline",
            "mpi",
            "--json",
            str(jp),
        ],
        timeout=180,
    )
    assert "rounds 3 (rotated order; median round)" in r.stdout, r.stdout[-2000:]
    doc = json.loads(jp.read_text())
    assert report.validate(doc) == [], report.validate(doc)[:5]
    assert doc["timing"]["rounds"] == 3 and doc["ok"] is True
    rows = doc["rows"]
    assert {r["library"] for r in rows} == {"fourd", "mpi"} and len(rows) > 10
    for row in rows:
        rt = row["round_times_us"]
        assert row["rounds"] == 3 and len(rt) == 3 and rt == sorted(rt), row
        assert row["time_us"] == pytest.approx(rt[1], abs=1e-3), row
        assert row["wrong"] == 0


def test_bench_bad_argument_under_mpi():
    """Rank 0 prints one message, every rank exits with status 2, nothing hangs or aborts."""
    r = run_mpi(4, ["-m", "fourd.bench", "--grid", "x=3"], timeout=120, check=False)
    assert r.returncode == 2, r.stdout[-2000:]
    assert r.stdout.count("error:") == 1, r.stdout
    assert "Abort" not in r.stdout and "BAD TERMINATION" not in r.stdout

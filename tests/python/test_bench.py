"""python -m fourd.bench: command line, check oracle, bounds, JSON schema, files, progress and
summary (serial), plus short real runs under mpiexec: a sweep, the timing modes, the command
line's habits, interrupted runs and a bad argument."""

import csv
import json
import math
import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest

from fourd.bench import bounds, check, report
from fourd.bench.options import DTYPES, HelpRequested, UsageError, default_grid, parse, parse_rate
from mpirun import ROOT, mpiexec, run_mpi


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
    assert default_grid(2, ["a", "a"])[:2] == ({"x": 1, "y": 1, "z": 1, "data": 2}, None)
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
    assert bounds.memcpy_bandwidth(1 << 20, 0.01) > 1e6
    assert (
        bounds.COPY_MIN_BYTES
        <= bounds.copy_bytes(1 << 20)
        <= bounds.copy_bytes(1)
        <= bounds.COPY_BYTES
    )


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
            "2K",
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
    _check_sweep_rows(rows)
    assert len(cp.read_text().splitlines()) == len(rows) + 1
    assert pp.read_bytes()[:4] == b"\x89PNG"


def _check_sweep_rows(rows: list) -> None:
    """The rows of test_bench_runs_under_mpi: every collective, axis and dtype asked for,
    auto's choices, the MPI ratio, and the bandwidths' arithmetic."""
    colls = {r["collective"] for r in rows}
    assert colls == {"all_reduce", "all_gather", "reduce_scatter", "broadcast"}
    assert {r["axis"] for r in rows} == {"x", "world"}
    assert {r["dtype"] for r in rows} == {"float32", "bfloat16"}
    _check_auto_choices(rows)
    ar = [r for r in rows if r["library"] == "fourd" and r["collective"] == "all_reduce"]
    assert any(r["ratio_vs_mpi"] for r in ar)
    for r in rows:
        assert r["busbw_gbps"] == pytest.approx(r["algbw_gbps"] * r["bus_factor"], rel=1e-9)
        assert math.isclose(r["algbw_gbps"], r["size_bytes"] / r["time_us"] / 1e3, rel_tol=1e-9)


def _check_auto_choices(rows: list) -> None:
    auto = [r for r in rows if r["algorithm"] == "auto"]
    assert auto and all(r["auto_choice"] for r in auto)
    # One choice per group of the axis (x: 2 groups), rank 0's group first.
    assert all(
        len(r["auto_choices"]) == r["groups"] and r["auto_choices"][0] == r["auto_choice"]
        for r in auto
    ), [(r["axis"], r["groups"], r["auto_choices"]) for r in auto]


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


# ---- the first hour of a new user (issue 23): the command line ---------------------------------


def test_one_rank_says_how_to_launch():
    """Started without mpiexec there is one rank: the error says how to launch, with the
    user's own options."""
    with pytest.raises(UsageError) as e:
        parse(["-b", "1M"], 1, ["h"], {})
    msg = str(e.value)
    assert "mpiexec -n 4 python -m mpi4py -m fourd.bench -b 1M" in msg, msg
    assert "nothing to measure" in msg and "--axis" not in msg, msg
    with pytest.raises(HelpRequested):  # -h still works on one rank
        parse(["-h"], 1, ["h"], {})


def test_ngpus_one_is_accepted_with_a_note():
    cfg = p4("-g", "1")
    assert any("-g 1" in n and "one device per rank" in n for n in cfg.notes), cfg.notes
    assert not any("-g" in n for n in p4().notes)
    with pytest.raises(UsageError) as e:
        p4("-g", "2")
    assert "-g/--ngpus" in str(e.value) and "one rank per GPU" in str(e.value), str(e.value)


def test_grid_keeps_the_virtual_nodes():
    """--grid on one host keeps the nodes the default grid has (2 ranks each on 4 ranks);
    --ranks-per-node changes them; on several hosts the real nodes stay."""
    cfg = p4("--grid", "x=2,y=2")
    assert cfg.grid == {"x": 2, "y": 2, "z": 1, "data": 1}
    assert cfg.ranks_per_node == p4().ranks_per_node == 2
    assert "virtual nodes of 2 ranks" in cfg.grid_source, cfg.grid_source
    assert p4("--grid", "x=4", "--ranks-per-node", "4").ranks_per_node == 4
    assert p4("--grid", "x=2,y=2", hosts=["a", "a", "b", "b"]).ranks_per_node is None
    assert parse(["--grid", "data=2"], 2, ["h", "h"], {}).ranks_per_node is None  # the real node


def test_explicit_warmup_is_known():
    """-w given bounds auto's wait for its tuning too (runner.py): the parse says it was given,
    even when it is the default's value."""
    assert (p4().warmup, p4().warmup_requested) == (5, False)
    assert (p4("-w", "5").warmup, p4("-w", "5").warmup_requested) == (5, True)
    assert p4("-w", "0").warmup == 0
    assert p4("--no-progress").no_progress and not p4().no_progress


def test_plural_words():
    assert report.plural(1, "cell") == "1 cell" and report.plural(2, "note") == "2 notes"
    assert report.plural(0, "row") == "0 rows"


# ---- progress ----------------------------------------------------------------------------------


def _fake_proc(root, pid, comm, ppid, fd1=None):
    d = root / str(pid)
    (d / "fd").mkdir(parents=True)
    (d / "comm").write_text(comm + "\n")
    (d / "stat").write_text(f"{pid} ({comm}) S {ppid} 1 1 0 -1\n")
    if fd1 is not None:
        (d / "fd" / "1").symlink_to(fd1)


def test_the_launchers_terminal_is_found(tmp_path):
    """A rank's stdout is a pipe to hydra's proxy; what the user sees is the stdout of the
    mpiexec above it."""
    from fourd.bench.progress import job_stream_is_terminal

    proc = tmp_path / "proc"
    _fake_proc(proc, 10, "hydra_pmi_proxy", 9, "pipe:[1]")
    _fake_proc(proc, 9, "mpiexec", 8, "/dev/pts/3")
    _fake_proc(proc, 8, "bash", 1, "/dev/pts/3")
    _fake_proc(proc, 20, "hydra_pmi_proxy", 19, "pipe:[2]")
    _fake_proc(proc, 19, "mpiexec", 8, str(tmp_path / "out.txt"))  # mpiexec ... > out.txt
    r, w = os.pipe()
    try:
        with os.fdopen(w, "w", closefd=False) as pipe:
            assert job_stream_is_terminal(pipe, 1, str(proc), ppid=10)
            assert not job_stream_is_terminal(pipe, 1, str(proc), ppid=20)
            assert not job_stream_is_terminal(pipe, 1, str(proc), ppid=8)  # no launcher above
    finally:
        os.close(r)
        os.close(w)
    with open(tmp_path / "file.txt", "w") as f:  # a rank writing to a file: never a terminal
        assert not job_stream_is_terminal(f, 1, str(proc), ppid=10)


def test_progress_into_a_file_has_no_escape_codes(monkeypatch):
    import io

    from fourd.bench import progress

    clock = [100.0]
    monkeypatch.setattr(progress.time, "perf_counter", lambda: clock[0])
    out = io.StringIO()
    p = progress.Progress("lines", out)
    p.start(100, 50.0)
    for i in range(100):
        clock[0] += 0.5
        p.step(f"cell {i}", est_s=0.5)
    p.clear()
    text = out.getvalue()
    assert "\x1b" not in text and "\r" not in text, text
    lines = text.splitlines()
    assert 5 <= len(lines) <= 12 and all(x.startswith("# progress: ") for x in lines), lines
    assert "about" in lines[0] and "left" in lines[0]
    assert progress.duration(190) == "3 min 10 s" and progress.duration(45) == "45 s"


# ---- incremental files -------------------------------------------------------------------------


def test_files_are_valid_after_every_row(tmp_path):
    """files.Outputs rewrites the JSON and the CSV atomically after each row: after every row
    both parse, the JSON validates, and both hold exactly the rows so far (a ratio filled in
    later, by the torch pass, reaches the files too)."""
    from fourd.bench import files

    jp, cp = tmp_path / "r.json", tmp_path / "r.csv"
    rows = []

    def document(state):
        doc = _doc(rows)
        doc["progress"] = {"state": state}
        return doc

    out = files.Outputs(str(jp), str(cp), document, share=0)
    out.update(rows)
    assert json.loads(jp.read_text())["rows"] == [] and len(cp.read_text().splitlines()) == 1
    for i in range(6):
        rows.append(_row(size_bytes=1024 << i, requested_bytes=1024 << i))
        assert out.update(rows)
        doc = json.loads(jp.read_text())
        assert report.validate(doc) == [], report.validate(doc)[:3]
        assert [r["size_bytes"] for r in doc["rows"]] == [1024 << k for k in range(i + 1)]
        with open(cp) as f:
            assert len(list(csv.DictReader(f))) == i + 1
    rows[0]["ratio_vs_torch"] = 3.5
    out.update(rows, "complete")
    assert json.loads(jp.read_text())["rows"][0]["ratio_vs_torch"] == 3.5
    assert json.loads(jp.read_text())["progress"]["state"] == "complete"
    with open(cp) as f:
        assert float(next(csv.DictReader(f))["ratio_vs_torch"]) == 3.5
    assert [p.name for p in tmp_path.iterdir() if p.name.endswith(".tmp")] == []
    # The kept rows give exactly what json.dump writes.
    report.write_json(str(tmp_path / "plain.json"), document("complete"))
    assert files.json_text(document("complete")) == (tmp_path / "plain.json").read_text()


def test_rewrites_take_a_bounded_share(tmp_path, monkeypatch):
    """A rewrite that took t waits t / SHARE before the next "running" one; a final state is
    written at once."""
    from fourd.bench import files

    clock = [0.0]

    def slow_replace(path, text):
        clock[0] += 0.1  # every write takes 0.1 s

    monkeypatch.setattr(files.time, "monotonic", lambda: clock[0])
    monkeypatch.setattr(files, "replace_atomically", slow_replace)
    out = files.Outputs(str(tmp_path / "r.json"), None, lambda state: _doc([]), share=0.05)
    assert out.update([]) and not out.update([])  # the next may come 0.1 / 0.05 = 2 s later
    clock[0] += 1.0
    assert not out.update([])
    clock[0] += 1.0
    assert out.update([])
    assert out.update([], "interrupted") and out.writes == 3


# ---- the summary's words -----------------------------------------------------------------------


def _summary_text(rows, **run):
    import io

    from fourd.bench.printer import Printer, print_summary

    buf = io.StringIO()
    print_summary(Printer(True, False, stream=buf), report.summarize(rows), 1.0, 1, run)
    return buf.getvalue()


def test_the_verdict_says_too_noisy():
    """When auto's cell and the cell of the algorithm it ran (the same code) differ by more
    than the margin, the run says plainly that it cannot compare."""
    noisy = [
        _row(algorithm="auto", auto_choice="ring", time_us=13.0, time_us_median=13.0),
        _row(algorithm="ring", time_us=10.0, time_us_median=10.0),
        _row(algorithm="rhd", time_us=11.0, time_us_median=11.0),
    ]
    v = report.summarize(noisy)["verdict"]
    assert v["too_noisy"] and v["basis"] == "same code" and v["noise_median"] == pytest.approx(0.3)
    text = _summary_text(noisy, rounds=1, load=4.9, cores=2)
    assert "# verdict: too noisy to compare within 10%" in text, text
    assert "rerun with -R 5 on a quiet machine" in text and "load average 4.9 on 2 cores" in text
    quiet = [dict(noisy[0], time_us=10.2, time_us_median=10.2), *noisy[1:]]
    assert not report.summarize(quiet)["verdict"]["too_noisy"]
    assert "# verdict: quiet enough to compare within 10%" in _summary_text(quiet)


def test_the_summary_does_not_read_like_bugs():
    """A worst cell whose fastest algorithm is the one auto ran is noise and says so; a
    stalled cell says so; counts take the singular."""
    rows = [
        _row(algorithm="auto", auto_choice="ring", time_us=45.6, time_us_median=9.0),
        _row(algorithm="ring", time_us=10.0, time_us_median=10.0),
        _row(algorithm="rhd", time_us=12.0, time_us_median=12.0),
    ]
    text = _summary_text(rows)
    assert "auto ran ring, itself the fastest single algorithm there, so the gap is the run's" in (
        text
    ), text
    assert "auto's cell stalled (its mean 5.1x its median)" in text, text
    assert "fastest ring" not in text
    assert "1 note about skipped cells" in text and "1 notes" not in text
    assert "(same code, 1 cell)" in text and "1 cells" not in text, text
    assert report.stalled(rows[0]) and not report.stalled(rows[1])


def test_tables_show_only_the_baselines_measured_and_fit_long_names():
    import io

    from fourd.bench.options import AxisSpec
    from fourd.bench.printer import Printer, algorithm_width

    class Impl:
        def __init__(self, library, algorithm):
            self.library, self.algorithm = library, algorithm
            self.label = algorithm if library == "fourd" else library

    class Row:
        nbytes, count, dtype, opname = 1024, 256, "float32", "sum"
        bnd = {"t_min_s": 1e-7}

    buf = io.StringIO()
    pr = Printer(True, False, stream=buf)
    pr.alg_width = algorithm_width(["auto", "hierarchical", "mpi"], ["auto", "ring", "flat"])
    info = {"description": "1 node x 2 ranks", "groups": 1, "bound_text": "c(k-1)/k S/Bi"}
    pr.table_header("all_reduce", AxisSpec("x", 1, 2), info, ["vs mpi"])
    auto, hier, mpi = Impl("fourd", "auto"), Impl("fourd", "hierarchical"), Impl("mpi", "mpi")
    cells = {
        auto: _row(algorithm="auto", auto_choice="ring", auto_choices=["ring", "flat"]),
        hier: _row(algorithm="hierarchical", ratio_vs_mpi=2.0),
        mpi: _row(library="mpi", algorithm="mpi", time_us=20.0),
    }
    pr.size_rows(Row(), [(i, {False: c}) for i, c in cells.items()], ["mpi"])
    text = buf.getvalue()
    assert "vs mpi" in text and "vs torch" not in text, text
    lines = [x for x in text.splitlines() if not x.startswith("#")]
    assert "auto(ring|flat)" in lines[0] and "hierarchical" in lines[1], lines
    # Every line's columns line up: the fields after the algorithm start at one offset.
    ends = {x.index(" 0.10") for x in lines}
    assert len(ends) == 1, lines
    assert "2.00x" in lines[1]
    assert "1 group at once" in text, text


# ---- torch.distributed on fourd's backend (--baseline torch-fourd) -----------------------------


class _Impl:
    def __init__(self, library, algorithm):
        self.library, self.algorithm = library, algorithm
        self.label = algorithm if library == "fourd" else library


def test_torch_fourd_is_a_baseline_when_asked():
    """torch-fourd (torch.distributed on backend fourd) is measured when named, or with all;
    without --baseline the baselines stay mpi and torch."""
    assert p4("--baseline", "torch-fourd").baselines == ["torch-fourd"]
    assert p4("--baseline", "torch-fourd,mpi").baselines == ["torch-fourd", "mpi"]
    assert p4("--baseline", "all").baselines == ["mpi", "torch", "torch-fourd"]
    assert p4().baselines == ["mpi", "torch"]


def test_the_vs_fourd_column(tmp_path):
    """A table with torch-fourd has a vs fourd column, filled on the torch-fourd line only
    (t_torch-fourd / t_auto) while the fourd lines keep vs mpi; the summary has vs fourd on
    the torch-fourd line; the JSON and the CSV carry ratio_vs_fourd."""
    import io

    from fourd.bench.options import AxisSpec
    from fourd.bench.printer import Printer
    from fourd.bench.runner import ratio_columns

    class Row:
        nbytes, count, dtype, opname = 1024, 256, "float32", "sum"
        bnd = {"t_min_s": 1e-7}

    auto, tf, mpi = _Impl("fourd", "auto"), _Impl("torch-fourd", "torch-fourd"), _Impl("mpi", "mpi")
    cols = ratio_columns([auto, mpi, tf])
    assert cols == ["mpi", "fourd"]
    rows = [
        _row(algorithm="auto", auto_choice="ring", in_place=True, ratio_vs_mpi=2.0),
        _row(library="torch-fourd", algorithm="torch-fourd", in_place=True, time_us=11.0),
        _row(library="mpi", algorithm="mpi", in_place=True, time_us=20.0),
    ]
    rows[1]["ratio_vs_fourd"] = 1.1
    buf = io.StringIO()
    pr = Printer(True, False, stream=buf)
    info = {"description": "1 node x 2 ranks", "groups": 1, "bound_text": "c(k-1)/k S/Bi"}
    pr.table_header("all_reduce", AxisSpec("x", 1, 2), info, [f"vs {c}" for c in cols])
    pr.size_rows(Row(), [(i, {True: r}) for i, r in zip((auto, tf, mpi), rows)], cols)
    text = buf.getvalue()
    assert "vs mpi" in text and "vs fourd" in text, text
    lines = [x for x in text.splitlines() if not x.startswith("#")]
    assert "2.00x" in lines[0] and "1.10x" not in lines[0], lines
    assert "1.10x" in lines[1] and "2.00x" not in lines[1], lines
    assert "x" not in lines[2].split("mpi", 1)[1], lines  # the mpi line has no ratio
    per = {s["library"]: s for s in report.summarize(rows)["per_algorithm"]}
    assert per["torch-fourd"]["ratio_vs_fourd"] == pytest.approx(1.1)
    assert per["fourd"]["ratio_vs_fourd"] is None and per["mpi"]["ratio_vs_fourd"] is None
    assert "vs fourd" in _summary_text(rows)
    assert report.validate(_doc(rows)) == []
    cp = tmp_path / "r.csv"
    report.write_csv(str(cp), rows)
    with open(cp) as f:
        table = list(csv.DictReader(f))
    assert [r["ratio_vs_fourd"] for r in table] == ["", "1.1", ""]


def _check_torch_fourd_rows(rows: list) -> None:
    """torch-fourd's cells are those torch has, and each one's vs fourd is its time over the
    time of auto's cell of the same size and placement."""
    auto = {_cell_key(x): x for x in rows if x["algorithm"] == "auto"}
    mine = [x for x in rows if x["library"] == "torch-fourd"]
    assert {(x["collective"], x["in_place"]) for x in mine} == {
        ("all_reduce", True),  # torch's all_reduce is in place only
        ("all_gather", False),
        ("all_gather", True),
        ("reduce_scatter", False),
        ("reduce_scatter", True),
        ("broadcast", True),
    }, mine
    for x in mine:
        a = auto[_cell_key(x)]
        assert x["ratio_vs_fourd"] == pytest.approx(x["time_us"] / a["time_us"], rel=1e-9)
        assert x["ratio_vs_mpi"] is None and x["ratio_vs_torch"] is None


def _cell_key(row: dict) -> tuple:
    return (row["collective"], row["axis"], row["dtype"], row["size_bytes"], row["in_place"])


def test_torch_on_fourd_next_to_gloo_and_mpi_under_mpi(tmp_path):
    """--baseline all on 4 ranks: torch.distributed on backend fourd in the same run as direct
    fourd, MPI and gloo; every check exact; its groups are the grid's own communicators of
    the axes; every torch-fourd row's vs fourd is its time over auto's cell of the same size
    and placement; the column, the JSON and the CSV have it."""
    jp, cp = tmp_path / "t.json", tmp_path / "t.csv"
    argv = ["-m", "fourd.bench", "-b", "1K", "-e", "4K", "-n", "2", "--collective", "all"]
    argv += ["--axis", "x,world", "--algorithm", "auto", "--baseline", "all"]
    r = run_mpi(4, [*argv, "--json", str(jp), "--csv", str(cp)], timeout=300)
    out = r.stdout
    assert "# Out of bounds values : 0 OK" in out, out[-3000:]
    assert "vs fourd" in out and "torch-fourd = torch.distributed" in out, out[:4000]
    doc = json.loads(jp.read_text())
    assert report.validate(doc) == [], report.validate(doc)[:5]
    rows = doc["rows"]
    assert {x["library"] for x in rows} == {"fourd", "mpi", "torch", "torch-fourd"}, doc["skipped"]
    assert all(x["wrong"] == 0 for x in rows)
    base = doc["baselines"]["torch-fourd"]
    assert base["available"] and base["backend"] == "fourd" and base["grid_communicators"], base
    assert set(base["communicators"]) == {"x", "world"}
    assert doc["baselines"]["torch"]["default_group"] == "fourd"
    _check_torch_fourd_rows(rows)
    per = [s for s in doc["summary"]["per_algorithm"] if s["library"] == "torch-fourd"]
    assert per and all(s["ratio_vs_fourd"] for s in per)
    with open(cp) as f:
        table = list(csv.DictReader(f))
    assert len(table) == len(rows) and "ratio_vs_fourd" in table[0]


# ---- the plot ----------------------------------------------------------------------------------


def test_the_plots_bound_has_a_latency_floor(tmp_path):
    """At small sizes the bound's busbw comes from ceil(log2 p) message latencies, not from
    the bandwidth alone (which put it two decades above every curve)."""
    r = _row(group_size=4, size_bytes=1024, bound_us=0.1, bus_factor=1.5)
    assert report.latency_floor_s(4, 2e-6) == pytest.approx(4e-6)
    assert report.latency_floor_s(5, 2e-6) == pytest.approx(6e-6)
    assert report.latency_floor_s(1, 2e-6) == 0.0
    assert report.bound_busbw(r) == pytest.approx(1024 / 0.1e-6 / 1e9 * 1.5)
    assert report.bound_busbw(r, 2e-6) == pytest.approx(1024 / 4e-6 / 1e9 * 1.5)
    big = dict(r, size_bytes=1 << 24, bound_us=5000.0)
    assert report.bound_busbw(big, 2e-6) == report.bound_busbw(big)  # the bandwidth decides
    pp = tmp_path / "p.png"
    report.write_plot(str(pp), [r, dict(r, algorithm="ring"), big], "t", latency_s=2e-6)
    assert pp.read_bytes()[:4] == b"\x89PNG"


# ---- signals -----------------------------------------------------------------------------------


def test_a_signal_is_recorded_not_acted_on(monkeypatch):
    """The handler records the signal for the next agreement (runner.py); the same signal
    arriving twice at once (from the terminal and from mpiexec) is one stop; one arriving
    later raises KeyboardInterrupt, Python's default."""
    import signal as sig

    from fourd.bench import stop

    clock = [10.0]
    monkeypatch.setattr(stop.time, "monotonic", lambda: clock[0])
    req = stop.StopRequest()
    old = sig.getsignal(sig.SIGINT)
    req.install()
    try:
        assert sig.getsignal(sig.SIGINT) == req._handler
        req._handler(sig.SIGINT, None)
        req._handler(sig.SIGINT, None)
        assert req.signum == sig.SIGINT
        clock[0] += stop.ESCALATE_S + 1
        with pytest.raises(KeyboardInterrupt):
            req._handler(sig.SIGINT, None)
    finally:
        req.restore()
    assert sig.getsignal(sig.SIGINT) == old
    assert stop.signal_name(sig.SIGTERM) == "SIGTERM"


# ---- the first hour, under mpiexec ---------------------------------------------------------------


def test_without_mpiexec_says_how_to_launch():
    r = subprocess.run(
        [sys.executable, "-m", "fourd.bench", "-e", "1M"],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=ROOT,
        stdin=subprocess.DEVNULL,
    )
    assert r.returncode == 2, r.stdout + r.stderr
    assert "mpiexec -n 4 python -m mpi4py -m fourd.bench -e 1M" in r.stderr, r.stderr


def test_cli_habits_under_mpi(tmp_path):
    """-g 1 accepted with its note; with --baseline mpi no "vs torch" anywhere; the header's
    estimate; no escape codes into a pipe; an explicit -w bounds auto's wait for its tuning
    (its cells are then timed while it explores, and a note says so)."""
    jp = tmp_path / "b.json"
    r = run_mpi(
        2,
        [
            "-m",
            "fourd.bench",
            "-b",
            "1K",
            "-e",
            "4K",
            "-g",
            "1",
            "-w",
            "0",
            "--collective",
            "all_reduce",
            "--algorithm",
            "auto",
            "--baseline",
            "mpi",
            "--json",
            str(jp),
        ],
        timeout=180,
    )
    out = r.stdout
    assert "-g 1: fourd drives one device per rank" in out, out[-3000:]
    assert "vs mpi" in out and "vs torch" not in out, out[-3000:]
    assert re.search(r"# estimate: the sweep should take about \d+ s", out), out[:3000]
    assert "\x1b" not in out and "\r" not in out
    assert "auto was timed before its tuning settled" in out, out[-3000:]
    doc = json.loads(jp.read_text())
    assert report.validate(doc) == [] and doc["progress"]["state"] == "complete"
    auto = [row for row in doc["rows"] if row["algorithm"] == "auto"]
    # Timed while exploring: its state then (the timed calls themselves may finish it).
    assert auto and any(row["auto_tuning"]["timed_unsettled"] for row in auto), auto
    assert doc["bandwidth"]["latency_s"] > 0


def _descendants(pid: int) -> list[int]:
    kids: dict = {}
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                st = (d / "stat").read_text()
            except OSError:
                continue
            kids.setdefault(int(st[st.rindex(")") + 2 :].split()[1]), []).append(int(d.name))
    out, todo = [], [pid]
    while todo:
        for k in kids.get(todo.pop(), []):
            out.append(k)
            todo.append(k)
    return out


def _rank_pid(launcher: int, rank: int) -> int:
    """The pid of a rank of the job under `launcher` (hydra gives each rank PMI_RANK)."""
    for pid in _descendants(launcher):
        try:
            env = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
            cmd = Path(f"/proc/{pid}/cmdline").read_bytes()
        except OSError:
            continue
        if f"PMI_RANK={rank}".encode() in env and b"fourd.bench" in cmd:
            return pid
    pytest.fail(f"no rank {rank} under pid {launcher}")


def _estimate_s(text: str) -> float | None:
    m = re.search(r"# estimate: the sweep should take about (?:(\d+) min )?(\d+) s", text)
    return None if m is None else 60 * int(m.group(1) or 0) + int(m.group(2))


def _table_cells(text: str) -> set:
    """(size, implementation) of every printed table line (auto(x) is auto)."""
    cells = set()
    for line in text.splitlines():
        f = line.split()
        if len(f) > 6 and not line.startswith("#") and f[0].isdigit():
            cells.add((int(f[0]), "auto" if f[4].startswith("auto(") else f[4]))
    return cells


def _interrupted_run(tmp_path, sig, target) -> tuple[int, str]:
    """A 2-rank sweep with --json/--csv/--plot, sent `sig` at about half its estimated time,
    through mpiexec (which forwards it to every rank) or to rank 0 alone."""
    args = ["-m", "fourd.bench", "-b", "1K", "-e", "1M", "-f", "2", "--collective"]
    args += ["all_reduce", "--baseline", "mpi", "--progress", "--target-time", "0.1"]
    for opt, name in (("--json", "b.json"), ("--csv", "b.csv"), ("--plot", "b.png")):
        args += [opt, str(tmp_path / name)]
    proc = subprocess.Popen(
        [mpiexec(), "-n", "2", sys.executable, "-m", "mpi4py", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL,
        start_new_session=True,
        cwd=str(ROOT),
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
        text=True,
    )
    lines: list = []
    reader = threading.Thread(target=lambda: lines.extend(proc.stdout), daemon=True)
    reader.start()
    try:
        deadline = time.monotonic() + 240
        while _estimate_s("".join(lines)) is None or not _table_cells("".join(lines)):
            assert proc.poll() is None and time.monotonic() < deadline, "".join(lines)[-3000:]
            time.sleep(0.1)
        # Half time, and late enough for a progress line (shown from 2 s into the sweep).
        time.sleep(max(3.0, _estimate_s("".join(lines)) / 2))
        os.kill(proc.pid if target == "mpiexec" else _rank_pid(proc.pid, 0), sig)
        rc = proc.wait(timeout=240)
    except BaseException:
        os.killpg(proc.pid, signal.SIGKILL)
        raise
    reader.join(timeout=30)
    return rc, "".join(lines)


@pytest.mark.parametrize(
    "sig, target",
    [(signal.SIGINT, "mpiexec"), (signal.SIGINT, "rank 0"), (signal.SIGTERM, "mpiexec")],
    ids=["SIGINT-to-mpiexec", "SIGINT-to-rank-0", "SIGTERM-to-mpiexec"],
)
def test_an_interrupted_run_keeps_every_row(tmp_path, sig, target):
    """Interrupted at half time, by a signal that mpiexec forwards to every rank or one that
    reaches rank 0 alone: every rank stops after the same cell, the run exits with 128 + the
    signal, and the JSON, the CSV and the plot hold exactly the rows printed."""
    rc, out = _interrupted_run(tmp_path, sig, target)
    name = signal.Signals(sig).name
    assert rc == 128 + sig, out[-3000:]
    assert f"# stopped by {name} after " in out, out[-3000:]
    assert "\x1b" not in out and "# progress: " in out, out[-3000:]
    doc = json.loads((tmp_path / "b.json").read_text())
    assert report.validate(doc) == [], report.validate(doc)[:5]
    prog = doc["progress"]
    assert prog["state"] == "interrupted" and prog["signal"] == name, prog
    assert 0 < prog["cells_done"] < prog["cells_planned"], prog
    assert doc["ok"] is True  # every check measured passed: a stop is not a failure
    rows = doc["rows"]
    with open(tmp_path / "b.csv") as f:
        table = list(csv.DictReader(f))
    key = ("algorithm", "size_bytes", "in_place")
    assert [tuple(str(r[k]) for k in key) for r in rows] == [
        tuple(t[k] for k in key) for t in table
    ]
    printed = _table_cells(out)
    assert printed == {
        (r["size_bytes"], r["library"] if r["library"] != "fourd" else r["algorithm"]) for r in rows
    }, (sorted(printed), len(rows))
    assert (tmp_path / "b.png").read_bytes()[:4] == b"\x89PNG"
    assert doc["summary"]["rows"] == len(rows)


def test_the_estimate_prices_autos_exploration():
    """Tuning in use explores before auto is timed: 640 calls for 4 candidates below 256 KiB,
    112 at 1 MiB, 72 at 4-16 MiB (docs/algorithms.md, as explain()["tuning"] reports after the
    first call); nothing with a single candidate."""
    from fourd.bench.runner import explore_seconds

    four = {a: 1e-5 for a in ("flat", "ring", "rhd", "shm")} | {"auto": 1e-5}
    assert explore_seconds(1024, four, "ring") == pytest.approx(640e-5)
    assert explore_seconds(1 << 20, four, "ring") == pytest.approx(112e-5)
    assert explore_seconds(16 << 20, four, "ring") == pytest.approx(72e-5)
    # Above 256 KiB only the candidates within 4x of the choice explore.
    slow = dict(four, shm=1e-3)
    assert explore_seconds(1 << 20, slow, "ring") == pytest.approx(84e-5)
    assert explore_seconds(1 << 20, dict(four, shm=3e-5), "ring") == pytest.approx(168e-5)
    assert explore_seconds(1 << 20, {"ring": 1e-5, "auto": 1e-5}, "ring") == 0.0


def test_vs_mpi_reads_auto_against_mpi_per_size_and_lists_the_cells_behind(tmp_path):
    """bench/vs_mpi.py: t_mpi / t_auto per collective and size (geometric mean over the cells),
    every cell under --floor with what each of the axis's groups ran."""
    rows = []
    for size, t_auto, t_mpi, choices in (
        (1024, 10.0, 20.0, ["flat"]),
        (4096, 40.0, 20.0, ["shm", "rhd"]),
    ):
        for in_place in (False, True):
            rows.append(
                _row(
                    algorithm="auto",
                    size_bytes=size,
                    in_place=in_place,
                    time_us=t_auto,
                    auto_choice=choices[0],
                    auto_choices=choices,
                )
            )
            rows.append(
                _row(
                    library="mpi",
                    algorithm="mpi",
                    size_bytes=size,
                    in_place=in_place,
                    time_us=t_mpi,
                )
            )
    rows[1]["time_us"] = 40.0  # 1 KiB out of place: MPI 40 us, auto 10: 4x; in place 2x
    path = tmp_path / "run.json"
    path.write_text(json.dumps({"command": ["python -m fourd.bench"], "rows": rows}))
    r = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "vs_mpi.py"), str(path)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert r.returncode == 0, r.stderr
    assert "| 1K | 2.83 (2.00-4.00) |" in r.stdout  # sqrt(4 * 2)
    assert "| 4K | 0.50 (0.50-0.50) |" in r.stdout
    assert "# cells under 0.95: 2 of 4" in r.stdout
    assert (
        "all_reduce 4K x in place float32: 0.50x (auto ran shm|rhd; 40.0 us vs MPI 20.0 us)"
        in r.stdout
    )

"""Writes the report of bench/gpu_check.sh: report.txt (for people) and report.json.

Reads what the steps left behind and never fails on a missing or broken piece: a step that did
not run simply has no section, and its status line says why.

Inputs (all in --work unless said otherwise):
  steps.tsv            name <TAB> status <TAB> seconds <TAB> note, one line per step
  meta.txt             key=value lines (date, gpu, arguments, ...)
  <step>.log           each step's output
  --results/kernel_bench.json, torch_baseline.json, gtest.json
Standard library only, so any Python 3 runs it.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys


def read_json(path: str):
    try:
        with open(path) as f:
            text = f.read().strip()
    except OSError:
        return None
    # A whole JSON document (gtest), else the last line (the benchmarks print one JSON line).
    for candidate in (text, text.splitlines()[-1] if text else ""):
        try:
            return json.loads(candidate)
        except ValueError:
            continue
    return None


def tail(path: str, n: int) -> list[str]:
    try:
        with open(path, errors="replace") as f:
            return f.read().splitlines()[-n:]
    except OSError:
        return []


def read_steps(path: str) -> list[dict]:
    steps = []
    try:
        with open(path) as f:
            for line in f:
                parts = line.rstrip("\n").split("\t")
                if len(parts) >= 3:
                    steps.append(
                        {
                            "name": parts[0],
                            "status": parts[1],
                            "seconds": int(parts[2]) if parts[2].isdigit() else parts[2],
                            "note": parts[3] if len(parts) > 3 else "",
                        }
                    )
    except OSError:
        pass
    return steps


def read_meta(path: str) -> dict:
    meta = {}
    try:
        with open(path) as f:
            for line in f:
                if "=" in line:
                    k, v = line.rstrip("\n").split("=", 1)
                    meta[k] = v
    except OSError:
        pass
    return meta


def gtest_summary(g) -> dict | None:
    if not isinstance(g, dict):
        return None
    out = {
        "tests": g.get("tests", 0),
        "failures": g.get("failures", 0),
        "disabled": g.get("disabled", 0),
        "errors": g.get("errors", 0),
        "skipped": 0,
        "failed": [],
    }
    for suite in g.get("testsuites", []):
        for t in suite.get("testsuite", []):
            name = f"{suite.get('name')}.{t.get('name')}"
            if t.get("result") == "SKIPPED" or t.get("status") == "NOTRUN":
                out["skipped"] += 1
            if t.get("failures"):
                msg = t["failures"][0].get("failure", "").strip().splitlines()
                out["failed"].append(f"{name}: {msg[0] if msg else ''}"[:300])
    return out


def pytest_summary(lines: list[str]) -> str:
    pat = re.compile(r"\d+ (passed|failed|skipped|error|errors|deselected|xfailed)")
    for line in reversed(lines):
        if pat.search(line) or "no tests ran" in line:
            return line.strip("= ").strip()
    return ""


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--work", required=True)
    ap.add_argument("--results", required=True)
    args = ap.parse_args(argv)

    steps = read_steps(os.path.join(args.work, "steps.tsv"))
    meta = read_meta(os.path.join(args.work, "meta.txt"))
    kb = read_json(os.path.join(args.results, "kernel_bench.json"))
    tb = read_json(os.path.join(args.results, "torch_baseline.json"))
    gt = gtest_summary(read_json(os.path.join(args.results, "gtest.json")))

    out: list[str] = []
    w = out.append
    w(f"fourd GPU check, {meta.get('date', '?')}")
    w(
        f"  GPU: {meta.get('gpu', '?')}   nvcc: {meta.get('nvcc', '?')}   "
        f"python: {meta.get('python', '?')}"
    )
    w(f"  commit: {meta.get('commit', '?')}   arguments: {meta.get('args', '')}")
    total = sum(s["seconds"] for s in steps if isinstance(s["seconds"], int))
    w("")
    w(f"Steps ({total} s in all):")
    for s in steps:
        note = f"  {s['note']}" if s["note"] else ""
        w(f"  {s['name']:<16} {s['status']:<8} {s['seconds']!s:>5} s{note}")

    if gt is not None:
        w("")
        passed = gt["tests"] - gt["failures"] - gt["errors"] - gt["skipped"] - gt["disabled"]
        w(
            f"GPU kernel tests (GoogleTest): {passed} passed, {gt['failures']} failed, "
            f"{gt['skipped']} skipped, of {gt['tests']}"
        )
        for f in gt["failed"][:20]:
            w(f"  FAILED {f}")

    comparison = []
    if isinstance(kb, dict):
        rows = kb.get("rows", [])
        copy = next((r for r in rows if r.get("kind") == "copy"), None)
        torch_add = {}
        torch_copy = {}
        if isinstance(tb, dict):
            for r in tb.get("rows", []):
                (torch_add if r.get("case") == "add" else torch_copy)[r.get("dtype")] = r
        w("")
        mib = kb.get("buffer_bytes", 0) / 1048576
        w(
            f"Reduction kernels on {kb.get('device', '?')}: {mib:.0f} MiB per buffer; GB/s counts "
            "bytes read + written"
        )
        if copy:
            w(
                f"  cudaMemcpyAsync D2D: {copy['gbps']:.0f} GB/s"
                + (
                    f"   torch copy_ float32: {torch_copy['float32']['gbps']:.0f} GB/s"
                    if "float32" in torch_copy
                    else ""
                )
            )
        w(
            f"  {'dtype':<9} {'fourd sum(2)':>12} {'% of D2D':>9} {'torch add':>10} "
            f"{'fourd/torch':>11}"
        )
        for r in rows:
            if r.get("kind") != "reduce" or r.get("case") != "sum" or r.get("nsrcs") != 2:
                continue
            if r.get("bytes") != kb.get("buffer_bytes"):
                continue
            t = torch_add.get(r["dtype"])
            ratio = r["gbps"] / t["gbps"] if t and t.get("gbps") else None
            comparison.append(
                {
                    "dtype": r["dtype"],
                    "fourd_gbps": r["gbps"],
                    "vs_copy": r.get("vs_copy"),
                    "torch_add_gbps": t["gbps"] if t else None,
                    "fourd_vs_torch": round(ratio, 4) if ratio else None,
                }
            )
            w(
                f"  {r['dtype']:<9} {r['gbps']:>12.0f} {100 * r.get('vs_copy', 0):>8.1f}% "
                f"{(t['gbps'] if t else float('nan')):>10.0f} "
                f"{(f'{ratio:.2f}x' if ratio else '-'):>11}"
            )
        w("")
        w("  Other cases:")
        for r in rows:
            if r.get("kind") == "copy":
                continue
            if (
                r.get("kind") == "reduce"
                and r.get("case") == "sum"
                and r.get("nsrcs") == 2
                and r.get("bytes") == kb.get("buffer_bytes")
            ):
                continue
            label = f"{r.get('kind')} {r.get('case')} {r.get('dtype', '')}".strip()
            if r.get("nsrcs"):
                label += f" n={r['nsrcs']}"
            w(
                f"  {label:<58} {r['bytes'] / 1048576:>8.2f} MiB {r['us']:>9.1f} us "
                f"{r['gbps']:>7.0f} GB/s {100 * r.get('vs_copy', 0):>6.1f}%"
            )
    elif isinstance(tb, dict):
        w("")
        w("torch baseline only (the kernel benchmark did not run):")
        for r in tb.get("rows", []):
            w(f"  {r['case']:<5} {r['dtype']:<9} {r['gbps']:>8.0f} GB/s")

    pyt = {}
    for s in steps:
        if s["name"].startswith(("pytest", "mpi_")) and s["status"] != "skipped":
            summary = pytest_summary(tail(os.path.join(args.work, s["name"] + ".log"), 40))
            pyt[s["name"]] = summary
    if pyt:
        w("")
        w("Python and multi-rank GPU steps:")
        for name, summary in pyt.items():
            w(f"  {name:<16} {summary or '(no pytest summary line; see log.txt)'}")

    failed = [s for s in steps if s["status"] not in ("ok", "skipped")]
    w("")
    if failed:
        w(
            "Not ok: "
            + ", ".join(f"{s['name']} ({s['status']})" for s in failed)
            + ". The last lines of each:"
        )
        for s in failed:
            w(f"--- {s['name']}")
            for line in tail(os.path.join(args.work, s["name"] + ".log"), 15):
                w(f"    {line[:200]}")
    else:
        w("Every step that ran is ok.")

    text = "\n".join(out) + "\n"
    with open(os.path.join(args.results, "report.txt"), "w") as f:
        f.write(text)
    report = {
        "meta": meta,
        "steps": steps,
        "gtest": gt,
        "comparison": comparison,
        "kernel_bench": kb,
        "torch_baseline": tb,
        "pytest": pyt,
    }
    with open(os.path.join(args.results, "report.json"), "w") as f:
        json.dump(report, f, indent=1)
    sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())

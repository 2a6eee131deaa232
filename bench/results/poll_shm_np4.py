"""Per axis of bench runs (JSON files): auto against MPI and shm's own cells against MPI
(geometric means of t_mpi / t over the axis's cells), and how often each group ran each
algorithm under auto (auto_choices).

    python bench/results/poll_shm_np4.py run1.json[.gz] ...
"""

import collections
import gzip
import json
import math
import sys


def geomean(v):
    return math.exp(sum(map(math.log, v)) / len(v)) if v else float("nan")


for path in sys.argv[1:]:
    with (gzip.open if path.endswith(".gz") else open)(path, "rt") as f:
        rows = json.load(f)["rows"]
    cells = collections.defaultdict(dict)
    for r in rows:
        key = (r["collective"], r["axis"], r["size_bytes"], r["in_place"], r["dtype"], r["op"])
        cells[key][r["algorithm"] or r["library"]] = r
    parts = []
    for axis in ("x", "data", "world"):
        mine = [v for k, v in cells.items() if k[1] == axis and "auto" in v and "mpi" in v]
        auto = geomean([v["mpi"]["time_us"] / v["auto"]["time_us"] for v in mine])
        shm = [v["mpi"]["time_us"] / v["shm"]["time_us"] for v in mine if "shm" in v]
        ran = collections.Counter(a for v in mine for a in v["auto"].get("auto_choices") or [])
        text = f"{axis}: auto {auto:.2f}"
        if shm:
            text += f", shm {geomean(shm):.2f}"
        parts.append(text + " " + " ".join(f"{a}={n}" for a, n in ran.most_common()))
    print(path.rsplit("/", 1)[-1], "|", " | ".join(parts))

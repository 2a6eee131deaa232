"""PyTorch's own element-wise add and device-to-device copy, timed like fourd_kernel_bench.

The baseline that bench/gpu_check.sh puts next to fourd's reduction kernels: for each dtype,
``torch.add(a, b, out=c)`` (reads 2 buffers, writes 1) and ``c.copy_(a)`` (reads 1, writes 1) on
buffers of --mib MiB, each the mean of --iters launches after --warmup, timed with CUDA events.
Bandwidth counts every byte read and written once, as fourd_kernel_bench does.

Prints a table, then one JSON line (also written to --json FILE).
"""

from __future__ import annotations

import argparse
import functools
import json
import sys

DTYPES = ["float32", "float64", "float16", "bfloat16", "int8", "uint8", "int32", "int64"]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mib", type=int, default=256, help="MiB per buffer (default 256)")
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--json", default="", help="also write the JSON line to this file")
    ap.add_argument("--device", default="cuda", help="torch device (default cuda)")
    args = ap.parse_args(argv)

    import torch

    if args.device.startswith("cuda") and not torch.cuda.is_available():
        print(
            f"torch {torch.__version__}: torch.cuda is unavailable (torch.version.cuda="
            f"{torch.version.cuda})",
            file=sys.stderr,
        )
        return 2
    dev = torch.device(args.device)
    on_cuda = dev.type == "cuda"
    nbytes = args.mib << 20

    def time_us(fn) -> float:
        for _ in range(args.warmup):
            fn()
        if on_cuda:
            torch.cuda.synchronize(dev)
            start = torch.cuda.Event(enable_timing=True)
            end = torch.cuda.Event(enable_timing=True)
            start.record()
            for _ in range(args.iters):
                fn()
            end.record()
            end.synchronize()
            return 1000.0 * start.elapsed_time(end) / args.iters
        import time

        t0 = time.perf_counter()
        for _ in range(args.iters):
            fn()
        return 1e6 * (time.perf_counter() - t0) / args.iters

    rows = []
    for name in DTYPES:
        dt = getattr(torch, name)
        # Bytes 0x11 everywhere, as fourd_kernel_bench uses: small finite values in every dtype.
        a = torch.full((nbytes,), 0x11, dtype=torch.uint8, device=dev).view(dt)
        b = a.clone()
        c = torch.empty_like(a)
        cases = (
            ("copy", 2 * nbytes, functools.partial(c.copy_, a)),
            ("add", 3 * nbytes, functools.partial(torch.add, a, b, out=c)),
        )
        for case, moved, fn in cases:
            us = time_us(fn)
            rows.append(
                {
                    "case": case,
                    "dtype": name,
                    "bytes": nbytes,
                    "moved": moved,
                    "us": round(us, 3),
                    "gbps": round(moved / us / 1e3, 2),
                }
            )
        a = b = c = cases = None  # free before the next dtype's buffers
        if on_cuda:
            torch.cuda.empty_cache()

    devname = torch.cuda.get_device_name(dev) if on_cuda else "cpu"
    print(
        f"torch {torch.__version__} on {devname}: buffers {args.mib} MiB, {args.iters} "
        f"iterations after {args.warmup} warm-up; GB/s counts bytes read + written"
    )
    print(f"{'case':<6} {'dtype':<9} {'time us':>10} {'GB/s':>9}")
    for r in rows:
        print(f"{r['case']:<6} {r['dtype']:<9} {r['us']:>10.1f} {r['gbps']:>9.1f}")
    out = {
        "bench": "torch_baseline",
        "torch": torch.__version__,
        "device": devname,
        "buffer_bytes": nbytes,
        "iters": args.iters,
        "rows": rows,
    }
    line = json.dumps(out, separators=(",", ":"))
    print(line)
    if args.json:
        with open(args.json, "w") as f:
            f.write(line + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())

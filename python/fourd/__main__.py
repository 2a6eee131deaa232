"""python -m fourd: the build configuration, or the machine profile measured on purpose.

python -m fourd                         print the build configuration
mpiexec -n N python -m mpi4py -m fourd calibrate [--ranks-per-node K]
                                        measure the profile behind algorithm="auto" for
                                        this layout now (as the first fourd.init() of the
                                        layout would) and cache it, on a quiet machine
"""

import argparse
import os
import sys

import fourd


def _info() -> int:
    info = fourd.build_info()
    print(f"fourd {info['version']}")
    print(f"  MPI library : {info['mpi_library'].splitlines()[0] if info['mpi_library'] else '?'}")
    print(
        f"  MPI headers : {info['mpi_header_family'] or 'unknown family'}"
        + (f"  ** {info['mpi_abi_mismatch']}" if info["mpi_abi_mismatch"] else "")
    )
    print(f"  MPI threads : level {info['mpi_thread_level']} (3 = MPI_THREAD_MULTIPLE)")
    if info["cuda"]:
        print(
            f"  CUDA / NCCL : compiled in (NCCL {info['nccl_version']}, "
            f"{info['cuda_devices']} CUDA device(s) visible)"
        )
    else:
        print("  CUDA / NCCL : not compiled in (build with FOURD_CUDA=ON pip install '.[gpu]')")
    print(f"  algorithms  : {', '.join(fourd._C.ALGORITHMS)}")
    return 0


def _calibrate(args) -> int:
    """The init calibration, forced, for the layout of this launch (FOURD_CALIBRATE=force)."""
    os.environ["FOURD_CALIBRATE"] = "force"
    g = fourd.init(ranks_per_node=args.ranks_per_node)
    fourd.finalize()
    return 0 if g is not None else 1


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m fourd", description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="command")
    c = sub.add_parser("calibrate", help="measure and cache the profile of auto for this layout")
    c.add_argument(
        "--ranks-per-node",
        type=int,
        default=None,
        help="virtual nodes of K ranks (default: the ranks sharing a host)",
    )
    args = p.parse_args(argv)
    if args.command == "calibrate":
        return _calibrate(args)
    return _info()


if __name__ == "__main__":
    sys.exit(main())

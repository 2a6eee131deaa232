"""``python -m fourd.bench``: nccl-tests style benchmark of fourd's collectives on the 4D grid,
next to MPI (mpi4py) and torch.distributed (gloo) on the same ranks, with the physical bound of
every row. docs/benchmark.md describes the options, the output and the JSON schema.

    mpiexec -n 4 python -m mpi4py -m fourd.bench
    mpiexec -n 4 python -m mpi4py -m fourd.bench -b 1M -e 64M -f 2 --json out.json --plot out.png
"""

__all__ = ["main"]


def main(argv=None) -> int:
    """Runs the benchmark (collective over MPI.COMM_WORLD); returns the exit status."""
    from .cli import main as _main

    return _main(argv)

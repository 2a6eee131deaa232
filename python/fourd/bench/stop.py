"""SIGINT and SIGTERM during a run: finish the cell in flight, then stop on every rank together,
write what was measured, and exit with 128 + the signal's number.

A signal reaches the ranks in one of two ways, and both must end the same way:

  * MPICH's mpiexec (hydra) forwards its first SIGINT (Ctrl-C) and every SIGTERM to every
    rank; a second Ctrl-C to mpiexec kills the job. Slurm (scancel, the time limit) and Open
    MPI's mpirun send SIGTERM to every rank before SIGKILL, sometimes too shortly before for
    the last files: the files written after each row are then what remains.
  * `kill -INT <pid>` of one rank (rank 0, say), or a terminal's Ctrl-C where the ranks share
    its process group, reaches only some ranks, or some twice.

A rank therefore never acts on a signal alone: stopping in the middle of a collective would
leave the others waiting in it. The handler only records the signal; the sweep's next
agreement (the world Allreduce before each cell's timed calls, runner.py) carries it to every
rank, and all ranks stop after that same cell. Nothing else changes meanwhile: fourd's blocking
calls wait in short slices and run Python's signal handlers, which return at once here, so the
call in flight finishes normally.

A second signal more than ESCALATE_S after the first (a stop that seems stuck) raises
KeyboardInterrupt as Python's default would: `python -m mpi4py` then aborts the job, and the
--json/--csv files still hold every row up to the last complete one (they are rewritten after
each row).
"""

from __future__ import annotations

import signal
import time

SIGNALS = (signal.SIGINT, signal.SIGTERM)
ESCALATE_S = 2.0


class StopRequest:
    """The signal this rank received during the run (0: none), and the handlers that record
    it (install() / restore())."""

    def __init__(self, on_signal=None):
        self.signum = 0
        self._t_first = 0.0
        self._old: dict = {}
        self._on_signal = on_signal  # called once, with the signal's name (rank 0's notice)

    def install(self) -> None:
        for sig in SIGNALS:
            self._old[sig] = signal.signal(sig, self._handler)

    def restore(self) -> None:
        for sig, old in self._old.items():
            signal.signal(sig, old)
        self._old.clear()

    def _handler(self, signum, frame) -> None:
        if self.signum:
            if time.monotonic() - self._t_first > ESCALATE_S:
                self.restore()
                raise KeyboardInterrupt
            return  # the same Ctrl-C arriving twice (from the terminal and from mpiexec)
        self.signum, self._t_first = signum, time.monotonic()
        if self._on_signal is not None:
            self._on_signal(signal_name(signum))


def signal_name(signum: int) -> str:
    try:
        return signal.Signals(signum).name
    except ValueError:
        return f"signal {signum}"


class Stopped(Exception):
    """Every rank agreed to stop (runner.py raises it after the agreement, on every rank)."""

    def __init__(self, signum: int):
        super().__init__(signal_name(signum))
        self.signum = signum

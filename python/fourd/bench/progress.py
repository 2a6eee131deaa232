"""The progress of a sweep, on rank 0: a one-line bar where the job's output is a terminal, or
plain lines where --progress sends it to a file; never escape codes into a file.

Under mpiexec a rank's stdout is a pipe to the launcher (MPICH's hydra forwards it), so the
rank's own `isatty()` says nothing about what the user sees: the stdout of the mpiexec the rank
runs under does. `job_stream_is_terminal` asks the rank's stream first and, where that is a
pipe or a socket, the same stream of the nearest launcher among the rank's ancestors (Linux:
/proc). Anything else (no /proc, no launcher found, a regular file) counts as no terminal.

The bar's estimate of the time left weighs every cell by its estimated seconds (the header's
estimate, runner.py): the seconds left at the pace measured so far, so that a sweep whose small
sizes come first does not promise too little.
"""

from __future__ import annotations

import os
import stat
import sys
import time
from pathlib import Path

# The commands a user starts a job with (MPICH's hydra, Open MPI's and PRRTE's runners).
_LAUNCHERS = ("mpiexec", "mpirun", "orterun", "prterun")
_ANCESTORS = 6  # how far up to look: rank -> proxy -> launcher, with room for wrappers
SHOW_AFTER_S = 2.0  # no bar for a sweep shorter than this
LINE_EVERY = 0.10  # plain lines: one per this share of the estimated work ...
LINE_EVERY_S = 30.0  # ... or per this many seconds, whichever comes first


def _is_terminal_path(target: str) -> bool:
    return target.startswith(("/dev/pts/", "/dev/tty")) or target == "/dev/console"


def _parent(pid: int, proc: str) -> int:
    """The parent of `pid` from /proc/<pid>/stat (its comm may hold spaces and parentheses:
    the fields after the last ')' are fixed), 0 when unknown."""
    try:
        text = Path(proc, str(pid), "stat").read_text()
        return int(text[text.rindex(")") + 2 :].split()[1])
    except (OSError, ValueError, IndexError):
        return 0


def job_stream_is_terminal(stream, fd: int, proc: str = "/proc", ppid: int | None = None) -> bool:
    """Whether what is written to `stream` (this process' file descriptor `fd`, 1 or 2) ends
    on a terminal: the stream itself, or, when it is a pipe or a socket, the same descriptor of
    the nearest launcher (mpiexec, mpirun) among this process' ancestors."""
    try:
        if stream.isatty():
            return True
        mode = os.fstat(stream.fileno()).st_mode
    except (AttributeError, OSError, ValueError):
        return False
    if not (stat.S_ISFIFO(mode) or stat.S_ISSOCK(mode)):
        return False  # a file: whatever the launcher writes to, this rank's output is here
    pid = os.getppid() if ppid is None else ppid
    for _ in range(_ANCESTORS):
        if pid <= 1:
            return False
        try:
            comm = Path(proc, str(pid), "comm").read_text().strip()
        except OSError:
            return False
        if comm.startswith(_LAUNCHERS):
            try:
                return _is_terminal_path(os.readlink(f"{proc}/{pid}/fd/{fd}"))
            except OSError:
                return False
        pid = _parent(pid, proc)
    return False


def choose(cfg, rank: int) -> tuple[str, object]:
    """(mode, stream): "bar" on the job's stdout when that is a terminal (the tables' stream,
    so the two never interleave out of order); with --progress, a bar on stderr when only that
    is a terminal, else "lines" on stderr; "off" on other ranks, with --quiet or
    --no-progress, and by default when stdout is not a terminal."""
    if rank != 0 or cfg.quiet or cfg.no_progress:
        return "off", None
    if job_stream_is_terminal(sys.stdout, 1):
        return "bar", sys.stdout
    if not cfg.progress:
        return "off", None
    if job_stream_is_terminal(sys.stderr, 2):
        return "bar", sys.stderr
    return "lines", sys.stderr


def duration(seconds: float) -> str:
    """'45 s', '3 min 10 s', '1 h 05 min'."""
    s = max(0, round(seconds))
    if s < 60:
        return f"{s} s"
    if s < 3600:
        return f"{s // 60} min {s % 60:02d} s"
    return f"{s // 3600} h {s % 3600 // 60:02d} min"


class Progress:
    """The sweep's progress on rank 0 (mode "bar", "lines" or "off"; see choose())."""

    def __init__(self, mode: str = "off", stream=None):
        self.mode, self.stream = mode, stream
        self.enabled = mode != "off"
        self.total = 1  # cells planned
        self.done = 0
        self.total_s = 0.0  # their estimated seconds
        self.done_s = 0.0
        self.t0 = time.perf_counter()
        self.shown = False
        self._next_line = (LINE_EVERY, LINE_EVERY_S)

    def start(self, cells: int, estimate_s: float) -> None:
        self.total, self.total_s = max(1, cells), max(0.0, estimate_s)
        self.t0 = time.perf_counter()

    def step(self, label: str, n: int = 1, est_s: float = 0.0) -> None:
        """`n` cells done, estimated at `est_s` seconds together."""
        self.done += n
        self.done_s += est_s
        el = time.perf_counter() - self.t0
        if not self.enabled or el < SHOW_AFTER_S:
            return
        frac = self._fraction()
        left = self._left(el, frac)
        if self.mode == "bar":
            bar = "#" * int(frac * 30)
            self.stream.write(
                f"\r\033[K[{bar:<30}] {frac * 100:3.0f}%  {duration(el)}, "
                f"~{duration(left)} left  {label}"
            )
            self.stream.flush()
            self.shown = True
        elif frac >= self._next_line[0] or el >= self._next_line[1]:
            self._next_line = (frac + LINE_EVERY, el + LINE_EVERY_S)
            print(
                f"# progress: {frac * 100:.0f}% ({self.done}/{self.total} cells), "
                f"{duration(el)}, about {duration(left)} left",
                file=self.stream,
                flush=True,
            )

    def _fraction(self) -> float:
        """The share of the work done: by estimated seconds, by cells without an estimate."""
        if self.total_s > 0:
            return min(1.0, self.done_s / self.total_s)
        return min(1.0, self.done / self.total)

    def _left(self, elapsed: float, frac: float) -> float:
        return elapsed / frac - elapsed if frac > 0 else 0.0

    def clear(self) -> None:
        if self.shown:
            self.stream.write("\r\033[K")
            self.stream.flush()
            self.shown = False

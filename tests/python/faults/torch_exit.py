"""Exit of a torch.distributed job on backend fourd whose progress thread is running (a future
was asked for): the thread is stopped before fourd and mpi4py finalize. The first exit handler
registered runs last, so the one registered here sees what is left after every other."""

import atexit
import os
import threading


def report():
    left = [t.name for t in threading.enumerate() if t.name == "fourd.distributed"]
    os.write(1, f"rank {os.environ.get('PMI_RANK')}: at exit, progress threads {left}\n".encode())


atexit.register(report)

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

import fourd.distributed  # noqa: E402, F401

dist.init_process_group("fourd")
work = dist.all_reduce(torch.ones(4), async_op=True)
assert (work.get_future().wait()[0] == dist.get_world_size()).all()
running = [t.name for t in threading.enumerate() if t.name == "fourd.distributed"]
os.write(1, f"rank {dist.get_rank()}: running {running}\n".encode())

"""Interpreter exit while daemon threads are inside fourd with the GIL released: a codec round
trip (compression) and Work.wait, as torch.distributed's progress thread waits. Python ends
such threads when they take the GIL back during finalization (pthread_exit); the process must
still exit 0, not abort."""

import os
import threading
import time

import numpy as np

import fourd
from fourd import _C
from fourd._tensor import CODES

g = fourd.init()
x = np.arange(1 << 22, dtype=np.float32)
y = np.empty_like(x)
work = fourd.all_reduce(np.ones(4), "world", async_op=True)
work.wait()
started = threading.Barrier(3)


def codec():
    started.wait()
    while True:
        _C.codec_round_trip("lossless", x.ctypes.data, y.ctypes.data, x.size, CODES["float32"])


def waits():
    started.wait()
    while True:
        work.wait(0.001)


for f in (codec, waits):
    threading.Thread(target=f, daemon=True).start()
started.wait()
time.sleep(0.05)
os.write(1, f"rank {g.world_rank}: exiting with daemon threads in fourd\n".encode())

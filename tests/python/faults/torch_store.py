"""parallel_state with torch.distributed started from MPI: rank 0's TCPStore must listen on the
address it hands out (loopback, all ranks on one host), not on every interface. Prints the
local address of the store's listening socket (/proc/net/tcp)."""

import os
import socket
import struct

import torch.distributed as dist
from mpi4py import MPI

from fourd import parallel_state


def listening_addresses(port):
    out = []
    for table, family in (("/proc/net/tcp", socket.AF_INET), ("/proc/net/tcp6", socket.AF_INET6)):
        try:
            lines = open(table).read().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            local, state = line.split()[1], line.split()[3]
            addr, p = local.split(":")
            if state != "0A" or int(p, 16) != port:
                continue
            raw = bytes.fromhex(addr)
            if family == socket.AF_INET:
                out.append(socket.inet_ntop(family, struct.pack("<I", int(addr, 16))))
            else:
                words = struct.unpack("<4I", raw)
                out.append(socket.inet_ntop(family, struct.pack(">4I", *words)))
    return out


parallel_state.initialize(torch_distributed=True)
store = dist.distributed_c10d._get_default_store()
while hasattr(store, "underlying_store"):
    store = store.underlying_store
if MPI.COMM_WORLD.Get_rank() == 0:
    for a in listening_addresses(store.port):
        os.write(1, f"rank 0: store listens on {a}\n".encode())
MPI.COMM_WORLD.Barrier()
parallel_state.destroy_model_parallel()

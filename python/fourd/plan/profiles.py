"""Built-in machine profiles for the planner, and where a profile comes from.

A :class:`~fourd.profile.fields.Profile` holds the figures of :cpp:`fourd::MachineProfile` in
SI units (seconds, bytes per second, FLOP/s, bytes); its fields and defaults are the native
ones. Built-in profiles derive them from public specifications times an achievable fraction;
docs/planner.md cites every figure. ``fourd.calibrate()`` measures a profile on the running
machine and saves it as JSON; ``load_profile`` reads it back (both from fourd.profile).
"""

from __future__ import annotations

import os

from ..profile.fields import Profile
from ..profile.store import load_profile, save_profile

__all__ = ["BUILTIN", "Profile", "builtin_names", "get_profile", "load_profile", "save_profile"]

GB = 1e9


def _perlmutter() -> Profile:
    # NERSC Perlmutter GPU node: 4x A100 (40 GB) fully connected by NVLink 3, 4x Slingshot-11.
    nvlink_peak = 300 * GB  # 12 NVLink-3 links x 25 GB/s per direction (600 GB/s bidir.)
    nic_peak = 25 * GB  # Slingshot-11: 200 Gb/s per NIC
    hbm = 1555 * GB  # A100 40 GB HBM2
    return Profile(
        name="perlmutter",
        ranks_per_node=4,
        intra_alpha=4e-6,
        intra_bw=0.8 * nvlink_peak,
        inter_alpha=10e-6,
        nic_bw=0.8 * nic_peak,  # 20 GB/s: AxoNN's measured per-GPU inter-node busbw
        nics_per_node=4,
        reduce_bw=hbm,  # NCCL reduces while it copies: one extra read per reduced byte
        memcpy_bw=hbm / 2,  # a copy reads and writes
        flat_efficiency=1.0,  # the bandwidths above are NCCL's own measured figures
        compute_flops=0.7 * 312e12,  # A100 dense BF16 peak 312 TFLOP/s
        memory_bytes=40e9,
        intra_mesh=True,
        shm_bw=0.8 * 32 * GB,  # host window behind PCIe 4.0 x16
        notes={
            "ranks_per_node": "4x A100 per GPU node (NERSC Perlmutter architecture)",
            "nics_per_node": "4x HPE Slingshot 11 NICs per GPU node (NERSC)",
            "nic_bw": "200 Gb/s = 25 GB/s per Slingshot-11 NIC x 0.8 achievable "
            "(AxoNN measured ~20 GB/s per GPU)",
            "intra_bw": "NVLink 3: 600 GB/s bidirectional = 300 GB/s per direction x 0.8 "
            "(AxoNN measured 225 GB/s busbw for 4 GPUs, 76 for 2)",
            "intra_mesh": "the four A100s are linked to each other directly (NERSC node "
            "diagram), no NVSwitch",
            "compute_flops": "A100 dense BF16 312 TFLOP/s (NVIDIA A100 datasheet) x 0.7 assumed",
            "memory_bytes": "A100 40 GB HBM2 (1536 of the 1792 GPU nodes)",
            "reduce_bw": "A100 HBM2 1555 GB/s (the reduction is fused into NCCL's copy)",
            "memcpy_bw": "A100 HBM2 1555 GB/s / 2",
            "shm_bw": "PCIe 4.0 x16 (32 GB/s) x 0.8: a host shared-memory window",
            "intra_alpha": "assumed (NCCL step latency order); calibrate to replace",
            "inter_alpha": "assumed; calibrate to replace",
        },
    )


def _frontier() -> Profile:
    # OLCF Frontier node: 4x MI250X = 8 GCDs (64 GB each), 4x Slingshot-11 (25 GB/s each).
    nic_peak = 25 * GB
    hbm_gcd = 1600 * GB  # 3.2 TB/s per MI250X, two GCDs
    return Profile(
        name="frontier",
        ranks_per_node=8,
        intra_alpha=5e-6,
        intra_bw=135 * GB,  # AxoNN's measured RCCL busbw over the 8 GCDs of a node
        inter_alpha=10e-6,
        nic_bw=0.85 * nic_peak,
        nics_per_node=4,
        reduce_bw=hbm_gcd,
        memcpy_bw=hbm_gcd / 2,
        shm_bw=0.8 * 36 * GB,  # host window behind the 36+36 GB/s CPU-GCD link
        flat_efficiency=0.4,  # fits AxoNN's measured 34.0 / 20.6 / 10.2 GB/s across nodes
        compute_flops=0.5 * 191.5e12,  # MI250X dense BF16 383 TFLOP/s per MI250X = 2 GCDs
        memory_bytes=64e9,
        intra_mesh=False,
        notes={
            "ranks_per_node": "8 GCDs per node: 4x MI250X with 2 GCDs each (OLCF Frontier "
            "User Guide)",
            "memory_bytes": "64 GB HBM2E per GCD (OLCF)",
            "nics_per_node": "4x Slingshot-11 NICs, 25 GB/s each, 100 GB/s per node (OLCF)",
            "nic_bw": "25 GB/s x 0.85 assumed achievable",
            "intra_bw": "Infinity Fabric 50-200 GB/s per GCD pair (OLCF); 135 GB/s = AxoNN's "
            "measured 8-GCD busbw",
            "flat_efficiency": "RCCL across nodes: fit to AxoNN's measured 34.0, 20.6, 10.2 GB/s",
            "compute_flops": "MI250X 383 TFLOP/s dense BF16 (AMD) / 2 GCDs x 0.5 assumed",
            "reduce_bw": "1.6 TB/s HBM2E per GCD (the reduction is fused into RCCL's copy)",
            "shm_bw": "CPU-GCD Infinity Fabric 36 GB/s per direction (OLCF) x 0.8",
            "memcpy_bw": "1.6 TB/s HBM2E per GCD / 2",
            "intra_alpha": "assumed; calibrate to replace",
            "inter_alpha": "assumed; calibrate to replace",
        },
    )


def _dgx_h100() -> Profile:
    # NVIDIA DGX H100: 8x H100 SXM5 80 GB on NVSwitch (NVLink 4), 8x ConnectX-7 400 Gb/s.
    nvlink_peak = 450 * GB  # 900 GB/s bidirectional per GPU
    nic_peak = 50 * GB  # 400 Gb/s
    hbm = 3350 * GB
    return Profile(
        name="dgx-h100",
        ranks_per_node=8,
        intra_alpha=3e-6,
        intra_bw=0.8 * nvlink_peak,
        inter_alpha=6e-6,
        nic_bw=0.9 * nic_peak,
        nics_per_node=8,
        reduce_bw=hbm,
        memcpy_bw=hbm / 2,
        shm_bw=0.8 * 64 * GB,  # host window behind PCIe 5.0 x16
        flat_efficiency=1.0,
        compute_flops=0.6 * 989e12,  # H100 SXM dense BF16 989 TFLOP/s
        memory_bytes=80e9,
        intra_mesh=False,
        notes={
            "ranks_per_node": "8x H100 SXM5 per DGX H100 (NVIDIA DGX H100 user guide)",
            "intra_bw": "NVLink 4 via NVSwitch: 900 GB/s bidirectional = 450 GB/s per "
            "direction x 0.8 assumed",
            "nics_per_node": "8x ConnectX-7 400 Gb/s for the compute fabric (NVIDIA DGX H100)",
            "nic_bw": "400 Gb/s = 50 GB/s x 0.9 assumed",
            "compute_flops": "H100 SXM dense BF16 989 TFLOP/s (NVIDIA H100 datasheet) x 0.6 "
            "assumed",
            "memory_bytes": "80 GB HBM3 per GPU",
            "reduce_bw": "H100 SXM HBM3 3.35 TB/s (the reduction is fused into NCCL's copy)",
            "shm_bw": "PCIe 5.0 x16 (64 GB/s) x 0.8",
            "memcpy_bw": "H100 SXM HBM3 3.35 TB/s / 2",
            "intra_alpha": "assumed; calibrate to replace",
            "inter_alpha": "assumed; calibrate to replace",
        },
    )


def _cpu_node() -> Profile:
    # The emulated cluster: MPI ranks of one CPU machine split into virtual nodes. The defaults
    # match the native core's conservative profile; calibrate() measures the real figures.
    return Profile(
        name="cpu",
        ranks_per_node=4,
        intra_alpha=2e-6,
        intra_bw=5e9,
        inter_alpha=20e-6,
        nic_bw=0.5e9,
        nics_per_node=1,
        reduce_bw=4e9,
        memcpy_bw=6e9,
        flat_efficiency=1.0,
        compute_flops=50e9,
        memory_bytes=4e9,
        notes={"*": "conservative defaults for one CPU machine; run fourd.plan.calibrate()"},
    )


BUILTIN = {
    "perlmutter": _perlmutter,
    "frontier": _frontier,
    "dgx-h100": _dgx_h100,
    "cpu": _cpu_node,
}


def builtin_names() -> list:
    return sorted(BUILTIN)


def get_profile(machine) -> Profile:
    """A built-in profile by name ("perlmutter", "frontier", "dgx-h100", "cpu"), a JSON file
    path, or a Profile (returned as is)."""
    if isinstance(machine, Profile):
        return machine
    if not isinstance(machine, str):
        raise ValueError(f"machine: expected a profile name or a JSON path, found {machine!r}")
    key = machine.lower()
    if key in BUILTIN:
        return BUILTIN[key]()
    if os.path.exists(machine):
        return load_profile(machine)
    raise ValueError(
        f"machine: expected one of {', '.join(builtin_names())} or a profile JSON file; "
        f"found {machine!r}"
    )

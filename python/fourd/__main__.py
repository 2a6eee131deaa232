"""python -m fourd: print the build configuration."""

import sys

import fourd


def main() -> int:
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
    print("  algorithms  : auto, flat, ring, rhd, hierarchical, shm")
    return 0


if __name__ == "__main__":
    sys.exit(main())

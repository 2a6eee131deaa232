# Finds NCCL for fourd's GPU part, without requiring it.
#
# Search order for nccl.h and libnccl:
#   1. the NCCL_ROOT / NCCL_HOME CMake variables or environment variables (a cluster's NCCL);
#   2. the `nvidia-nccl-cu13` (or -cu12) wheel installed beside ${Python_EXECUTABLE}: pip puts it
#      into pip's isolated build environment too when FOURD_CUDA=ON (see pyproject.toml);
#   3. the system default paths (a Debian/conda/NVIDIA-repo libnccl-dev).
#
# The wheel ships only libnccl.so.2 (no unversioned libnccl.so), which is why the versioned file
# name is listed explicitly.
#
# Sets FOURD_NCCL_FOUND, NCCL_INCLUDE_DIR, NCCL_LIBRARY, FOURD_NCCL_VERSION and, when found, the
# imported target fourd::nccl. Never fails: the caller decides what a missing NCCL means.

set(_fourd_nccl_hints)
foreach(_v NCCL_ROOT NCCL_HOME)
  if(DEFINED ${_v} AND NOT "${${_v}}" STREQUAL "")
    list(APPEND _fourd_nccl_hints "${${_v}}")
  endif()
  if(DEFINED ENV{${_v}} AND NOT "$ENV{${_v}}" STREQUAL "")
    list(APPEND _fourd_nccl_hints "$ENV{${_v}}")
  endif()
endforeach()

if(Python_EXECUTABLE)
  # `nvidia` and `nvidia.nccl` are namespace packages (no __file__): ask for __path__.
  execute_process(
    COMMAND "${Python_EXECUTABLE}" -c [=[
import importlib
for name in ("nvidia.nccl",):
    try:
        m = importlib.import_module(name)
    except ImportError:
        continue
    for p in list(getattr(m, "__path__", [])):
        print(p, end=";")
]=]
    OUTPUT_VARIABLE _fourd_nccl_wheel_dirs
    ERROR_QUIET
    RESULT_VARIABLE _fourd_nccl_rc)
  if(_fourd_nccl_rc EQUAL 0 AND _fourd_nccl_wheel_dirs)
    list(APPEND _fourd_nccl_hints ${_fourd_nccl_wheel_dirs})
  endif()
endif()
list(REMOVE_DUPLICATES _fourd_nccl_hints)

# A cached result whose files are gone (a deleted virtual environment) is searched again.
foreach(_v NCCL_INCLUDE_DIR NCCL_LIBRARY)
  if(${_v} AND NOT EXISTS "${${_v}}")
    unset(${_v} CACHE)
  endif()
endforeach()
find_path(NCCL_INCLUDE_DIR NAMES nccl.h
          HINTS ${_fourd_nccl_hints}
          PATH_SUFFIXES include)
# NAMES_PER_DIR: every name in one folder before the next folder. Without it CMake looks for
# `nccl` (libnccl.so) everywhere first and took a system libnccl.so (2.28.3) over the wheel's
# libnccl.so.2 (2.28.9) whose nccl.h it had found: header and library of different versions.
find_library(NCCL_LIBRARY NAMES nccl libnccl.so.2 NAMES_PER_DIR
             HINTS ${_fourd_nccl_hints}
             PATH_SUFFIXES lib lib64 lib/x86_64-linux-gnu)

set(FOURD_NCCL_FOUND OFF)
set(FOURD_NCCL_VERSION "")
if(NCCL_INCLUDE_DIR AND NCCL_LIBRARY)
  set(FOURD_NCCL_FOUND ON)
  # Version from the header, for the configure summary only.
  file(STRINGS "${NCCL_INCLUDE_DIR}/nccl.h" _fourd_nccl_ver_lines
       REGEX "^#define NCCL_(MAJOR|MINOR|PATCH)[ \t]+[0-9]+")
  foreach(_part MAJOR MINOR PATCH)
    string(REGEX MATCH "NCCL_${_part}[ \t]+([0-9]+)" _m "${_fourd_nccl_ver_lines}")
    set(_fourd_nccl_${_part} "${CMAKE_MATCH_1}")
  endforeach()
  set(FOURD_NCCL_VERSION "${_fourd_nccl_MAJOR}.${_fourd_nccl_MINOR}.${_fourd_nccl_PATCH}")
  if(NOT TARGET fourd::nccl)
    # SHARED (not UNKNOWN) so that CMake puts the library's folder into the build tree's RPATH.
    if(NCCL_LIBRARY MATCHES "\\.a$")
      add_library(fourd::nccl STATIC IMPORTED)
    else()
      add_library(fourd::nccl SHARED IMPORTED)
    endif()
    set_target_properties(fourd::nccl PROPERTIES
      IMPORTED_LOCATION "${NCCL_LIBRARY}"
      INTERFACE_INCLUDE_DIRECTORIES "${NCCL_INCLUDE_DIR}")
  endif()
endif()

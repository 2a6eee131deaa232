# The libraries behind fourd's codecs (cpp/src/compression/): C-Blosc2 and ZFP, both linked
# statically into fourd_core so that the built module needs neither at run time.
#
# C-Blosc2 comes from the `blosc2` wheel (a build requirement in pyproject.toml), which ships
# blosc2/include, blosc2/lib/libblosc2.a (position-independent, with LZ4, Zstd and zlib-ng
# inside) and a CMake package config. It is found beside the Python interpreter that CMake found.
#
# ZFP comes from its source package on PyPI, the zfpy sdist (pinned by URL and SHA-256 below), or
# from FOURD_ZFP_SOURCE (a local copy of that tarball, a zfp release tarball, or an unpacked tree)
# for offline builds. That sdist holds zfp 1.0.1's headers and src/*.c but not
# include/zfp/bitstream.inl, which every zfp source file includes, so libzfp cannot be compiled
# from it alone. Two cases, then:
#   - a complete tree (a zfp release, or any tree with include/zfp/bitstream.inl): libzfp is
#     compiled from its src/*.c (C99, serial, no OpenMP) as the static library fourd_zfp;
#   - the zfpy sdist: its headers are used with the zfp that libblosc2.a carries inside (the
#     bundled zfp of C-Blosc2's ZFP plugin, whose symbols the archive exports), after checking
#     that both are the same zfp version.
# Either way one copy of zfp ends up in the binary.

# ---- C-Blosc2 from the blosc2 wheel ----------------------------------------------------------
execute_process(
  COMMAND "${Python_EXECUTABLE}" -c
          "import importlib.util as u; s = u.find_spec('blosc2'); print(s.submodule_search_locations[0] if s else '', end='')"
  OUTPUT_VARIABLE _fourd_blosc2_dir
  RESULT_VARIABLE _fourd_rc
  ERROR_QUIET)
if(NOT _fourd_rc EQUAL 0 OR NOT _fourd_blosc2_dir
   OR NOT EXISTS "${_fourd_blosc2_dir}/lib/cmake/blosc2/Blosc2Config.cmake")
  message(FATAL_ERROR
    "fourd: C-Blosc2 not found: expected the `blosc2` Python package, with its "
    "lib/cmake/blosc2/Blosc2Config.cmake, beside ${Python_EXECUTABLE}; found "
    "'${_fourd_blosc2_dir}'. Install it (pip install blosc2; pip install . brings it as a build "
    "requirement).")
endif()
find_package(Blosc2 CONFIG REQUIRED PATHS "${_fourd_blosc2_dir}/lib/cmake/blosc2" NO_DEFAULT_PATH)
if(NOT TARGET Blosc2::blosc2_static)
  message(FATAL_ERROR "fourd: the blosc2 package at ${_fourd_blosc2_dir} defines no "
                      "Blosc2::blosc2_static target (found Blosc2 ${Blosc2_VERSION})")
endif()
get_target_property(_fourd_blosc2_lib Blosc2::blosc2_static IMPORTED_LOCATION_RELEASE)
if(NOT _fourd_blosc2_lib)
  get_target_property(_fourd_blosc2_lib Blosc2::blosc2_static IMPORTED_LOCATION)
endif()
message(STATUS "fourd: C-Blosc2 ${Blosc2_VERSION} from ${_fourd_blosc2_lib}")

# ---- ZFP ---------------------------------------------------------------------------------------
set(FOURD_ZFP_URL
    "https://files.pythonhosted.org/packages/1f/ce/0e36c87f43e5575b3bda7da57e8407f8bff893ead17f1fc2c44e16bfaa7a/zfpy-1.0.1.post0.tar.gz")
set(FOURD_ZFP_SHA256 2a10de8061ddffcc8176e5eb65313fb6a4b1d0b54c315ef2fdcd4faa112b0a61)
set(FOURD_ZFP_SOURCE "" CACHE PATH
    "ZFP sources for offline builds: the zfpy sdist tarball, a zfp release tarball, or an unpacked tree (default: download the zfpy sdist from PyPI)")

if(FOURD_ZFP_SOURCE AND IS_DIRECTORY "${FOURD_ZFP_SOURCE}")
  set(_fourd_zfp_dir "${FOURD_ZFP_SOURCE}")
else()
  include(FetchContent)
  if(FOURD_ZFP_SOURCE)
    if(NOT EXISTS "${FOURD_ZFP_SOURCE}")
      message(FATAL_ERROR "fourd: FOURD_ZFP_SOURCE must name a ZFP tarball or source tree; "
                          "found '${FOURD_ZFP_SOURCE}', which does not exist")
    endif()
    # A local file: any zfp 1.0 tarball (its version is checked below, not its hash).
    FetchContent_Declare(fourd_zfp URL "${FOURD_ZFP_SOURCE}" DOWNLOAD_EXTRACT_TIMESTAMP TRUE
                         SOURCE_SUBDIR fourd-no-cmake-project)
  else()
    # Downloaded here rather than by FetchContent, to fail with a message that says what to do.
    set(_fourd_zfp_tarball "${CMAKE_BINARY_DIR}/_deps/zfpy-1.0.1.post0.tar.gz")
    if(NOT EXISTS "${_fourd_zfp_tarball}")
      file(DOWNLOAD "${FOURD_ZFP_URL}" "${_fourd_zfp_tarball}.part" STATUS _fourd_status)
      list(GET _fourd_status 0 _fourd_code)
      list(GET _fourd_status 1 _fourd_why)
      set(_fourd_sha "")
      if(_fourd_code EQUAL 0)
        file(SHA256 "${_fourd_zfp_tarball}.part" _fourd_sha)
        set(_fourd_why "SHA-256 ${_fourd_sha} where ${FOURD_ZFP_SHA256} was expected")
      endif()
      if(NOT _fourd_sha STREQUAL FOURD_ZFP_SHA256)
        file(REMOVE "${_fourd_zfp_tarball}.part")
        message(FATAL_ERROR
          "fourd: could not download the ZFP sources (the zfpy 1.0.1.post0 sdist) from "
          "${FOURD_ZFP_URL}: ${_fourd_why}. Without network access, download that file "
          "elsewhere and set FOURD_ZFP_SOURCE to it (or to a zfp 1.0 source tree).")
      endif()
      file(RENAME "${_fourd_zfp_tarball}.part" "${_fourd_zfp_tarball}")
    endif()
    FetchContent_Declare(fourd_zfp URL "${_fourd_zfp_tarball}" URL_HASH SHA256=${FOURD_ZFP_SHA256}
                         DOWNLOAD_EXTRACT_TIMESTAMP TRUE SOURCE_SUBDIR fourd-no-cmake-project)
  endif()
  # SOURCE_SUBDIR names no folder: the sources are only unpacked, never added as a project.
  FetchContent_MakeAvailable(fourd_zfp)
  set(_fourd_zfp_dir "${fourd_zfp_SOURCE_DIR}")
endif()

set(_fourd_zfp_version_h "${_fourd_zfp_dir}/include/zfp/version.h")
if(NOT EXISTS "${_fourd_zfp_dir}/include/zfp.h" OR NOT EXISTS "${_fourd_zfp_version_h}")
  message(FATAL_ERROR
    "fourd: no ZFP sources: expected include/zfp.h and include/zfp/version.h in "
    "${_fourd_zfp_dir}. Without network access, set FOURD_ZFP_SOURCE to the zfpy sdist "
    "(${FOURD_ZFP_URL}) or to a zfp 1.0 source tree.")
endif()
file(STRINGS "${_fourd_zfp_version_h}" _fourd_zfp_defs REGEX "#define ZFP_VERSION_(MAJOR|MINOR|PATCH) ")
set(_fourd_zfp_version "")
foreach(_part MAJOR MINOR PATCH)
  string(REGEX MATCH "ZFP_VERSION_${_part} +([0-9]+)" _m "${_fourd_zfp_defs}")
  list(APPEND _fourd_zfp_version "${CMAKE_MATCH_1}")
endforeach()
list(JOIN _fourd_zfp_version "." _fourd_zfp_version)
if(NOT _fourd_zfp_version MATCHES "^1\\.0\\.[0-9]+$")
  message(FATAL_ERROR "fourd: ZFP 1.0.x expected in ${_fourd_zfp_dir}; found version "
                      "'${_fourd_zfp_version}'")
endif()

if(EXISTS "${_fourd_zfp_dir}/include/zfp/bitstream.inl")
  # A complete tree: compile libzfp (serial: nothing defines _OPENMP or ZFP_WITH_CUDA).
  enable_language(C)
  file(GLOB _fourd_zfp_sources "${_fourd_zfp_dir}/src/*.c")
  add_library(fourd_zfp STATIC ${_fourd_zfp_sources})
  target_include_directories(fourd_zfp SYSTEM PUBLIC "${_fourd_zfp_dir}/include")
  set_target_properties(fourd_zfp PROPERTIES C_STANDARD 99 C_STANDARD_REQUIRED ON
                                             POSITION_INDEPENDENT_CODE ON)
  if(CMAKE_C_COMPILER_ID MATCHES "GNU|Clang")
    target_compile_options(fourd_zfp PRIVATE -O3 -w)
  endif()
  set(FOURD_ZFP_PROVIDER "compiled from ${_fourd_zfp_dir}/src")
else()
  # The zfpy sdist: headers only; the implementation is the zfp inside libblosc2.a.
  file(STRINGS "${_fourd_blosc2_lib}" _fourd_bundled REGEX "zfp version [0-9]+\\.[0-9]+\\.[0-9]+"
       LIMIT_COUNT 1)
  string(REGEX MATCH "zfp version ([0-9]+\\.[0-9]+\\.[0-9]+)" _m "${_fourd_bundled}")
  if(NOT CMAKE_MATCH_1 STREQUAL _fourd_zfp_version)
    message(FATAL_ERROR
      "fourd: ${_fourd_zfp_dir} has zfp ${_fourd_zfp_version}'s headers but no "
      "include/zfp/bitstream.inl to compile its sources, and ${_fourd_blosc2_lib} carries zfp "
      "'${CMAKE_MATCH_1}', not the same version. Set FOURD_ZFP_SOURCE to a complete zfp "
      "${_fourd_zfp_version} source tree or tarball, or install a blosc2 wheel that bundles zfp "
      "${_fourd_zfp_version}.")
  endif()
  add_library(fourd_zfp INTERFACE)
  target_include_directories(fourd_zfp SYSTEM INTERFACE "${_fourd_zfp_dir}/include")
  set(FOURD_ZFP_PROVIDER "headers from ${_fourd_zfp_dir}, library inside libblosc2.a")
endif()
message(STATUS "fourd: ZFP ${_fourd_zfp_version}: ${FOURD_ZFP_PROVIDER}")

# fourd_codecs: what fourd_core links for its codecs. Order matters for a static link: zfp
# before libblosc2.a, so that a compiled fourd_zfp resolves every zfp symbol first.
add_library(fourd_codecs INTERFACE)
target_link_libraries(fourd_codecs INTERFACE fourd_zfp Blosc2::blosc2_static)
if(CMAKE_SYSTEM_NAME STREQUAL "Linux")
  # Keep their symbols out of the dynamic symbol table of what links them (the module fourd._C),
  # so that they never interpose on another copy of Blosc2 or ZFP in the same process.
  target_link_options(fourd_codecs INTERFACE
                      "LINKER:--exclude-libs,libblosc2.a" "LINKER:--exclude-libs,libfourd_zfp.a")
endif()

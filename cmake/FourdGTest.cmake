# GoogleTest without internet: an installed GTest package, else the sources that the
# `ros-gtest-vendor` wheel puts into the Python environment (<prefix>/src/gtest_vendor).
find_package(GTest QUIET)
if(NOT TARGET GTest::gtest)
  execute_process(COMMAND "${Python_EXECUTABLE}" -c "import sys; print(sys.prefix, end='')"
                  OUTPUT_VARIABLE _fourd_prefix)
  set(_gtest_root "${_fourd_prefix}/src/gtest_vendor")
  if(NOT EXISTS "${_gtest_root}/src/gtest-all.cc")
    message(FATAL_ERROR "fourd: GoogleTest not found. Install the test extra "
                        "(pip install '.[test]', which brings ros-gtest-vendor) or libgtest-dev.")
  endif()
  find_package(Threads REQUIRED)
  add_library(fourd_gtest STATIC "${_gtest_root}/src/gtest-all.cc")
  target_include_directories(fourd_gtest PUBLIC "${_gtest_root}/include" PRIVATE "${_gtest_root}")
  target_link_libraries(fourd_gtest PUBLIC Threads::Threads)
  add_library(GTest::gtest ALIAS fourd_gtest)
endif()

// fourd refuses to run when its MPI calls reach a library of another ABI family than the mpi.h
// it was compiled with (mpi4py built against Open MPI makes Open MPI's symbols global; fourd
// built against MPICH would then pass MPICH's integer handles to Open MPI and crash).
#include <gtest/gtest.h>

#include "fourd/grid.hpp"

namespace {

TEST(MpiLibrary, FamilyFromVersionString) {
  EXPECT_EQ(fourd::mpiFamily("MPICH Version:      5.0.2\nMPICH Release date: unreleased"), "MPICH");
  EXPECT_EQ(fourd::mpiFamily("Open MPI v4.1.4, package: Debian OpenMPI, ident: 4.1.4"), "Open MPI");
  EXPECT_EQ(fourd::mpiFamily("Intel(R) MPI Library 2021.10 for Linux* OS"), "MPICH");
  EXPECT_EQ(fourd::mpiFamily("MVAPICH2 Version      :\t2.3.7"), "MPICH");
  EXPECT_EQ(fourd::mpiFamily("some other MPI 1.0"), "");
  EXPECT_EQ(fourd::mpiFamily(""), "");
}

TEST(MpiLibrary, ThisBuildReachesTheLibraryOfItsHeader) {
  // MPI_Get_library_version may be called before MPI_Init.
  const std::string header = fourd::mpiHeaderFamily();
  ASSERT_FALSE(header.empty());
  EXPECT_EQ(fourd::mpiFamily(fourd::mpiLibraryVersion()), header);
  EXPECT_EQ(fourd::mpiAbiMismatch(), "");
}

}  // namespace

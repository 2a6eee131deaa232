// ProcessGrid and Topology: pure rank arithmetic, checked against brute-force enumeration.
#include <gtest/gtest.h>

#include <set>

#include "../grid_shapes.hpp"
#include "fourd/error.hpp"
#include "fourd/process_grid.hpp"
#include "fourd/topology.hpp"

using namespace fourd;

namespace {
const char* kOrders[] = {"x-y-z-data", "data-z-y-x", "z-x-data-y", "y-data-x-z"};
}  // namespace

TEST(ProcessGrid, DefaultOrderXInnermost) {
  ProcessGrid g({2, 3, 1, 2}, ProcessGrid::parseOrder("x-y-z-data"));
  EXPECT_EQ(g.worldSize(), 12);
  EXPECT_EQ(g.stride(Axis::kX), 1);
  EXPECT_EQ(g.stride(Axis::kY), 2);
  EXPECT_EQ(g.stride(Axis::kZ), 6);
  EXPECT_EQ(g.stride(Axis::kData), 6);
  EXPECT_EQ(g.groupRanks(0, maskOf(Axis::kX)), (std::vector<int>{0, 1}));
  EXPECT_EQ(g.groupRanks(7, maskOf(Axis::kY)), (std::vector<int>{7, 9, 11}));
  EXPECT_EQ(g.groupRanks(3, maskOf(Axis::kData)), (std::vector<int>{3, 9}));
  EXPECT_EQ(g.groupRanks(0, kWorldMask).size(), 12u);
}

TEST(ProcessGrid, RoundTripAndGroupsPartitionTheWorld) {
  for (int n : {1, 2, 6, 8, 12}) {
    for (auto sizes : test::gridShapes(n)) {
      for (const char* o : kOrders) {
        ProcessGrid g(sizes, ProcessGrid::parseOrder(o));
        for (int r = 0; r < n; ++r) EXPECT_EQ(g.rankOf(g.coords(r)), r);
        for (AxisMask m = 1; m <= kWorldMask; ++m) {
          std::set<int> colors;
          std::set<int> covered;
          for (int r = 0; r < n; ++r) {
            auto ranks = g.groupRanks(r, m);
            ASSERT_EQ(static_cast<int>(ranks.size()), g.groupSize(m));
            // My position in my group is my group rank; members agree on colour.
            EXPECT_EQ(ranks.at(g.groupRank(r, m)), r);
            for (int q : ranks) {
              EXPECT_EQ(g.groupColor(q, m), g.groupColor(r, m));
              // Members differ from r only along axes of m.
              auto cq = g.coords(q), cr = g.coords(r);
              for (int a = 0; a < 4; ++a)
                if (!(m & (1u << a))) EXPECT_EQ(cq[a], cr[a]);
            }
            colors.insert(g.groupColor(r, m));
            covered.insert(r);
          }
          EXPECT_EQ(static_cast<int>(colors.size()), n / g.groupSize(m));
        }
      }
    }
  }
}

TEST(ProcessGrid, InnermostAxisOfACombinationVariesFastest) {
  ProcessGrid g({2, 2, 2, 1}, ProcessGrid::parseOrder("z-x-y-data"));
  // (x, z) group of rank 0: z is innermost in this order.
  auto r = g.groupRanks(0, maskOf(Axis::kX) | maskOf(Axis::kZ));
  ASSERT_EQ(r.size(), 4u);
  EXPECT_EQ(g.coords(r[1])[static_cast<int>(Axis::kZ)], 1);
  EXPECT_EQ(g.coords(r[1])[static_cast<int>(Axis::kX)], 0);
  EXPECT_EQ(g.coords(r[2])[static_cast<int>(Axis::kX)], 1);
}

TEST(ProcessGrid, BadArgumentsThrowNamedErrors) {
  EXPECT_THROW(ProcessGrid::parseOrder("x-y-z"), InvalidArgument);
  EXPECT_THROW(ProcessGrid::parseOrder("x-y-y-data"), InvalidArgument);
  EXPECT_THROW(ProcessGrid::parseOrder("x-y-z-w"), InvalidArgument);
  EXPECT_THROW(ProcessGrid({0, 1, 1, 1}, ProcessGrid::parseOrder("x-y-z-data")), InvalidArgument);
  EXPECT_THROW(parseAxisMask("q"), InvalidArgument);
  EXPECT_THROW(parseAxisMask("x+x"), InvalidArgument);
  EXPECT_EQ(parseAxisMask("z+data"), maskOf(Axis::kZ) | maskOf(Axis::kData));
  EXPECT_EQ(parseAxisMask("world"), kWorldMask);
  try {
    ProcessGrid::parseOrder("x-y");
    FAIL();
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("order"), std::string::npos);
    EXPECT_NE(std::string(e.what()).find("'x-y'"), std::string::npos);
  }
}

TEST(Topology, VirtualNodesAndGroups) {
  Topology t = Topology::fromRanksPerNode(8, 2);
  EXPECT_EQ(t.numNodes(), 4);
  EXPECT_EQ(t.nodeOf(5), 2);
  EXPECT_EQ(t.localRank(5), 1);
  // A strided group {0, 2, 4, 6}: one rank on each of 4 nodes.
  auto g = t.group({0, 2, 4, 6});
  EXPECT_EQ(g.numNodes, 4);
  EXPECT_TRUE(g.uniform);
  EXPECT_EQ(g.k, 1);
  // A contiguous group {0..3}: 2 nodes x 2 ranks.
  auto h = t.group({0, 1, 2, 3});
  EXPECT_EQ(h.numNodes, 2);
  EXPECT_EQ(h.k, 2);
  EXPECT_EQ(h.localIndex, (std::vector<int>{0, 1, 0, 1}));
  EXPECT_EQ(h.nodeIndex, (std::vector<int>{0, 0, 1, 1}));
  EXPECT_EQ(h.memberAt(1, 0), 2);
  EXPECT_EQ(h.describe(), "2 nodes x 2 ranks");
}

TEST(Topology, UnevenGroups) {
  Topology t = Topology::fromRanksPerNode(6, 4);  // nodes of 4 and 2 ranks
  auto g = t.group({0, 1, 2, 3, 4, 5});
  EXPECT_FALSE(g.uniform);
  EXPECT_EQ(g.k, 0);
  EXPECT_EQ(g.ranksPerNode, (std::vector<int>{4, 2}));
  EXPECT_NE(g.describe().find("uneven"), std::string::npos);
  EXPECT_THROW(Topology::fromRanksPerNode(4, 0), InvalidArgument);
}

TEST(Topology, RenumbersArbitraryNodeIds) {
  Topology t({17, 17, 3, 3, 17});
  EXPECT_EQ(t.numNodes(), 2);
  EXPECT_EQ(t.nodeOf(0), 0);
  EXPECT_EQ(t.nodeOf(2), 1);
  EXPECT_EQ(t.localRank(4), 2);
  EXPECT_EQ(t.ranksOnNode(0), 3);
}

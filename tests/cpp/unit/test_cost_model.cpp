// The alpha-beta-gamma cost model: names, hand-checked small cases, placement effects,
// monotonicity and selection. No MPI.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "fourd/cost_model.hpp"
#include "fourd/error.hpp"

namespace fourd {
namespace {

constexpr Collective kAllCollectives[] = {Collective::kAllReduce, Collective::kAllGather,
                                          Collective::kReduceScatter, Collective::kBroadcast};
constexpr Algorithm kConcrete[] = {Algorithm::kFlat, Algorithm::kRing, Algorithm::kRhd,
                                   Algorithm::kHierarchical, Algorithm::kShm};

/// Unit costs: alpha = 1 s, every bandwidth 1 B/s, gamma = 0.5 s/B, so times are exact
/// small numbers that can be checked by hand.
MachineProfile unitProfile() {
  MachineProfile m;
  m.name = "unit";
  m.ranksPerNode = 4;
  m.intraAlpha = 1.0;
  m.intraBw = 1.0;
  m.interAlpha = 1.0;
  m.nicBw = 1.0;
  m.nicsPerNode = 4;
  m.reduceBw = 2.0;
  m.memcpyBw = 1.0;
  m.flatEfficiency = 1.0;
  return m;
}

/// A four-GPU node with four NICs, numbers of Perlmutter's order (GB/s, microseconds).
MachineProfile gpuProfile() {
  MachineProfile m;
  m.name = "gpu";
  m.ranksPerNode = 4;
  m.intraAlpha = 3e-6;
  m.intraBw = 225e9;
  m.interAlpha = 5e-6;
  m.nicBw = 20e9;
  m.nicsPerNode = 4;
  m.reduceBw = 500e9;
  m.memcpyBw = 500e9;
  m.flatEfficiency = 0.8;
  return m;
}

GroupShape oneNode(int p) { return GroupShape{p, 1, p, true}; }
GroupShape spanning(int nodes, int k) { return GroupShape{nodes * k, nodes, k, true}; }

double t(Collective c, Algorithm a, size_t n, const GroupShape& s, const MachineProfile& m,
         DataType d = DataType::kFloat32) {
  return predict(c, a, n, d, s, m);
}

// ---- names --------------------------------------------------------------------------------------

TEST(CostModelNames, RoundTrip) {
  for (Collective c : kAllCollectives) EXPECT_EQ(parseCollective(collectiveName(c)), c);
  for (int i = 0; i < kNumAlgorithms; ++i) {
    const Algorithm a = static_cast<Algorithm>(i);
    EXPECT_EQ(parseAlgorithm(algorithmName(a)), a);
  }
  EXPECT_STREQ(collectiveName(Collective::kReduceScatter), "reduce_scatter");
  EXPECT_STREQ(algorithmName(Algorithm::kHierarchical), "hierarchical");
  EXPECT_EQ(parseCollective("AllReduce"), Collective::kAllReduce);
  EXPECT_EQ(parseCollective("all-gather"), Collective::kAllGather);
  EXPECT_EQ(parseAlgorithm("RHD"), Algorithm::kRhd);
}

TEST(CostModelNames, ErrorsNameTheArgumentExpectedAndFound) {
  try {
    parseAlgorithm("tree", "algo");
    FAIL() << "no exception";
  } catch (const InvalidArgument& e) {
    const std::string w = e.what();
    EXPECT_NE(w.find("algo"), std::string::npos) << w;
    EXPECT_NE(w.find("hierarchical"), std::string::npos) << w;
    EXPECT_NE(w.find("'tree'"), std::string::npos) << w;
  }
  try {
    parseCollective("alltoall");
    FAIL() << "no exception";
  } catch (const InvalidArgument& e) {
    const std::string w = e.what();
    EXPECT_NE(w.find("collective"), std::string::npos) << w;
    EXPECT_NE(w.find("reduce_scatter"), std::string::npos) << w;
    EXPECT_NE(w.find("'alltoall'"), std::string::npos) << w;
  }
}

// ---- hand-checked small cases -------------------------------------------------------------------

TEST(CostModelHand, RingOnOneNode) {
  const MachineProfile m = unitProfile();
  const size_t n = 8;
  // AR, p = 4: 2(p-1) = 6 steps of (alpha + n/p/bw) = 6 * (1 + 2) = 18, plus gamma on
  // (p-1)/p n = 6 bytes at 0.5 s/B = 3.
  EXPECT_DOUBLE_EQ(t(Collective::kAllReduce, Algorithm::kRing, n, oneNode(4), m), 21.0);
  // AG: 3 steps of 3 s; RS adds the same gamma 3.
  EXPECT_DOUBLE_EQ(t(Collective::kAllGather, Algorithm::kRing, n, oneNode(4), m), 9.0);
  EXPECT_DOUBLE_EQ(t(Collective::kReduceScatter, Algorithm::kRing, n, oneNode(4), m), 12.0);
  // Broadcast as a pipelined chain with the best segment count: (sqrt((p-2) a) + sqrt(n/B))^2.
  EXPECT_DOUBLE_EQ(t(Collective::kBroadcast, Algorithm::kRing, n, oneNode(4), m),
                   std::pow(std::sqrt(2.0) + std::sqrt(8.0), 2));
  // p = 2 chain: one message.
  EXPECT_DOUBLE_EQ(t(Collective::kBroadcast, Algorithm::kRing, n, oneNode(2), m), 9.0);
}

TEST(CostModelHand, RhdOnOneNode) {
  const MachineProfile m = unitProfile();
  const size_t n = 8;
  // RS, p = 4: (1 + 4) + 4*0.5 then (1 + 2) + 2*0.5 = 7 + 4 = 11.
  EXPECT_DOUBLE_EQ(t(Collective::kReduceScatter, Algorithm::kRhd, n, oneNode(4), m), 11.0);
  // AG, p = 4: (1 + 2) + (1 + 4) = 8. AR (Rabenseifner) = 11 + 8.
  EXPECT_DOUBLE_EQ(t(Collective::kAllGather, Algorithm::kRhd, n, oneNode(4), m), 8.0);
  EXPECT_DOUBLE_EQ(t(Collective::kAllReduce, Algorithm::kRhd, n, oneNode(4), m), 19.0);
  // Non-power-of-two AG, p = 3, n = 6: fold n/p (1 + 2), unfold n (1 + 6), core on 2 ranks
  // (1 + 3): 14.
  EXPECT_DOUBLE_EQ(t(Collective::kAllGather, Algorithm::kRhd, 6, oneNode(3), m), 14.0);
  // Non-power-of-two AR, p = 3, n = 6: fold (1 + 6) + 6*0.5, unfold (1 + 6), core 2 ranks:
  // RS (1 + 3) + 3*0.5, AG (1 + 3): 10 + 7 + 5.5 + 4 = 26.5.
  EXPECT_DOUBLE_EQ(t(Collective::kAllReduce, Algorithm::kRhd, 6, oneNode(3), m), 26.5);
}

TEST(CostModelHand, ShmOnOneNode) {
  const MachineProfile m = unitProfile();
  // As shm.cpp runs them, k = p = 4, n = 8, barrier = log2(4) * alpha = 2. A rank never copies
  // its own slice in and reduces it straight into its output.
  // AR: copy (2 * 3/4 + 1/4) * 8 = 14, reduce 3/4 * 8 * 0.5 = 3, 2 barriers = 4: 21.
  EXPECT_DOUBLE_EQ(t(Collective::kAllReduce, Algorithm::kShm, 8, oneNode(4), m), 21.0);
  // AG: copy in my block and out the others = 8, one barrier = 2: 10.
  EXPECT_DOUBLE_EQ(t(Collective::kAllGather, Algorithm::kShm, 8, oneNode(4), m), 10.0);
  // RS: copy 3/4 * 8 = 6, reduce 3/4 * 8 * 0.5 = 3, one barrier = 2: 11.
  EXPECT_DOUBLE_EQ(t(Collective::kReduceScatter, Algorithm::kShm, 8, oneNode(4), m), 11.0);
}

TEST(CostModelHand, ShmUsesTheWindowBandwidthWhenGiven) {
  MachineProfile m = unitProfile();
  m.shmBw = 2.0;  // e.g. a host window behind a GPU's host link
  // AG: copy 8/2 + one barrier of 2 = 6.
  EXPECT_DOUBLE_EQ(t(Collective::kAllGather, Algorithm::kShm, 8, oneNode(4), m), 6.0);
  m.shmBw = -1.0;
  EXPECT_THROW(t(Collective::kAllGather, Algorithm::kShm, 8, oneNode(4), m), InvalidArgument);
}

TEST(CostModelHand, HierarchicalAllGatherTwoNodes) {
  MachineProfile m = unitProfile();
  m.intraBw = 4.0;
  m.memcpyBw = 8.0;
  // p = 8 on 2 nodes x 4. Rail: 2 ranks, AG of n/k = 8 bytes, each rank's network share
  // Be/R = 4/4 = 1: ring = rhd = 1 step (1 + 4) = 5. Intra: AG of 32 bytes on 4 ranks at 4 B/s:
  // ring 3 * (1 + 2) = 9, rhd (1 + 2) + (1 + 4) = 8 -> 8. Permute: alpha + 32/8 = 5. Total 18.
  EXPECT_DOUBLE_EQ(t(Collective::kAllGather, Algorithm::kHierarchical, 32, spanning(2, 4), m),
                   18.0);
  // AR: RS intra 8 + 12 gamma*... computed term by term:
  //   RS intra on 32 B: rhd (1 + 4) + 8 + (1 + 2) + 4 = 20; ring 3 * (1 + 2) + 12 = 21 -> 20.
  //   AR rail on 8 B over 2 ranks: ring 2 * (1 + 4) + 2 = 12; rhd (1+4)+2 + (1+4) = 12 -> 12.
  //   AG intra on 32 B: 8.  Total 40, no permute.
  EXPECT_DOUBLE_EQ(t(Collective::kAllReduce, Algorithm::kHierarchical, 32, spanning(2, 4), m),
                   40.0);
}

TEST(CostModelHand, GammaHalvesForHalfPrecisionAndAllGatherHasNone) {
  const MachineProfile m = unitProfile();
  const double f32 = t(Collective::kReduceScatter, Algorithm::kRing, 8, oneNode(4), m);
  const double bf16 =
      t(Collective::kReduceScatter, Algorithm::kRing, 8, oneNode(4), m, DataType::kBFloat16);
  const double f16 =
      t(Collective::kReduceScatter, Algorithm::kRing, 8, oneNode(4), m, DataType::kFloat16);
  EXPECT_DOUBLE_EQ(bf16 - f32, 3.0);  // the 6 reduced bytes cost 1 s/B instead of 0.5
  EXPECT_DOUBLE_EQ(f16, bf16);
  MachineProfile slow = m;
  slow.reduceBw = 1e-3;
  EXPECT_DOUBLE_EQ(t(Collective::kAllGather, Algorithm::kRing, 8, oneNode(4), slow),
                   t(Collective::kAllGather, Algorithm::kRing, 8, oneNode(4), m));
  EXPECT_DOUBLE_EQ(t(Collective::kBroadcast, Algorithm::kRhd, 8, oneNode(4), slow),
                   t(Collective::kBroadcast, Algorithm::kRhd, 8, oneNode(4), m));
}

// ---- placement ----------------------------------------------------------------------------------

TEST(CostModelPlacement, RingAcrossNodesIsPacedByTheNicShare) {
  MachineProfile m = gpuProfile();
  m.interAlpha = 0.0;
  m.intraAlpha = 0.0;
  const size_t n = size_t(1) << 30;
  // AG ring on 8 ranks: 7 steps of n/8. k = 1: every rank crosses, R = 4 flows share Be:
  // 20 GB/s each. k = 4: one crossing flow per group per node; fourd's ring stays on one NIC
  // (20 GB/s), the library's ring stripes over the node's 80 GB/s (times 1/efficiency).
  const double perStep = double(n) / 8;
  EXPECT_NEAR(t(Collective::kAllGather, Algorithm::kRing, n, spanning(8, 1), m), 7 * perStep / 20e9,
              1e-12);
  EXPECT_NEAR(t(Collective::kAllGather, Algorithm::kRing, n, spanning(2, 4), m), 7 * perStep / 20e9,
              1e-12);
  EXPECT_NEAR(t(Collective::kAllGather, Algorithm::kFlat, n, spanning(2, 4), m),
              7 * perStep / 80e9 / 0.8, 1e-12);
  // k = 2 of R = 4: two groups per node share Be, 40 GB/s for the library's ring.
  EXPECT_NEAR(t(Collective::kAllGather, Algorithm::kFlat, n, spanning(4, 2), m),
              7 * perStep / 40e9 / 0.8, 1e-12);
}

TEST(CostModelPlacement, RingStepsAcrossNodesPayTheInterNodeLatency) {
  MachineProfile m = unitProfile();
  m.interAlpha = 10.0;
  // 4 ranks on one node: 3 steps of alpha_i; on two nodes: 3 steps of alpha_e.
  EXPECT_DOUBLE_EQ(t(Collective::kAllGather, Algorithm::kRing, 4, oneNode(4), m), 6.0);
  EXPECT_DOUBLE_EQ(t(Collective::kAllGather, Algorithm::kRing, 4, spanning(2, 2), m),
                   3 * (10.0 + 1.0));
}

TEST(CostModelPlacement, MeshNodeGivesSmallGroupsFewerLinks) {
  MachineProfile m = gpuProfile();
  m.intraAlpha = 0.0;
  m.intraMesh = true;
  const size_t n = size_t(1) << 30;
  // R = 4 fully connected: a pair uses 1 of 3 links (75 GB/s), the whole node all 3 (225).
  EXPECT_NEAR(t(Collective::kAllGather, Algorithm::kRing, n, oneNode(2), m), (double(n) / 2) / 75e9,
              1e-12);
  EXPECT_NEAR(t(Collective::kAllGather, Algorithm::kRing, n, oneNode(4), m),
              3 * (double(n) / 4) / 225e9, 1e-12);
}

TEST(CostModelPlacement, HierarchicalSendsKTimesFewerNetworkBytesThanRhd) {
  MachineProfile m = gpuProfile();
  m.intraAlpha = m.interAlpha = 0.0;
  m.intraBw = 1e15;  // isolate the network term
  m.memcpyBw = 1e15;
  const size_t n = size_t(1) << 30;
  const GroupShape s = spanning(16, 4);
  const double rhd = t(Collective::kAllGather, Algorithm::kRhd, n, s, m);
  const double hier = t(Collective::kAllGather, Algorithm::kHierarchical, n, s, m);
  // rhd: n (N-1)/N per rank over the network; hierarchical: n/k (N-1)/N.
  EXPECT_NEAR(rhd, double(n) * 15 / 16 / 20e9, rhd * 1e-6);
  EXPECT_NEAR(hier, double(n) / 4 * 15 / 16 / 20e9, hier * 1e-3);
}

// ---- supported / unsupported --------------------------------------------------------------------

TEST(CostModelSupport, HierarchicalNeedsSeveralUniformNodesShmNeedsOne) {
  std::string why;
  EXPECT_FALSE(isSupported(Collective::kAllReduce, Algorithm::kHierarchical, oneNode(4), &why));
  EXPECT_NE(why.find("one node"), std::string::npos) << why;
  EXPECT_FALSE(isSupported(Collective::kAllReduce, Algorithm::kHierarchical,
                           GroupShape{5, 2, 0, false}, &why));
  EXPECT_NE(why.find("different numbers"), std::string::npos) << why;
  EXPECT_TRUE(isSupported(Collective::kAllGather, Algorithm::kHierarchical, spanning(2, 4)));
  EXPECT_FALSE(isSupported(Collective::kAllReduce, Algorithm::kShm, spanning(2, 4), &why));
  EXPECT_NE(why.find("spans 2 nodes"), std::string::npos) << why;
  EXPECT_TRUE(isSupported(Collective::kAllReduce, Algorithm::kShm, oneNode(4)));
  for (Collective c : kAllCollectives) {
    EXPECT_TRUE(isSupported(c, Algorithm::kAuto, oneNode(4)));
    EXPECT_TRUE(isSupported(c, Algorithm::kAuto, spanning(2, 4)));
    EXPECT_TRUE(isSupported(c, Algorithm::kFlat, GroupShape{5, 2, 0, false}));
  }
  const MachineProfile m = gpuProfile();
  EXPECT_TRUE(std::isinf(t(Collective::kAllReduce, Algorithm::kHierarchical, 1024, oneNode(4), m)));
  EXPECT_TRUE(std::isinf(t(Collective::kAllReduce, Algorithm::kShm, 1024, spanning(2, 4), m)));
}

TEST(CostModelSupport, CandidatesInEnumOrderWithReasons) {
  const auto cs =
      candidates(Collective::kAllReduce, 1 << 20, DataType::kFloat32, oneNode(4), gpuProfile());
  ASSERT_EQ(cs.size(), 5u);
  for (size_t i = 0; i < cs.size(); ++i) EXPECT_EQ(cs[i].algorithm, kConcrete[i]);
  EXPECT_FALSE(cs[3].supported);
  EXPECT_TRUE(std::isinf(cs[3].seconds));
  EXPECT_FALSE(cs[3].reason.empty());
  EXPECT_TRUE(cs[4].supported);
  EXPECT_GT(cs[4].seconds, 0.0);
}

TEST(CostModelSupport, BadShapesAndProfilesThrow) {
  const MachineProfile m = gpuProfile();
  EXPECT_THROW(t(Collective::kAllReduce, Algorithm::kRing, 8, GroupShape{0, 1, 1, true}, m),
               InvalidArgument);
  EXPECT_THROW(t(Collective::kAllReduce, Algorithm::kRing, 8, GroupShape{8, 2, 3, true}, m),
               InvalidArgument);
  EXPECT_THROW(t(Collective::kAllReduce, Algorithm::kRing, 8, GroupShape{2, 4, 1, false}, m),
               InvalidArgument);
  MachineProfile bad = m;
  bad.intraBw = 0.0;
  try {
    t(Collective::kAllReduce, Algorithm::kRing, 8, oneNode(4), bad);
    FAIL() << "no exception";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("intraBw"), std::string::npos) << e.what();
  }
  EXPECT_THROW(
      predict(static_cast<Collective>(9), Algorithm::kRing, 8, DataType::kFloat32, oneNode(4), m),
      InvalidArgument);
}

// ---- shape of the predictions -------------------------------------------------------------------

TEST(CostModelShape, NothingToMoveCostsNothing) {
  const MachineProfile m = gpuProfile();
  for (Collective c : kAllCollectives) {
    for (Algorithm a : {Algorithm::kFlat, Algorithm::kRing, Algorithm::kRhd, Algorithm::kShm}) {
      EXPECT_EQ(t(c, a, 1 << 20, oneNode(1), m), 0.0);
      EXPECT_EQ(t(c, a, 0, oneNode(4), m), 0.0);
    }
  }
}

TEST(CostModelShape, MonotonicInBytesAndFinite) {
  const MachineProfile m = gpuProfile();
  const std::vector<GroupShape> shapes = {
      oneNode(2),      oneNode(4),     oneNode(3),     spanning(2, 4),
      spanning(16, 4), spanning(8, 1), spanning(3, 2), GroupShape{6, 4, 0, false}};
  for (const GroupShape& s : shapes) {
    for (Collective c : kAllCollectives) {
      for (Algorithm a : kConcrete) {
        if (!isSupported(c, a, s)) continue;
        double prev = 0.0;
        for (size_t n = 1; n <= (size_t(1) << 32); n *= 4) {
          const double now = t(c, a, n, s, m, DataType::kBFloat16);
          ASSERT_TRUE(std::isfinite(now));
          EXPECT_GE(now, prev) << collectiveName(c) << " " << algorithmName(a) << " p=" << s.size
                               << " N=" << s.nodes << " n=" << n;
          prev = now;
        }
      }
    }
  }
}

TEST(CostModelShape, PipeliningOverlapsTheLevelsForLargeMessages) {
  MachineProfile m = gpuProfile();
  const GroupShape s = spanning(16, 4);
  const size_t big = size_t(1) << 30;
  const double sequential = t(Collective::kAllReduce, Algorithm::kHierarchical, big, s, m);
  m.hierarchicalChunks = 8;
  const double pipelined = t(Collective::kAllReduce, Algorithm::kHierarchical, big, s, m);
  EXPECT_LT(pipelined, sequential);
  // Small messages: chunking only adds latency.
  MachineProfile one = gpuProfile();
  EXPECT_GT(t(Collective::kAllReduce, Algorithm::kHierarchical, 1024, s, m),
            t(Collective::kAllReduce, Algorithm::kHierarchical, 1024, s, one));
}

// ---- selection ----------------------------------------------------------------------------------

TEST(CostModelChoose, LatencyAlgorithmsForTinyBandwidthAlgorithmsForLarge) {
  const MachineProfile m = gpuProfile();
  const GroupShape s = spanning(64, 4);  // 256 ranks
  const DataType bf16 = DataType::kBFloat16;
  EXPECT_EQ(choose(Collective::kAllGather, 1024, bf16, s, m), Algorithm::kRhd);
  EXPECT_EQ(choose(Collective::kReduceScatter, 1024, bf16, s, m), Algorithm::kRhd);
  // 64 MiB: rhd sends k times the hierarchical network bytes, the library's ring pays 255
  // inter-node latencies and its efficiency; the hierarchical schedule wins.
  const size_t big = size_t(64) << 20;
  for (Collective c : kAllCollectives) {
    if (c == Collective::kBroadcast) continue;
    EXPECT_EQ(choose(c, big, bf16, s, m), Algorithm::kHierarchical) << collectiveName(c);
  }
  // Two nodes: the hierarchical all-reduce sends half the network bytes of a ring.
  EXPECT_EQ(choose(Collective::kAllReduce, size_t(1) << 30, bf16, spanning(2, 4), m),
            Algorithm::kHierarchical);
  // A flat library with no inefficiency and a rail-striped ring wins the huge all-reduce at
  // many nodes when the hierarchical levels are not pipelined.
  MachineProfile ideal = m;
  ideal.flatEfficiency = 1.0;
  EXPECT_EQ(choose(Collective::kAllReduce, size_t(1) << 30, bf16, s, ideal), Algorithm::kFlat);
  ideal.hierarchicalChunks = 8;
  EXPECT_EQ(choose(Collective::kAllReduce, size_t(1) << 30, bf16, s, ideal),
            Algorithm::kHierarchical);
}

TEST(CostModelChoose, AutoIsNeverReturnedAndPredictsTheChoice) {
  const MachineProfile m = gpuProfile();
  for (const GroupShape& s : {oneNode(1), oneNode(4), spanning(4, 4), spanning(3, 1)}) {
    for (Collective c : kAllCollectives) {
      for (size_t n : {size_t(0), size_t(8), size_t(1) << 20, size_t(1) << 30}) {
        const Algorithm a = choose(c, n, DataType::kFloat32, s, m);
        EXPECT_NE(a, Algorithm::kAuto);
        EXPECT_TRUE(isSupported(c, a, s));
        EXPECT_DOUBLE_EQ(t(c, Algorithm::kAuto, n, s, m), t(c, a, n, s, m));
        for (Algorithm other : kConcrete) EXPECT_LE(t(c, a, n, s, m), t(c, other, n, s, m));
      }
    }
  }
}

TEST(CostModelChoose, TiesGoToTheLowerEnumValue) {
  // p == 1: everything is 0, so flat (the lowest concrete value) wins.
  EXPECT_EQ(choose(Collective::kAllReduce, 1 << 20, DataType::kFloat32, oneNode(1), gpuProfile()),
            Algorithm::kFlat);
}

TEST(CostModelChoose, SharedMemoryWinsOnOneCpuNodeForMidSizes) {
  // A CPU node: messages through MPI cost microseconds, shared memory copies are cheap.
  MachineProfile m;
  m.ranksPerNode = 8;
  m.intraAlpha = 2e-6;
  m.intraBw = 2e9;  // an MPI message inside a node is copied twice
  m.memcpyBw = 10e9;
  m.reduceBw = 5e9;
  m.flatEfficiency = 0.8;
  EXPECT_EQ(choose(Collective::kAllGather, 64 << 10, DataType::kFloat32, oneNode(8), m),
            Algorithm::kShm);
}

// ---- the cache tier and the 16-bit reduction rates ----------------------------------------------

/// unitProfile() with alpha = 0, so times are pure byte counts, and a cache tier.
MachineProfile cachedProfile(double cacheBytes, double gain) {
  MachineProfile m = unitProfile();
  m.intraAlpha = 0.0;
  m.interAlpha = 0.0;
  m.cacheBytes = cacheBytes;
  m.cacheBwGain = gain;
  return m;
}

TEST(CostModelCache, MemoryTimeScaleByHand) {
  EXPECT_DOUBLE_EQ(memoryTimeScale(unitProfile(), 1e12), 1.0);  // no tier
  const MachineProfile m = cachedProfile(100.0, 2.0);
  EXPECT_DOUBLE_EQ(memoryTimeScale(m, 50.0), 0.5);  // resident: 1 / gain
  EXPECT_DOUBLE_EQ(memoryTimeScale(m, 100.0), 0.5);
  EXPECT_DOUBLE_EQ(memoryTimeScale(m, 200.0), 0.75);  // half resident: 1 - 0.5 (1 - 1/2)
  EXPECT_DOUBLE_EQ(memoryTimeScale(m, 400.0), 0.875);
  EXPECT_THROW(memoryTimeScale(m, -1.0), InvalidArgument);
}

TEST(CostModelCache, RingPerByteTimeRisesAcrossTheCacheEdge) {
  // 4 ranks on one node, all-reduce: each rank touches 2n, the node 8n. cacheBytes = 8 KiB:
  // n = 1 KiB is resident (every memory term at gain x), n = 64 KiB streams (f = 1/64).
  const MachineProfile flat = cachedProfile(0.0, 1.0);
  const MachineProfile m = cachedProfile(8 * 1024.0, 2.0);
  const GroupShape s = oneNode(4);
  const size_t small = 1024, big = 64 * 1024;
  const double resident = t(Collective::kAllReduce, Algorithm::kRing, small, s, m);
  EXPECT_DOUBLE_EQ(resident, 0.5 * t(Collective::kAllReduce, Algorithm::kRing, small, s, flat));
  const double streaming = t(Collective::kAllReduce, Algorithm::kRing, big, s, m);
  const double scale = 1.0 - (1.0 / 64) * 0.5;
  EXPECT_NEAR(streaming, scale * t(Collective::kAllReduce, Algorithm::kRing, big, s, flat),
              1e-9 * streaming);
  EXPECT_GT(streaming / big, 1.9 * resident / small);
}

TEST(CostModelCache, NetworkTermsAreNotScaled) {
  // One rank per node on 4 nodes: the ring's every step crosses the network, whose bandwidth
  // the cache does not change (gamma is the only memory term left).
  MachineProfile noGamma = cachedProfile(0.0, 1.0);
  noGamma.reduceBw = 1e30;
  MachineProfile cached = noGamma;
  cached.cacheBytes = 1e12;
  cached.cacheBwGain = 4.0;
  const GroupShape s = spanning(4, 1);
  EXPECT_DOUBLE_EQ(t(Collective::kAllGather, Algorithm::kRing, 4096, s, cached),
                   t(Collective::kAllGather, Algorithm::kRing, 4096, s, noGamma));
  // Inside one node the same all-gather gets the gain.
  EXPECT_DOUBLE_EQ(4.0 * t(Collective::kAllGather, Algorithm::kRing, 4096, oneNode(4), cached),
                   t(Collective::kAllGather, Algorithm::kRing, 4096, oneNode(4), noGamma));
}

TEST(CostModelCache, ShmHalfStreamsHalfStaysInItsWindow) {
  // A 64 MiB all-reduce on 4 ranks with a 16 MiB cache: the private buffers stream
  // (f = 16 / 512), the window (4 MiB per rank, 16 MiB per node) stays resident.
  const MachineProfile flat = cachedProfile(0.0, 1.0);
  const MachineProfile m = cachedProfile(16.0 * (1 << 20), 2.0);
  const size_t n = size_t(64) << 20;
  const double full = 1.0 - (16.0 / 512) * 0.5;
  const double expected = 0.5 * (full + 0.5);
  EXPECT_NEAR(t(Collective::kAllReduce, Algorithm::kShm, n, oneNode(4), m),
              expected * t(Collective::kAllReduce, Algorithm::kShm, n, oneNode(4), flat), 1e-9 * n);
}

TEST(CostModelGamma16, DefaultIsTheFloat32ElementRate) {
  // reduceBw = 2 B/s: 16-bit input reduces at 1 B/s unless reduceBw16 says otherwise.
  MachineProfile m = cachedProfile(0.0, 1.0);
  const GroupShape s = oneNode(4);
  const size_t n = 4096;
  const double f32 = t(Collective::kAllReduce, Algorithm::kRing, n, s, m);
  const double bf16 = t(Collective::kAllReduce, Algorithm::kRing, n, s, m, DataType::kBFloat16);
  EXPECT_DOUBLE_EQ(bf16 - f32, 0.75 * n * (1.0 / 1.0 - 1.0 / 2.0));
  m.reduceBw16 = 0.25;  // slower conversions: (k-1)/k n (1/0.25 - 1/2) more
  const double slow = t(Collective::kAllReduce, Algorithm::kRing, n, s, m, DataType::kBFloat16);
  EXPECT_DOUBLE_EQ(slow - f32, 0.75 * n * (4.0 - 0.5));
  EXPECT_DOUBLE_EQ(t(Collective::kAllReduce, Algorithm::kRing, n, s, m, DataType::kFloat16), slow);
  // float32 and integers ignore it.
  EXPECT_DOUBLE_EQ(t(Collective::kAllReduce, Algorithm::kRing, n, s, m), f32);
}

TEST(CostModelGamma16, StreamingAddsTheFloat32MemoryStall) {
  // In the cache the 16-bit rate is as measured; streaming adds (s - 1/gain) / reduceBw.
  MachineProfile m = cachedProfile(8 * 1024.0, 2.0);
  m.reduceBw16 = 0.5;
  const GroupShape s = oneNode(4);
  auto gammaPart = [&](size_t n, DataType d) {
    MachineProfile noGamma = m;
    noGamma.reduceBw = 1e300;
    noGamma.reduceBw16 = 1e300;
    return t(Collective::kAllReduce, Algorithm::kRing, n, s, m, d) -
           t(Collective::kAllReduce, Algorithm::kRing, n, s, noGamma, d);
  };
  EXPECT_NEAR(gammaPart(1024, DataType::kBFloat16), 0.75 * 1024 / 0.5, 1e-6);
  const size_t big = 64 * 1024;
  const double scale = 1.0 - (1.0 / 64) * 0.5;
  EXPECT_NEAR(gammaPart(big, DataType::kBFloat16), 0.75 * big * (2.0 + (scale - 0.5) / 2.0),
              1e-6 * big);
}

TEST(CostModelGamma16, ShmKernelRateChangesOnlyShm) {
  MachineProfile m = cachedProfile(0.0, 1.0);
  m.reduceBw16 = 1.0;
  MachineProfile slowShm = m;
  slowShm.shmReduceBw16 = 0.25;
  const GroupShape s = oneNode(4);
  const size_t n = 4096;
  for (Algorithm a : {Algorithm::kFlat, Algorithm::kRing, Algorithm::kRhd}) {
    EXPECT_DOUBLE_EQ(t(Collective::kAllReduce, a, n, s, slowShm, DataType::kBFloat16),
                     t(Collective::kAllReduce, a, n, s, m, DataType::kBFloat16));
  }
  EXPECT_DOUBLE_EQ(t(Collective::kAllReduce, Algorithm::kShm, n, s, slowShm, DataType::kBFloat16) -
                       t(Collective::kAllReduce, Algorithm::kShm, n, s, m, DataType::kBFloat16),
                   0.75 * n * (4.0 - 1.0));
  // float32 is untouched by either 16-bit rate.
  EXPECT_DOUBLE_EQ(t(Collective::kAllReduce, Algorithm::kShm, n, s, slowShm),
                   t(Collective::kAllReduce, Algorithm::kShm, n, s, m));
}

TEST(CostModelCache, ProfileChecksNameTheField) {
  MachineProfile m = unitProfile();
  m.cacheBwGain = 0.5;
  try {
    predict(Collective::kAllReduce, Algorithm::kRing, 64, DataType::kFloat32, oneNode(4), m);
    FAIL() << "no exception";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("cacheBwGain"), std::string::npos) << e.what();
  }
  m = unitProfile();
  m.cacheBytes = -1.0;
  EXPECT_THROW(
      predict(Collective::kAllReduce, Algorithm::kRing, 64, DataType::kFloat32, oneNode(4), m),
      InvalidArgument);
  m = unitProfile();
  m.reduceBw16 = -1.0;
  EXPECT_THROW(
      predict(Collective::kAllReduce, Algorithm::kRing, 64, DataType::kFloat32, oneNode(4), m),
      InvalidArgument);
}

// ---- measured corrections (assumption 10) ------------------------------------------------

Correction point(Algorithm a, double nbytes, double factor, bool inPlace = false,
                 bool half16 = false, int groupSize = 4, int nodes = 1) {
  Correction c;
  c.collective = Collective::kAllReduce;
  c.algorithm = a;
  c.groupSize = groupSize;
  c.nodes = nodes;
  c.half16 = half16;
  c.inPlace = inPlace;
  c.nbytes = nbytes;
  c.factor = factor;
  return c;
}

double ringAR(size_t n, const MachineProfile& m, bool inPlace = false,
              DataType dt = DataType::kFloat32) {
  return predict(Collective::kAllReduce, Algorithm::kRing, n, dt, oneNode(4), m, inPlace);
}

TEST(CostModelCorrections, ExactAtPointsInterpolatedInLogSizeHeldBelowAndAbove) {
  const MachineProfile plain = unitProfile();
  MachineProfile m = plain;
  m.corrections = {point(Algorithm::kRing, 1024, 0.5), point(Algorithm::kRing, 4096, 2.0)};
  // At the points: exactly the factor.
  EXPECT_DOUBLE_EQ(ringAR(1024, m), 0.5 * ringAR(1024, plain));
  EXPECT_DOUBLE_EQ(ringAR(4096, m), 2.0 * ringAR(4096, plain));
  // Halfway in log size (2048): the geometric mean of the factors, 1.
  EXPECT_NEAR(ringAR(2048, m), ringAR(2048, plain), 1e-9 * ringAR(2048, plain));
  // Below the smallest point: held.
  EXPECT_DOUBLE_EQ(ringAR(64, m), 0.5 * ringAR(64, plain));
  // Above the largest: held.
  EXPECT_DOUBLE_EQ(ringAR(8192, m), 2.0 * ringAR(8192, plain));
  EXPECT_DOUBLE_EQ(ringAR(1 << 20, m), 2.0 * ringAR(1 << 20, plain));
}

TEST(CostModelCorrections, GroupsSpanningNodesMatchTheirOwnShape) {
  const MachineProfile plain = unitProfile();
  MachineProfile m = plain;
  GroupShape rail;
  rail.size = 4;
  rail.nodes = 4;
  rail.ranksPerNode = 1;
  rail.uniform = true;
  m.corrections = {point(Algorithm::kRhd, 1 << 20, 2.0, false, false, 4, 4)};
  auto rhd = [&](size_t n, const MachineProfile& p) {
    return predict(Collective::kAllReduce, Algorithm::kRhd, n, DataType::kFloat32, rail, p);
  };
  EXPECT_DOUBLE_EQ(rhd(1 << 20, m), 2.0 * rhd(1 << 20, plain));
  EXPECT_DOUBLE_EQ(rhd(64 << 20, m), 2.0 * rhd(64 << 20, plain));
  EXPECT_DOUBLE_EQ(rhd(1024, m), 2.0 * rhd(1024, plain));
  // The same point on one node's group of 4 does not apply there (node count differs).
  EXPECT_DOUBLE_EQ(
      predict(Collective::kAllReduce, Algorithm::kRhd, 1 << 20, DataType::kFloat32, oneNode(4), m),
      predict(Collective::kAllReduce, Algorithm::kRhd, 1 << 20, DataType::kFloat32, oneNode(4),
              plain));
}

TEST(CostModelCorrections, OnlyMatchingPointsApply) {
  const MachineProfile plain = unitProfile();
  MachineProfile m = plain;
  m.corrections = {point(Algorithm::kRing, 1024, 3.0, /*inPlace=*/true)};
  // Another algorithm, group size or collective: the plain model.
  EXPECT_DOUBLE_EQ(ringAR(1024, m, true), 3.0 * ringAR(1024, plain));
  // The other placement: its points apply while the call's own placement has none.
  EXPECT_DOUBLE_EQ(ringAR(1024, m, false), 3.0 * ringAR(1024, plain));
  // The other float width: its points apply while the call's own width has none.
  EXPECT_DOUBLE_EQ(ringAR(1024, m, true, DataType::kBFloat16),
                   3.0 * ringAR(1024, plain, true, DataType::kBFloat16));
  EXPECT_DOUBLE_EQ(predict(Collective::kAllReduce, Algorithm::kRhd, 1024, DataType::kFloat32,
                           oneNode(4), m, true),
                   predict(Collective::kAllReduce, Algorithm::kRhd, 1024, DataType::kFloat32,
                           oneNode(4), plain, true));
  EXPECT_DOUBLE_EQ(predict(Collective::kAllReduce, Algorithm::kRing, 1024, DataType::kFloat32,
                           oneNode(2), m, true),
                   predict(Collective::kAllReduce, Algorithm::kRing, 1024, DataType::kFloat32,
                           oneNode(2), plain, true));
  EXPECT_DOUBLE_EQ(predict(Collective::kAllGather, Algorithm::kRing, 1024, DataType::kFloat32,
                           oneNode(4), m, true),
                   predict(Collective::kAllGather, Algorithm::kRing, 1024, DataType::kFloat32,
                           oneNode(4), plain, true));
  // Once the call's own width has points, only they apply, to every size (held below).
  m.corrections.push_back(point(Algorithm::kRing, 4096, 0.25, true, /*half16=*/true));
  EXPECT_DOUBLE_EQ(ringAR(1024, m, true, DataType::kFloat16),
                   0.25 * ringAR(1024, plain, true, DataType::kFloat16));
  EXPECT_DOUBLE_EQ(ringAR(1024, m, true), 3.0 * ringAR(1024, plain));
  // The other width comes before the other placement: a 16-bit out-of-place call takes the
  // float32 out-of-place point over the 16-bit in-place one.
  m.corrections.push_back(point(Algorithm::kRing, 1024, 5.0, false, false));
  EXPECT_DOUBLE_EQ(ringAR(1024, m, false, DataType::kBFloat16),
                   5.0 * ringAR(1024, plain, false, DataType::kBFloat16));
  EXPECT_DOUBLE_EQ(ringAR(1024, m, false), 5.0 * ringAR(1024, plain));
}

TEST(CostModelCorrections, TheyDecideTheChoiceAndExplainShowsThem) {
  MachineProfile m = unitProfile();
  const size_t n = 1 << 20;
  const Algorithm plainChoice =
      choose(Collective::kAllReduce, n, DataType::kFloat32, oneNode(4), m, true);
  // Make every other candidate measured 10x slower than predicted: the plain choice stays; then
  // make the plain choice 100x slower: it loses.
  for (Algorithm a : kConcrete) {
    if (a != plainChoice) m.corrections.push_back(point(a, double(n), 10.0, true));
  }
  EXPECT_EQ(choose(Collective::kAllReduce, n, DataType::kFloat32, oneNode(4), m, true),
            plainChoice);
  m.corrections.push_back(point(plainChoice, double(n), 100.0, true));
  EXPECT_NE(choose(Collective::kAllReduce, n, DataType::kFloat32, oneNode(4), m, true),
            plainChoice);
  // Out of place with points of its own, all exact: the plain model's choice.
  for (Algorithm a : kConcrete) m.corrections.push_back(point(a, double(n), 1.0, false));
  EXPECT_EQ(choose(Collective::kAllReduce, n, DataType::kFloat32, oneNode(4), m, false),
            plainChoice);
  for (const Prediction& p :
       candidates(Collective::kAllReduce, n, DataType::kFloat32, oneNode(4), m, true)) {
    if (!p.supported) continue;
    EXPECT_GT(p.correction, 1.0) << algorithmName(p.algorithm);
    EXPECT_NE(p.reason.find("measured"), std::string::npos) << p.reason;
    EXPECT_DOUBLE_EQ(p.correction, correctionFactor(m, Collective::kAllReduce, p.algorithm,
                                                    oneNode(4), DataType::kFloat32, true, n));
  }
}

TEST(CostModelCorrections, BadPointsThrowNamingTheField) {
  auto expectField = [](const Correction& c, const char* field) {
    MachineProfile m = unitProfile();
    m.corrections = {c};
    try {
      predict(Collective::kAllReduce, Algorithm::kRing, 64, DataType::kFloat32, oneNode(4), m);
      FAIL() << "no exception for " << field;
    } catch (const InvalidArgument& e) {
      EXPECT_NE(std::string(e.what()).find(field), std::string::npos) << e.what();
    }
  };
  expectField(point(Algorithm::kRing, 0.0, 1.0), "corrections[0].nbytes");
  expectField(point(Algorithm::kRing, 64, 0.0), "corrections[0].factor");
  expectField(point(Algorithm::kRing, 64, std::numeric_limits<double>::infinity()),
              "corrections[0].factor");
  expectField(point(Algorithm::kAuto, 64, 1.0), "corrections[0].algorithm");
  expectField(point(Algorithm::kRing, 64, 1.0, false, false, 2, 3), "corrections[0].nodes");
}

}  // namespace
}  // namespace fourd

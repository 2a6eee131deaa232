// Every collective x algorithm x axis mask x dtype on integer-valued data, against closed-form
// results (sums of known per-rank values are exact). Runs at whatever world size mpiexec gives.
#include <gtest/gtest.h>
#include <mpi.h>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <vector>

#include "../grid_shapes.hpp"
#include "fourd/error.hpp"
#include "fourd/grid.hpp"
#include "internal/comm_state.hpp"
#include "internal/reduce_kernels.hpp"

using namespace fourd;

namespace {

int worldSize() {
  int n = 0;
  MPI_Comm_size(MPI_COMM_WORLD, &n);
  return n;
}
int worldRank() {
  int r = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &r);
  return r;
}

// Value of element i on world rank r: small integers so products and sums stay exact.
double value(int r, size_t i) {
  return static_cast<double>((r + 1 + static_cast<int>(i % 3)) % 4 + 1);
}

void store(void* p, size_t i, DataType t, double v) {
  switch (t) {
    case DataType::kFloat32:
      static_cast<float*>(p)[i] = static_cast<float>(v);
      break;
    case DataType::kFloat64:
      static_cast<double*>(p)[i] = v;
      break;
    case DataType::kFloat16:
      static_cast<uint16_t*>(p)[i] = detail::floatToHalf(static_cast<float>(v));
      break;
    case DataType::kBFloat16:
      static_cast<uint16_t*>(p)[i] = detail::floatToBf16(static_cast<float>(v));
      break;
    case DataType::kInt8:
      static_cast<int8_t*>(p)[i] = static_cast<int8_t>(v);
      break;
    case DataType::kUInt8:
      static_cast<uint8_t*>(p)[i] = static_cast<uint8_t>(v);
      break;
    case DataType::kInt32:
      static_cast<int32_t*>(p)[i] = static_cast<int32_t>(v);
      break;
    case DataType::kInt64:
      static_cast<int64_t*>(p)[i] = static_cast<int64_t>(v);
      break;
  }
}

double load(const void* p, size_t i, DataType t) {
  switch (t) {
    case DataType::kFloat32:
      return static_cast<const float*>(p)[i];
    case DataType::kFloat64:
      return static_cast<const double*>(p)[i];
    case DataType::kFloat16:
      return detail::halfToFloat(static_cast<const uint16_t*>(p)[i]);
    case DataType::kBFloat16:
      return detail::bf16ToFloat(static_cast<const uint16_t*>(p)[i]);
    case DataType::kInt8:
      return static_cast<const int8_t*>(p)[i];
    case DataType::kUInt8:
      return static_cast<const uint8_t*>(p)[i];
    case DataType::kInt32:
      return static_cast<const int32_t*>(p)[i];
    case DataType::kInt64:
      return static_cast<const int64_t*>(p)[i];
  }
  return 0;
}

double expected(ReduceOp op, const std::vector<int>& ranks, size_t i) {
  double acc = value(ranks[0], i);
  for (size_t k = 1; k < ranks.size(); ++k) {
    const double v = value(ranks[k], i);
    switch (op) {
      case ReduceOp::kSum:
      case ReduceOp::kAvg:
        acc += v;
        break;
      case ReduceOp::kProd:
        acc *= v;
        break;
      case ReduceOp::kMin:
        acc = std::min(acc, v);
        break;
      case ReduceOp::kMax:
        acc = std::max(acc, v);
        break;
    }
  }
  if (op == ReduceOp::kAvg) acc /= ranks.size();
  return acc;
}

bool exactFor(ReduceOp op, DataType t, int groupSize) {
  // Keep results representable: products of up to 8 values <= 4 overflow int8 / bf16 mantissa.
  if (op == ReduceOp::kProd && groupSize > 3 &&
      (t == DataType::kInt8 || t == DataType::kUInt8 || t == DataType::kFloat16 ||
       t == DataType::kBFloat16))
    return false;
  return true;
}

struct Case {
  std::array<int, 4> sizes;
  const char* order;
  int rpn;
};

std::vector<Case> cases() {
  const int n = worldSize();
  std::vector<Case> out;
  const char* orders[] = {"x-y-z-data", "data-z-y-x", "z-x-data-y"};
  // Virtual nodes rotate over: none (the real node), 1 rank each, n/2 each, and an uneven split
  // (3 ranks per node on 4 or 8 ranks: nodes of 3+1 or 3+3+2).
  std::vector<int> rpns = {0, 1, std::max(1, n / 2)};
  if (n >= 4) rpns.push_back(3);
  int i = 0;
  for (auto s : test::gridShapes(n)) {
    out.push_back({s, orders[i % 3], n > 1 ? rpns[i % rpns.size()] : 0});
    ++i;
  }
  return out;
}

bool near(double got, double want, DataType t) {
  const double tol = (t == DataType::kFloat16 || t == DataType::kBFloat16) ? 1e-2
                     : t == DataType::kFloat32                             ? 1e-6
                                                                           : 1e-12;
  return std::abs(got - want) <= tol * std::abs(want);
}

}  // namespace

// Every algorithm on every axis mask of every grid shape. The full dtype x count cross product
// takes too long with 8 ranks on 2 cores, so the dtype rotates over (grid, mask, algorithm):
// every dtype meets every algorithm on many masks. All ops run at count 7, in place and out of
// place; sums at 1 and 1000 (counts not divisible by most group sizes).
TEST(Collectives, AllAlgorithmsAgainstClosedForm) {
  const int me = worldRank();
  const DataType dtypes[] = {DataType::kFloat32,  DataType::kFloat64, DataType::kFloat16,
                             DataType::kBFloat16, DataType::kInt8,    DataType::kUInt8,
                             DataType::kInt32,    DataType::kInt64};
  int rot = 0;
  for (const auto& c : cases()) {
    GridConfig cfg;
    cfg.sizes = c.sizes;
    cfg.order = c.order;
    cfg.ranksPerNode = c.rpn;
    cfg.timeoutSeconds = 60;
    Grid grid(MPI_COMM_WORLD, cfg);
    for (AxisMask m = 1; m <= kWorldMask; ++m) {
      Communicator& comm = grid.communicator(m);
      const auto& ranks = comm.worldRanks();
      const int p = comm.size();
      for (int a = 1; a < kNumAlgorithms; ++a) {
        const Algorithm algo = static_cast<Algorithm>(a);
        ASSERT_NE(detail::algorithmImpl(algo), nullptr)
            << algorithmName(algo) << " is not built in";
        const DataType t = dtypes[(rot++) % 8];
        for (size_t count : {size_t(1), size_t(7), size_t(1000)}) {
          SCOPED_TRACE(std::string("grid ") + std::to_string(c.sizes[0]) + "x" +
                       std::to_string(c.sizes[1]) + "x" + std::to_string(c.sizes[2]) + "x" +
                       std::to_string(c.sizes[3]) + " " + c.order + " rpn " +
                       std::to_string(c.rpn) + " axis " + maskName(m) + " (" +
                       comm.topology().describe() + ") algo " + algorithmName(algo) + " dtype " +
                       toString(t) + " count " + std::to_string(count));
          CallOptions o;
          o.algorithm = algo;
          const size_t es = dataTypeSize(t);
          for (ReduceOp op :
               {ReduceOp::kSum, ReduceOp::kProd, ReduceOp::kMin, ReduceOp::kMax, ReduceOp::kAvg}) {
            if (count != 7 && op != ReduceOp::kSum) continue;
            if (op == ReduceOp::kAvg && !isFloating(t)) continue;
            if (!exactFor(op, t, p)) continue;
            for (bool inPlace : {true, false}) {
              if (!inPlace && count != 7) continue;
              std::vector<char> buf(count * es), res(count * es);
              for (size_t i = 0; i < count; ++i) store(buf.data(), i, t, value(me, i));
              Buffer b(buf.data(), count, t);
              Buffer r = inPlace ? b : Buffer(res.data(), count, t);
              try {
                comm.allReduce(b, r, op, o);
              } catch (const InvalidArgument& e) {
                // The algorithm cannot run this group (hierarchical on one node or on uneven
                // nodes, shm across nodes): the message says so and why.
                std::string w = e.what();
                ASSERT_NE(w.find("cannot run"), std::string::npos) << w;
                std::string why;
                ASSERT_FALSE(detail::algorithmImpl(algo)->supports(Collective::kAllReduce,
                                                                   comm.group(), &why));
                ASSERT_FALSE(why.empty());
                goto next_algo;
              }
              for (size_t i = 0; i < count; ++i) {
                const double want = expected(op, ranks, i);
                const double got = load(r.data, i, t);
                if (op == ReduceOp::kAvg)
                  ASSERT_TRUE(near(got, want, t))
                      << "element " << i << " got " << got << " want " << want;
                else
                  ASSERT_EQ(got, want) << "element " << i << " op " << toString(op);
              }
            }
          }
          {
            // all_gather, out of place and (count 7) in place from this rank's block.
            std::vector<char> in(count * es), out(count * es * p);
            for (size_t i = 0; i < count; ++i) store(in.data(), i, t, value(me, i));
            if (count == 7) {
              std::memcpy(out.data() + comm.rank() * count * es, in.data(), count * es);
              comm.allGather(Buffer(out.data() + comm.rank() * count * es, count, t),
                             Buffer(out.data(), count * p, t), o);
            } else {
              comm.allGather(Buffer(in.data(), count, t), Buffer(out.data(), count * p, t), o);
            }
            for (int g = 0; g < p; ++g)
              for (size_t i = 0; i < count; ++i)
                ASSERT_EQ(load(out.data(), g * count + i, t), value(ranks[g], i)) << "block " << g;
          }
          for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kMax}) {
            if (op != ReduceOp::kSum && count != 7) continue;
            // reduce_scatter: block g of rank r holds value(r, g*count+i)
            std::vector<char> in(count * es * p), out(count * es);
            for (size_t i = 0; i < count * p; ++i) store(in.data(), i, t, value(me, i));
            comm.reduceScatter(Buffer(in.data(), count * p, t), Buffer(out.data(), count, t), op,
                               o);
            const int g = comm.rank();
            for (size_t i = 0; i < count; ++i)
              ASSERT_EQ(load(out.data(), i, t), expected(op, ranks, g * count + i))
                  << "op " << toString(op);
          }
        }
      next_algo:;
      }
      // broadcast from every root, and a barrier.
      for (int root = 0; root < p; ++root) {
        std::vector<int32_t> v(5, me == ranks[root] ? 42 + root : -1);
        comm.broadcast(Buffer(v.data(), 5, DataType::kInt32), root);
        for (int x : v) ASSERT_EQ(x, 42 + root);
      }
      comm.barrier();
    }
  }
}

// Large counts (several ring segments and shared-memory chunks, counts not divisible by k or N)
// and every level combination of "hierarchical" (FOURD_HIERARCHICAL_INTRA/INTER/CHUNKS).
TEST(Collectives, LargeCountsAndHierarchicalLevels) {
  const int n = worldSize();  // at 1 rank every algorithm reduces to a copy: still checked
  const int me = worldRank();
  GridConfig cfg;
  cfg.sizes = {n % 2 == 0 ? 2 : 1, 1, 1, n % 2 == 0 ? n / 2 : n};
  // Two virtual nodes of n/2 ranks (k = 4 at 8 ranks: in-place reductions whose output aliases
  // a source other than the first), or one rank per node for odd n.
  cfg.ranksPerNode = n % 2 == 0 ? n / 2 : 1;
  cfg.timeoutSeconds = 120;
  Grid grid(MPI_COMM_WORLD, cfg);
  const size_t big = (size_t(1) << 20) + 3;
  auto check = [&](Communicator& comm, Algorithm algo, DataType t, size_t count) {
    const auto& ranks = comm.worldRanks();
    const int p = comm.size();
    const size_t es = dataTypeSize(t);
    CallOptions o;
    o.algorithm = algo;
    std::string why;
    if (p > 1 && !detail::algorithmImpl(algo)->supports(Collective::kAllReduce, comm.group(), &why))
      return;
    SCOPED_TRACE(std::string("axis ") + comm.name() + " algo " + algorithmName(algo) + " dtype " +
                 toString(t) + " count " + std::to_string(count));
    std::vector<char> buf(count * es);
    for (size_t i = 0; i < count; ++i) store(buf.data(), i, t, value(me, i));
    comm.allReduce(Buffer(buf.data(), count, t), Buffer(buf.data(), count, t), ReduceOp::kSum, o);
    for (size_t i = 0; i < count; ++i)
      ASSERT_EQ(load(buf.data(), i, t), expected(ReduceOp::kSum, ranks, i))
          << "all_reduce element " << i;
    const size_t m = count / p + 1;
    std::vector<char> in(m * es), out(m * p * es);
    for (size_t i = 0; i < m; ++i) store(in.data(), i, t, value(me, i));
    comm.allGather(Buffer(in.data(), m, t), Buffer(out.data(), m * p, t), o);
    for (int g = 0; g < p; ++g)
      for (size_t i = 0; i < m; ++i)
        ASSERT_EQ(load(out.data(), g * m + i, t), value(ranks[g], i)) << "all_gather block " << g;
    std::vector<char> rin(m * p * es), rout(m * es);
    for (size_t i = 0; i < m * p; ++i) store(rin.data(), i, t, value(me, i));
    comm.reduceScatter(Buffer(rin.data(), m * p, t), Buffer(rout.data(), m, t), ReduceOp::kSum, o);
    for (size_t i = 0; i < m; ++i)
      ASSERT_EQ(load(rout.data(), i, t), expected(ReduceOp::kSum, ranks, comm.rank() * m + i))
          << "reduce_scatter element " << i;
  };
  for (AxisMask m : {maskOf(Axis::kX), kWorldMask}) {
    Communicator& comm = grid.communicator(m);
    for (int a = 1; a < kNumAlgorithms; ++a)
      check(comm, static_cast<Algorithm>(a), DataType::kFloat32, big);
    check(comm, Algorithm::kRing, DataType::kBFloat16, big);
    check(comm, Algorithm::kShm, DataType::kInt64, 1000003);
  }
  Communicator& world = grid.communicator(kWorldMask);
  if (world.topology().numNodes > 1 && world.topology().uniform) {
    for (const char* intra : {"ring", "rhd", "shm"})
      for (const char* inter : {"ring", "rhd"})
        for (const char* chunks : {"1", "3"}) {
          setenv("FOURD_HIERARCHICAL_INTRA", intra, 1);
          setenv("FOURD_HIERARCHICAL_INTER", inter, 1);
          setenv("FOURD_HIERARCHICAL_CHUNKS", chunks, 1);
          SCOPED_TRACE(std::string("levels ") + intra + "/" + inter + " chunks " + chunks);
          check(world, Algorithm::kHierarchical, DataType::kInt32, (size_t(1) << 19) + 5);
          check(world, Algorithm::kHierarchical, DataType::kFloat64, 13);
        }
    unsetenv("FOURD_HIERARCHICAL_INTRA");
    unsetenv("FOURD_HIERARCHICAL_INTER");
    unsetenv("FOURD_HIERARCHICAL_CHUNKS");
  }
}

TEST(Collectives, AsyncOperationsOnSeveralAxesAndOrderPerGroup) {
  const int n = worldSize();
  GridConfig cfg;
  cfg.sizes = {n % 2 == 0 ? 2 : 1, 1, 1, n % 2 == 0 ? n / 2 : n};
  Grid grid(MPI_COMM_WORLD, cfg);
  const int me = worldRank();
  Communicator& x = grid.communicator(maskOf(Axis::kX));
  Communicator& d = grid.communicator(maskOf(Axis::kData));
  CallOptions async;
  async.async = true;
  std::vector<std::vector<int64_t>> bufs(20, std::vector<int64_t>(4096, me + 1));
  std::vector<std::shared_ptr<Work>> works;
  for (int i = 0; i < 20; ++i) {
    Communicator& c = i % 2 ? x : d;
    works.push_back(c.allReduce(Buffer(bufs[i].data(), 4096, DataType::kInt64),
                                Buffer(bufs[i].data(), 4096, DataType::kInt64), ReduceOp::kSum,
                                async));
  }
  for (auto& w : works) EXPECT_TRUE(w->wait(60));
  for (int i = 0; i < 20; ++i) {
    Communicator& c = i % 2 ? x : d;
    int64_t want = 0;
    for (int r : c.worldRanks()) want += r + 1;
    EXPECT_EQ(bufs[i][0], want);
    EXPECT_EQ(bufs[i][4095], want);
  }
}

TEST(Collectives, InvalidArgumentsThrowBeforeCommunicating) {
  GridConfig cfg;
  cfg.sizes = {worldSize(), 1, 1, 1};
  Grid grid(MPI_COMM_WORLD, cfg);
  Communicator& c = grid.communicator(kWorldMask);
  std::vector<int32_t> a(16), b(4);
  std::vector<float> f(4);
  EXPECT_THROW(c.allReduce(Buffer(a.data(), 4, DataType::kInt32),
                           Buffer(f.data(), 4, DataType::kFloat32), ReduceOp::kSum),
               TypeMismatch);
  EXPECT_THROW(c.allReduce(Buffer(a.data(), 4, DataType::kInt32),
                           Buffer(a.data(), 4, DataType::kInt32), ReduceOp::kAvg),
               InvalidArgument);
  EXPECT_THROW(
      c.allGather(Buffer(a.data(), 4, DataType::kInt32), Buffer(b.data(), 3, DataType::kInt32)),
      InvalidArgument);
  EXPECT_THROW(c.broadcast(Buffer(a.data(), 4, DataType::kInt32), worldSize()), InvalidArgument);
  if (worldSize() > 1) {
    // An input count that is not size() x the output count.
    EXPECT_THROW(c.reduceScatter(Buffer(a.data(), worldSize() + 1, DataType::kInt32),
                                 Buffer(b.data(), 1, DataType::kInt32), ReduceOp::kSum),
                 InvalidArgument);
  }
  // Still usable afterwards (nothing was sent).
  std::vector<int32_t> v(4, 1);
  c.allReduce(Buffer(v.data(), 4, DataType::kInt32), Buffer(v.data(), 4, DataType::kInt32),
              ReduceOp::kSum);
  EXPECT_EQ(v[0], worldSize());
}

TEST(Grid, MismatchedArgumentsRaiseOnEveryRank) {
  if (worldSize() < 2) GTEST_SKIP() << "needs 2 ranks";
  GridConfig cfg;
  cfg.sizes = {worldSize(), 1, 1, 1};
  cfg.order = worldRank() == 0 ? "data-z-y-x" : "x-y-z-data";
  cfg.timeoutSeconds = 30;
  EXPECT_THROW(Grid(MPI_COMM_WORLD, cfg), MismatchError);
  cfg.order = "x-y-z-data";
  cfg.sizes = {worldRank() == 0 ? 3 * worldSize() : worldSize(), 1, 1, 1};
  EXPECT_THROW(Grid(MPI_COMM_WORLD, cfg), Error);
}

TEST(Grid, APoisonedGroupIsMadeAnewWhenAskedAgain) {
  if (worldSize() < 2) GTEST_SKIP() << "needs 2 ranks";
  GridConfig cfg;
  cfg.sizes = {worldSize(), 1, 1, 1};
  cfg.timeoutSeconds = 30;
  Grid grid(MPI_COMM_WORLD, cfg);
  std::vector<int> ranks;
  for (int r = worldSize() - 1; r >= 0; --r) ranks.push_back(r);  // not an axis
  Communicator& first = grid.group(ranks, 30);
  EXPECT_EQ(&grid.group(ranks, 30), &first);  // healthy: cached
  first.abort("the test");
  EXPECT_TRUE(first.poisoned());
  EXPECT_NE(first.poisonReason().find("the test"), std::string::npos);
  Communicator& again = grid.group(ranks, 30);
  ASSERT_NE(&again, &first);
  EXPECT_FALSE(again.poisoned());
  EXPECT_EQ(again.worldRanks(), ranks);
  std::vector<int32_t> v(5, worldRank() + 1);
  again.allReduce(Buffer(v.data(), 5, DataType::kInt32), Buffer(v.data(), 5, DataType::kInt32),
                  ReduceOp::kSum);
  EXPECT_EQ(v[4], worldSize() * (worldSize() + 1) / 2);
  EXPECT_THROW(first.allReduce(Buffer(v.data(), 5, DataType::kInt32),
                               Buffer(v.data(), 5, DataType::kInt32), ReduceOp::kSum),
               AbortedError);
  // A grid axis is never made anew.
  Communicator& x = grid.communicator(1);
  EXPECT_EQ(&grid.group(x.worldRanks(), 30), &x);
}

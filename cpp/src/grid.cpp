// Grid construction: agreement check, topology discovery, one MPI_Comm_split per axis mask.
#include "fourd/grid.hpp"

#include <sched.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <sstream>
#include <vector>

#include "fourd/error.hpp"
#include "internal/comm_state.hpp"
#include "internal/compression.hpp"
#include "internal/mpi_backend.hpp"

namespace fourd {

using detail::checkMpi;
using detail::Clock;
using detail::OpContext;

namespace {

constexpr size_t kFingerprintBytes = 2048;

OpContext initContext(double timeout, const std::vector<int>* ranks) {
  OpContext ctx;
  ctx.op = "init";
  ctx.axis = "world";
  ctx.groupWorldRanks = ranks;
  ctx.timeoutSeconds = timeout;
  ctx.start = Clock::now();
  ctx.deadline = detail::deadlineAfter(ctx.start, timeout);
  return ctx;
}

// The settings that change what goes on the wire, or which algorithm runs: every rank of the
// grid must have the same (a ring segment size or a shared-memory buffer size that differs
// between ranks gives wrong results or timeouts, a different algorithm a deadlock).
constexpr const char* kAgreedEnvironment[] = {
    "FOURD_ALGORITHM",           "FOURD_TUNE",
    "FOURD_RING_SEGMENT_BYTES",  "FOURD_SHM_BUFFER_BYTES",
    "FOURD_HIERARCHICAL_CHUNKS", "FOURD_HIERARCHICAL_INTRA",
    "FOURD_HIERARCHICAL_INTER",  "FOURD_CUDA_BACKEND",
    "FOURD_COMPRESSION",         "FOURD_SHM_CMA"};

std::string describeConfig(const GridConfig& c) {
  std::ostringstream os;
  os << "x=" << c.sizes[0] << ", y=" << c.sizes[1] << ", z=" << c.sizes[2]
     << ", data=" << c.sizes[3] << ", order=" << c.order << ", ranks_per_node="
     << (c.ranksPerNode > 0 ? std::to_string(c.ranksPerNode) : std::string("None"))
     << (c.debug ? ", FOURD_DEBUG=1" : "")
     << (c.compression.empty() ? "" : ", compression=" + c.compression.substr(0, 256));
  for (const char* name : kAgreedEnvironment) {
    const char* v = std::getenv(name);
    if (v && *v) os << ", " << name << "=" << std::string(v).substr(0, 64);
  }
  return os.str();
}

// "" when a FOURD_ variable holding an integer is unset or in [lo, hi], else the message.
std::string integerEnvError(const char* name, long long lo, long long hi) {
  const char* v = std::getenv(name);
  if (!v || !*v) return "";
  char* end = nullptr;
  const long long x = std::strtoll(v, &end, 10);
  if (end && *end == '\0' && x >= lo && x <= hi) return "";
  return std::string(name) + ": expected an integer from " + std::to_string(lo) + " to " +
         std::to_string(hi) + ", found '" + v + "'";
}

// "" when FOURD_ variable `name` is unset or one of `allowed` (case-insensitive).
std::string choiceEnvError(const char* name, std::initializer_list<const char*> allowed) {
  const char* v = std::getenv(name);
  if (!v || !*v) return "";
  std::string x(v);
  for (auto& ch : x) ch = static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
  std::string list;
  for (const char* a : allowed) {
    if (x == a) return "";
    list += std::string(list.empty() ? "" : ", ") + a;
  }
  return std::string(name) + ": expected one of " + list + "; found '" + v + "'";
}

// The first FOURD_ setting of the native core that holds a value it does not take.
std::string environmentError() {
  const std::string errors[] = {
      integerEnvError("FOURD_RING_SEGMENT_BYTES", 64, 1LL << 40),
      integerEnvError("FOURD_SHM_BUFFER_BYTES", 4096, 1LL << 34),
      integerEnvError("FOURD_HIERARCHICAL_CHUNKS", 1, 64),
      choiceEnvError("FOURD_HIERARCHICAL_INTRA", {"ring", "rhd", "shm", "auto"}),
      choiceEnvError("FOURD_HIERARCHICAL_INTER", {"ring", "rhd", "shm", "auto"}),
      choiceEnvError("FOURD_TUNE", {"1", "0", "on", "off", "true", "false", "yes", "no", "inline"}),
      choiceEnvError("FOURD_CUDA_BACKEND", {"auto", "nccl", "mpi"}),
      choiceEnvError("FOURD_POLL", {"auto", "spin", "yield"}),
      choiceEnvError("FOURD_SHM_CMA", {"auto", "on", "off", "1", "0"}),
  };
  for (const auto& e : errors)
    if (!e.empty()) return e;
  if (const char* a = std::getenv("FOURD_ALGORITHM"); a && *a) {
    try {
      parseAlgorithm(a, "FOURD_ALGORITHM");
    } catch (const InvalidArgument& e) {
      return e.what();
    }
  }
  return "";
}

std::array<int, kNumAxes> validated(const GridConfig& c, int worldSize, std::string* err) {
  for (int i = 0; i < kNumAxes; ++i) {
    if (c.sizes[i] < 1) {
      *err = std::string(axisName(static_cast<Axis>(i))) + ": expected a grid size >= 1, found " +
             std::to_string(c.sizes[i]);
      return c.sizes;
    }
  }
  long long prod = 1;
  for (int s : c.sizes) prod *= s;
  if (prod != worldSize) {
    *err = "grid: expected x*y*z*data to equal the world size " + std::to_string(worldSize) +
           ", found " + std::to_string(c.sizes[0]) + "*" + std::to_string(c.sizes[1]) + "*" +
           std::to_string(c.sizes[2]) + "*" + std::to_string(c.sizes[3]) + " = " +
           std::to_string(prod);
    return c.sizes;
  }
  try {
    ProcessGrid::parseOrder(c.order);
  } catch (const InvalidArgument& e) {
    *err = e.what();
  }
  if (c.ranksPerNode < 0) {
    *err =
        "ranks_per_node: expected None or an integer >= 1, found " + std::to_string(c.ranksPerNode);
  }
  if (!(c.timeoutSeconds > 0)) {
    *err =
        "timeout: expected a positive number of seconds, found " + std::to_string(c.timeoutSeconds);
  }
  if (err->empty()) *err = environmentError();
  if (err->empty()) {
    try {
      detail::parsePolicy(c.compression, "compression");
      detail::parsePolicy(detail::effectivePolicyText(""), "FOURD_COMPRESSION");
    } catch (const InvalidArgument& e) {
      *err = e.what();
    }
  }
  return c.sizes;
}

MachineProfile defaultProfile(int ranksPerNode) {
  // Conservative figures for ranks of one shared-memory CPU node; `auto` is recalibrated by
  // fourd.calibrate() / a profile file (see docs/algorithms.md).
  MachineProfile p;
  p.name = "default-cpu";
  p.ranksPerNode = ranksPerNode;
  p.intraAlpha = 2e-6;
  p.intraBw = 5e9;
  p.interAlpha = 20e-6;
  p.nicBw = 0.5e9;
  p.nicsPerNode = 1;
  p.reduceBw = 4e9;
  p.memcpyBw = 6e9;
  return p;
}

}  // namespace

namespace {

// Every rank must ask for the same grid: compared before anything else can diverge, so a rank
// with bad or different arguments makes every rank raise instead of leaving some waiting.
void agreeOnConfig(const GridConfig& config, int worldRank, int worldSize, detail::Backend& world,
                   OpContext& ctx) {
  std::string err;
  validated(config, worldSize, &err);
  char mine[kFingerprintBytes] = {0};
  std::snprintf(mine, sizeof(mine), "%s|%s", describeConfig(config).c_str(),
                err.empty() ? "ok" : "invalid");
  std::vector<char> all(kFingerprintBytes * worldSize);
  world.allGatherBytes(mine, kFingerprintBytes, all.data(), ctx);
  if (!err.empty())
    throw InvalidArgument(err + " (on world rank " + std::to_string(worldRank) + ")");
  std::vector<int> bad;
  for (int r = 0; r < worldSize; ++r)
    if (std::strncmp(&all[r * kFingerprintBytes], mine, kFingerprintBytes) != 0) bad.push_back(r);
  if (bad.empty()) return;
  std::ostringstream os;
  os << "fourd.init: the ranks asked for different grids. This rank (world rank " << worldRank
     << ") asked for " << describeConfig(config) << "; ";
  for (size_t i = 0; i < bad.size() && i < 8; ++i) {
    std::string theirs(&all[bad[i] * kFingerprintBytes]);
    const bool invalid = theirs.size() > 8 && theirs.substr(theirs.size() - 8) == "|invalid";
    os << (i ? "; " : "") << "world rank " << bad[i] << " asked for "
       << theirs.substr(0, theirs.rfind('|')) << (invalid ? " (invalid there)" : "");
  }
  if (bad.size() > 8) os << "; ... (" << bad.size() << " ranks differ)";
  throw MismatchError(os.str());
}

// The ranks that share this rank's cores, and how many cores they have: the world ranks that
// run on the same kernel (the same boot_id; network namespaces and containers on one host
// share it, so an emulated cluster's "nodes" on one machine count together), and the union of
// their CPU affinity sets. Falls back to the MPI shared-memory domain (`nodeSize`) and this
// rank's own affinity where the kernel's identity cannot be read.
using CoreShare = Grid::CoreShare;

CoreShare measureCoreShare(int nodeSize, int worldSize, detail::Backend& world, OpContext& ctx) {
  constexpr size_t kIdBytes = 40;
  struct Entry {
    char id[kIdBytes];
    unsigned char cpus[sizeof(cpu_set_t)];
  };
  Entry mine{};
  long cores = sysconf(_SC_NPROCESSORS_ONLN);
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof(set), &set) == 0) cores = CPU_COUNT(&set);
  std::memcpy(mine.cpus, &set, sizeof(set));
  if (FILE* f = std::fopen("/proc/sys/kernel/random/boot_id", "r")) {
    if (!std::fgets(mine.id, kIdBytes, f)) mine.id[0] = '\0';
    std::fclose(f);
  }
  std::vector<Entry> all(static_cast<size_t>(worldSize));
  world.allGatherBytes(&mine, sizeof(Entry), all.data(), ctx);
  CoreShare out{nodeSize, cores};
  if (mine.id[0] == '\0') return out;
  cpu_set_t uni;
  CPU_ZERO(&uni);
  int ranks = 0;
  for (const Entry& e : all) {
    if (std::strncmp(e.id, mine.id, kIdBytes) != 0) continue;
    ++ranks;
    cpu_set_t theirs;
    std::memcpy(&theirs, e.cpus, sizeof(theirs));
    CPU_OR(&uni, &uni, &theirs);
  }
  out.ranks = std::max(ranks, nodeSize);
  if (CPU_COUNT(&uni) > 0) out.cores = CPU_COUNT(&uni);
  return out;
}

// How waits poll (FOURD_POLL, docs/errors.md): with more ranks on this machine's cores than
// cores, they spin only for their communicator's learned budget (op_context.hpp, SpinHint), or
// yield at once with FOURD_POLL=yield. Returns whether ranks count as outnumbering cores.
bool setPolling(const CoreShare& share) {
  const long cores = share.cores;
  const int ranksHere = share.ranks;
  const char* poll = std::getenv("FOURD_POLL");
  const std::string mode = poll ? poll : "auto";
  detail::setFlagWaitsLearnSpin(false);
  if (mode == "spin") {
    detail::setOversubscribed(false);
  } else if (mode == "yield") {
    detail::setOversubscribed(true, /*learnSpin=*/false);
  } else if (mode == "auto" || mode.empty()) {
    detail::setOversubscribed(cores > 0 && ranksHere > cores);
    // The flag waits spin for the budget too on up to twice as many ranks as cores
    // (schedule.cpp, waitUntil).
    detail::setFlagWaitsLearnSpin(cores > 0 && ranksHere <= 2 * cores);
  } else {
    throw InvalidArgument("FOURD_POLL: expected spin, yield or auto, found '" + mode + "'");
  }
  return detail::oversubscribed();
}

// The node of every world rank: the leader (lowest world rank) of its shared-memory domain.
std::vector<int> nodeOfRanks(int worldRank, int worldSize, detail::Backend& node,
                             detail::Backend& world, OpContext& ctx) {
  int32_t leader = worldRank;
  node.broadcast(Buffer(&leader, 1, DataType::kInt32), 0, ctx);
  std::vector<int32_t> nodeOf(worldSize);
  world.allGather(Buffer(&leader, 1, DataType::kInt32),
                  Buffer(nodeOf.data(), nodeOf.size(), DataType::kInt32), ctx);
  return std::vector<int>(nodeOf.begin(), nodeOf.end());
}

std::vector<std::string> gatherHostNames(int worldSize, detail::Backend& world, OpContext& ctx) {
  char host[MPI_MAX_PROCESSOR_NAME + 1] = {0};
  int len = 0;
  MPI_Get_processor_name(host, &len);
  std::vector<char> hosts(static_cast<size_t>(MPI_MAX_PROCESSOR_NAME + 1) * worldSize);
  world.allGatherBytes(host, MPI_MAX_PROCESSOR_NAME + 1, hosts.data(), ctx);
  std::vector<std::string> out;
  for (int r = 0; r < worldSize; ++r) out.emplace_back(&hosts[(MPI_MAX_PROCESSOR_NAME + 1) * r]);
  return out;
}

}  // namespace

Grid::Grid(MPI_Comm parent, const GridConfig& config)
    : config_(config), grid_({1, 1, 1, 1}, {Axis::kX, Axis::kY, Axis::kZ, Axis::kData}) {
  checkMpiReady();
  int worldSize = 0;
  checkMpi(MPI_Comm_size(parent, &worldSize), "MPI_Comm_size");
  checkMpi(MPI_Comm_rank(parent, &worldRank_), "MPI_Comm_rank");
  std::vector<int> identity(worldSize);
  for (int i = 0; i < worldSize; ++i) identity[i] = i;
  OpContext ctx =
      initContext(config_.timeoutSeconds > 0 ? config_.timeoutSeconds : 300.0, &identity);

  // Our own duplicate, so fourd's traffic never mixes with the user's (non-blocking, so a rank
  // that never calls init makes the others time out instead of hanging).
  MPI_Request req;
  checkMpi(MPI_Comm_idup(parent, &world_, &req), "MPI_Comm_idup");
  detail::waitMpi(&req, 1, ctx);
  auto world = detail::makeMpiBackend(world_, false, identity);
  try {
    agreeOnConfig(config_, worldRank_, worldSize, *world, ctx);
  } catch (...) {
    world.reset();
    MPI_Comm_free(&world_);
    throw;
  }
  grid_ = ProcessGrid(config_.sizes, ProcessGrid::parseOrder(config_.order));

  // The ranks that share this machine: how waits poll, and (without virtual nodes) the nodes.
  MPI_Comm nodeHandle;
  checkMpi(
      MPI_Comm_split_type(world_, MPI_COMM_TYPE_SHARED, worldRank_, MPI_INFO_NULL, &nodeHandle),
      "MPI_Comm_split_type");
  auto node = detail::makeMpiBackend(nodeHandle, true, {});
  coreShare_ = measureCoreShare(node->size(), worldSize, *world, ctx);
  coreShare_.oversubscribed = setPolling(coreShare_);
  topology_ = std::make_unique<Topology>(
      config_.ranksPerNode > 0 ? Topology::fromRanksPerNode(worldSize, config_.ranksPerNode)
                               : Topology(nodeOfRanks(worldRank_, worldSize, *node, *world, ctx)));
  hosts_ = gatherHostNames(worldSize, *world, ctx);

  // The cost-model profile: identical on every rank by construction (rank 0's).
  int maxPerNode = 1;
  for (int n = 0; n < topology_->numNodes(); ++n)
    maxPerNode = std::max(maxPerNode, topology_->ranksOnNode(n));
  profile_ = std::make_shared<MachineProfile>(defaultProfile(maxPerNode));
  profileHolder_ = std::make_unique<std::shared_ptr<const MachineProfile>>(profile_);
  makeCommunicators();
}

void Grid::checkMpiReady() {
  // Before any call that passes a handle or a constant: with another MPI's symbols in place
  // of ours, the first of those calls would crash the process.
  const std::string abi = mpiAbiMismatch();
  if (!abi.empty()) throw BackendError(abi, MPI_ERR_OTHER);
  int initialized = 0;
  MPI_Initialized(&initialized);
  if (!initialized) throw Error("fourd: MPI is not initialised (import mpi4py.MPI first)");
  int provided = 0;
  MPI_Query_thread(&provided);
  if (provided < MPI_THREAD_MULTIPLE) {
    throw Error(
        "fourd: needs MPI_THREAD_MULTIPLE (its progress threads call MPI), but MPI was "
        "initialised with thread level " +
        std::to_string(provided) +
        ". With mpi4py keep the default mpi4py.rc.thread_level = 'multiple'; in C++ call "
        "MPI_Init_thread(..., MPI_THREAD_MULTIPLE, ...).");
  }
}

// One split per axis mask; the key orders each group as the grid does.
std::unique_ptr<detail::CommState> Grid::newState(const std::string& name, AxisMask mask,
                                                  std::unique_ptr<detail::Backend> backend,
                                                  const std::vector<int>& ranks) const {
  auto group = std::make_unique<detail::Group>(name, std::move(backend), topology_->group(ranks),
                                               profileHolder_.get());
  auto state = std::make_unique<detail::CommState>(name, mask, std::move(group));
  state->defaultTimeout = config_.timeoutSeconds;
  state->debug = config_.debug;
  state->abortOnTimeout = config_.abortOnTimeout;
  if (mask != 0) {  // axis groups follow the grid's compression policy; subgroups do not
    const bool env = detail::effectivePolicyText("") != "";
    const auto policy = detail::parsePolicy(detail::effectivePolicyText(config_.compression));
    state->selector.setPolicyCodec(detail::policyCodec(policy, name),
                                   env ? "FOURD_COMPRESSION" : "policy");
  }
  return state;
}

void Grid::makeCommunicators() {
  for (AxisMask m = 1; m <= kWorldMask; ++m) {
    MPI_Comm c;
    checkMpi(
        MPI_Comm_split(world_, grid_.groupColor(worldRank_, m), grid_.groupRank(worldRank_, m), &c),
        "MPI_Comm_split");
    auto ranks = grid_.groupRanks(worldRank_, m);
    comms_[m] = std::make_unique<Communicator>(
        newState(maskName(m), m, detail::makeMpiBackend(c, true, ranks), ranks));
  }
}

namespace {

std::string listName(const std::vector<int>& ranks) {
  std::ostringstream os;
  os << "ranks[";
  for (size_t i = 0; i < ranks.size() && i < 16; ++i) os << (i ? "," : "") << ranks[i];
  if (ranks.size() > 16) os << ",... (" << ranks.size() << ")";
  os << "]";
  return os.str();
}

void checkList(const std::vector<int>& ranks, int me, int worldSize) {
  std::vector<char> seen(worldSize, 0);
  bool mine = false;
  for (int r : ranks) {
    if (r < 0 || r >= worldSize || seen[r]) {
      throw InvalidArgument("ranks: expected distinct world ranks 0.." +
                            std::to_string(worldSize - 1) + ", found " + listName(ranks));
    }
    seen[r] = 1;
    mine = mine || r == me;
  }
  if (!mine) {
    throw InvalidArgument("ranks: world rank " + std::to_string(me) + " is not in " +
                          listName(ranks) + " (only the members of a group make it)");
  }
}

// The messages of one agreement round, on the heap: a round that times out leaves requests
// behind (a member may still send, or receive, later), so its receives are cancelled, its
// sends left to complete, and this block is never freed.
struct AgreeRound {
  uint64_t digest = 0;
  uint64_t verdict = 1;
  std::vector<uint64_t> theirs;
  std::vector<MPI_Request> reqs;
  std::vector<bool> receive;  // reqs[i] is a receive

  void post(bool recv, int rc, const char* call) {
    receive.push_back(recv);
    checkMpi(rc, call);
  }
  MPI_Request* next() { return &reqs.emplace_back(MPI_REQUEST_NULL); }
};

void waitOrAbandon(std::unique_ptr<AgreeRound>& r, OpContext& ctx) {
  try {
    detail::waitMpi(r->reqs.data(), static_cast<int>(r->reqs.size()), ctx);
  } catch (...) {
    for (size_t i = 0; i < r->reqs.size(); ++i) {
      if (r->reqs[i] == MPI_REQUEST_NULL) continue;
      if (r->receive[i]) MPI_Cancel(&r->reqs[i]);
      MPI_Request_free(&r->reqs[i]);
    }
    (void)r.release();  // MPI may still write or read it
    throw;
  }
  r->reqs.clear();
  r->receive.clear();
}

// The members compare their lists before the (blocking) MPI_Comm_create_group, with the
// deadline: the lowest world rank of the list (the same member whatever the order) gathers a
// digest of every member's list, in its order, and answers each.
void agreeOnList(MPI_Comm world, const std::vector<int>& ranks, int me, int tag, OpContext& ctx) {
  auto r = std::make_unique<AgreeRound>();
  r->digest = 1469598103934665603ULL;
  for (int x : ranks) r->digest = (r->digest ^ static_cast<uint64_t>(x)) * 1099511628211ULL;
  const int leader = *std::min_element(ranks.begin(), ranks.end());
  std::vector<int> others;
  for (int x : ranks)
    if (x != leader) others.push_back(x);
  r->reqs.reserve(others.size() + 2);  // next() never moves a posted request
  if (me != leader) {
    r->post(false, MPI_Isend(&r->digest, 1, MPI_UINT64_T, leader, tag, world, r->next()),
            "MPI_Isend");
    r->post(true, MPI_Irecv(&r->verdict, 1, MPI_UINT64_T, leader, tag, world, r->next()),
            "MPI_Irecv");
  } else {
    r->theirs.assign(others.size(), 0);
    for (size_t i = 0; i < others.size(); ++i) {
      r->post(true, MPI_Irecv(&r->theirs[i], 1, MPI_UINT64_T, others[i], tag, world, r->next()),
              "MPI_Irecv");
    }
  }
  waitOrAbandon(r, ctx);
  if (me == leader) {
    for (uint64_t t : r->theirs) r->verdict = r->verdict && t == r->digest;
    for (int other : others) {
      r->post(false, MPI_Isend(&r->verdict, 1, MPI_UINT64_T, other, tag, world, r->next()),
              "MPI_Isend");
    }
    waitOrAbandon(r, ctx);
  }
  if (!r->verdict) {
    throw MismatchError("fourd: the members of " + listName(ranks) +
                        " asked for groups of different ranks (or in a different order)");
  }
}

}  // namespace

Communicator& Grid::group(const std::vector<int>& ranks, double timeoutSeconds) {
  if (finalized_) throw AbortedError("fourd: the grid was finalized; call fourd.init again");
  checkList(ranks, worldRank_, grid_.worldSize());
  // A poisoned group is made anew: every member calls again, as the first time. A member whose
  // copy is healthy (its last operation completed where another's timed out) returns it, and
  // the others' agreement below times out; their group fails too, later, and then all agree.
  auto it = groups_.find(ranks);
  if (it != groups_.end() && !it->second->poisoned()) return *it->second;
  auto ax = axisGroups_.find(ranks);
  if (ax != axisGroups_.end()) return *comms_[ax->second];
  // Tags every member derives alike from the set of ranks, above those of the operations'
  // point-to-point messages (1..30000 and their lanes): one for the agreement, another for
  // MPI_Comm_create_group. A request that timed out leaves its agreement messages behind (a
  // member's list, sent to a leader that never took it): the next agreement of these ranks
  // may take them (the same list, so the same verdict), but MPI_Comm_create_group must not,
  // and with one tag Open MPI's did (and crashed on the 8 bytes).
  std::vector<int> sorted = ranks;
  std::sort(sorted.begin(), sorted.end());
  uint64_t h = 1469598103934665603ULL;
  for (int r : sorted) h = (h ^ static_cast<uint64_t>(r)) * 1099511628211ULL;
  const int tag = 31000 + static_cast<int>(h % 500);
  const int createTag = tag + 500;
  OpContext ctx = initContext(timeoutSeconds > 0 ? timeoutSeconds : config_.timeoutSeconds, &ranks);
  ctx.op = "group";
  // Every member agrees first, even on a list that is an axis's ranks: a member that took a
  // shortcut would leave the others waiting for it (or disagreeing) until their deadline.
  agreeOnList(world_, ranks, worldRank_, tag, ctx);
  // The commit round (as detail::enterBlockingCall): a member that left the first round never
  // sends the second, so nobody blocks in MPI_Comm_create_group waiting for it.
  OpContext commit = ctx;
  commit.interruptible = false;
  commit.deadline =
      std::max(ctx.deadline, detail::deadlineAfter(Clock::now(), detail::kCommitGraceSeconds));
  agreeOnList(world_, ranks, worldRank_, tag, commit);
  for (AxisMask m = 1; m <= kWorldMask; ++m) {
    if (grid_.groupRanks(worldRank_, m) == ranks) {
      axisGroups_.emplace(ranks, m);
      return *comms_[m];
    }
  }
  MPI_Group worldGroup, sub;
  checkMpi(MPI_Comm_group(world_, &worldGroup), "MPI_Comm_group");
  checkMpi(MPI_Group_incl(worldGroup, static_cast<int>(ranks.size()), ranks.data(), &sub),
           "MPI_Group_incl");
  MPI_Comm c;
  const int rc = MPI_Comm_create_group(world_, sub, createTag, &c);
  MPI_Group_free(&sub);
  MPI_Group_free(&worldGroup);
  checkMpi(rc, "MPI_Comm_create_group");
  auto comm = std::make_unique<Communicator>(
      newState(listName(ranks), 0, detail::makeMpiBackend(c, true, ranks), ranks));
  auto& slot = groups_[ranks];
  if (slot) retired_.push_back(std::move(slot));
  slot = std::move(comm);
  return *slot;
}

// Operations waited for may still be finishing on their progress threads (a Work completes
// just before its thread goes idle): drain with the grid's deadline, as fourd.finalize() does,
// never with zero, or this rank would keep (leak) communicators whose shared-memory windows
// its peers free collectively.
Grid::~Grid() { finalize(config_.timeoutSeconds); }

Communicator& Grid::communicator(AxisMask mask) {
  if (finalized_) throw AbortedError("fourd: the grid was finalized; call fourd.init again");
  if (mask == 0 || mask > kWorldMask) {
    throw InvalidArgument("axis: expected a non-empty set of the axes x, y, z, data");
  }
  return *comms_[mask];
}

const MachineProfile& Grid::profile() const noexcept { return *profile_; }

void Grid::setProfile(const MachineProfile& p) {
  profile_ = std::make_shared<MachineProfile>(p);
  *profileHolder_ = profile_;
}

bool Grid::finalize(double timeoutSeconds) noexcept {
  if (finalized_) return true;
  finalized_ = true;
  if (detail::forkedChild()) {
    // A child of fork(): the progress threads and the MPI state belong to the parent. Touch
    // neither (joining a thread that is not there, or an MPI call, would hang): leak it all.
    for (auto& c : comms_) (void)c.release();
    for (auto& [ranks, c] : groups_) (void)c.release();
    for (auto& c : retired_) (void)c.release();
    world_ = MPI_COMM_NULL;
    return true;
  }
  bool ok = true;
  const auto deadline = detail::deadlineAfter(Clock::now(), timeoutSeconds);
  // Shared-memory windows are freed collectively within this deadline too.
  detail::setTeardownDeadline(deadline);
  auto drain = [&](std::unique_ptr<Communicator>& c) {
    if (!c) return;
    const double left =
        std::max(0.0, std::chrono::duration<double>(deadline - Clock::now()).count());
    if (!c->drain(left)) {
      ok = false;
      // An operation is still running on its progress thread: leak the communicator rather
      // than free memory that thread still uses.
      (void)c.release();
    }
  };
  for (auto& [ranks, c] : groups_) drain(c);
  for (auto& c : retired_) drain(c);
  for (auto& c : comms_) drain(c);
  int finalizedMpi = 0;
  MPI_Finalized(&finalizedMpi);
  if (ok) {
    // The communicators stay (Python may hold them); their groups go, and later calls raise.
    for (auto& [ranks, c] : groups_)
      if (c) c->close();
    for (auto& c : retired_)
      if (c) c->close();
    for (auto& c : comms_)
      if (c) c->close();
    if (!finalizedMpi && world_ != MPI_COMM_NULL) MPI_Comm_free(&world_);
  }
  detail::setTeardownDeadline(Clock::time_point::max());
  world_ = MPI_COMM_NULL;
  return ok;
}

std::string mpiLibraryVersion() {
  // Larger than any library's MPI_MAX_LIBRARY_VERSION_STRING (MPICH 8192, Open MPI 256): the
  // library that answers may not be the one whose header sized the buffer (mpiAbiMismatch).
  std::vector<char> v(std::max<size_t>(MPI_MAX_LIBRARY_VERSION_STRING, 16384), '\0');
  int len = 0;
  MPI_Get_library_version(v.data(), &len);
  len = std::max(0, std::min(len, static_cast<int>(v.size())));
  std::string s(v.data(), static_cast<size_t>(len));
  while (!s.empty() && (s.back() == '\n' || s.back() == ' ' || s.back() == '\0')) s.pop_back();
  return s;
}

std::string mpiFamily(const std::string& libraryVersion) {
  // Open MPI first: its string never names MPICH, while MPICH derivatives name themselves.
  if (libraryVersion.find("Open MPI") != std::string::npos) return "Open MPI";
  for (const char* k : {"MPICH", "Intel(R) MPI", "MVAPICH"})
    if (libraryVersion.find(k) != std::string::npos) return "MPICH";
  return "";
}

std::string mpiHeaderFamily() {
#if defined(OMPI_MAJOR_VERSION)
  return "Open MPI";
#elif defined(MPICH_VERSION) || defined(MPICH_NAME) || defined(I_MPI_VERSION)
  return "MPICH";
#else
  return "";
#endif
}

std::string mpiAbiMismatch() {
  const std::string header = mpiHeaderFamily();
  const std::string version = mpiLibraryVersion();
  const std::string running = mpiFamily(version);
  if (header.empty() || running.empty() || header == running) return "";
  std::string first = version.substr(0, version.find('\n'));
  return "fourd: it was compiled against " + header + "'s mpi.h, but its MPI calls reach " +
         running + " (\"" + first + "\"). Handles and constants differ between the two, so " +
         "any MPI call with a handle would crash. The library that answers is global in this "
         "process (loaded by the program, with RTLD_GLOBAL, or through LD_PRELOAD), so its "
         "symbols take precedence over the MPI fourd was linked to. Use one MPI for both: "
         "build fourd against the MPI that mpi4py uses (see mpi4py.get_config()), or install "
         "mpi4py against the MPI fourd was built with (README, \"Using another MPI\"; for "
         "the MPICH wheel: pip install 'fourd[mpich]' mpi4py).";
}

std::string buildInfo() {
  std::ostringstream os;
  os << "fourd " << FOURD_VERSION;
#ifdef FOURD_HAVE_CUDA
  os << ", CUDA/NCCL: compiled in";
#else
  os << ", CUDA/NCCL: not compiled in";
#endif
  return os.str();
}

}  // namespace fourd

#include "internal/mpi_comm.hpp"

#include <climits>
#include <cstring>
#include <mutex>
#include <sstream>

#include "fourd/error.hpp"
#include "internal/reduce_kernels.hpp"

namespace fourd::detail {

void checkMpi(int rc, const char* what) {
  if (rc == MPI_SUCCESS) return;
  char msg[MPI_MAX_ERROR_STRING];
  int len = 0;
  MPI_Error_string(rc, msg, &len);
  throw BackendError(std::string("fourd: ") + what + " failed with MPI error " +
                         std::to_string(rc) + ": " + std::string(msg, len),
                     rc);
}

MPI_Datatype mpiType(DataType t) {
  switch (t) {
    case DataType::kFloat32: return MPI_FLOAT;
    case DataType::kFloat64: return MPI_DOUBLE;
    case DataType::kFloat16: return MPI_UINT16_T;
    case DataType::kBFloat16: return MPI_UINT16_T;
    case DataType::kInt8: return MPI_INT8_T;
    case DataType::kUInt8: return MPI_UINT8_T;
    case DataType::kInt32: return MPI_INT32_T;
    case DataType::kInt64: return MPI_INT64_T;
  }
  throw InvalidArgument("dtype: unknown data type");
}

namespace {

// User-defined MPI operators for the 16-bit floats: inout = in (op) inout.
template <DataType T, ReduceOp Op>
void userOp16(void* in, void* inout, int* len, MPI_Datatype*) {
  reduce2(inout, in, inout, static_cast<size_t>(*len), T, Op);
}

struct Ops16 {
  MPI_Op op[2][4];  // [bf16?][sum, prod, min, max]
};

Ops16* ops16() {
  static Ops16 ops;
  static std::once_flag once;
  std::call_once(once, [] {
    MPI_User_function* fns[2][4] = {
        {userOp16<DataType::kFloat16, ReduceOp::kSum>, userOp16<DataType::kFloat16, ReduceOp::kProd>,
         userOp16<DataType::kFloat16, ReduceOp::kMin>, userOp16<DataType::kFloat16, ReduceOp::kMax>},
        {userOp16<DataType::kBFloat16, ReduceOp::kSum>,
         userOp16<DataType::kBFloat16, ReduceOp::kProd>,
         userOp16<DataType::kBFloat16, ReduceOp::kMin>,
         userOp16<DataType::kBFloat16, ReduceOp::kMax>}};
    for (int b = 0; b < 2; ++b)
      for (int o = 0; o < 4; ++o) checkMpi(MPI_Op_create(fns[b][o], 1, &ops.op[b][o]), "MPI_Op_create");
  });
  return &ops;
}

constexpr size_t kMaxPiece = size_t(1) << 30;

int checkedCount(size_t count, const char* what) {
  if (count > static_cast<size_t>(INT_MAX)) {
    throw InvalidArgument(std::string(what) + ": the MPI backend takes at most 2^31-1 elements per "
                          "call; found " + std::to_string(count));
  }
  return static_cast<int>(count);
}

// Posts a message of `bytes` as pieces of at most kMaxPiece bytes (MPI counts are int), at least
// one even when empty: post(address, piece bytes, &request) per piece; the requests and the peer
// are appended to reqs / peers.
template <class Byte, class Post>
void postInPieces(Byte* p, size_t bytes, int peer, std::vector<MPI_Request>& reqs,
                  std::vector<int>& peers, const Post& post) {
  do {
    const size_t piece = bytes < kMaxPiece ? bytes : kMaxPiece;
    MPI_Request r;
    post(p, static_cast<int>(piece), &r);
    reqs.push_back(r);
    peers.push_back(peer);
    p += piece;
    bytes -= piece;
  } while (bytes > 0);
}

}  // namespace

MPI_Op mpiOp(DataType t, ReduceOp op) {
  if (t == DataType::kFloat16 || t == DataType::kBFloat16) {
    const int b = t == DataType::kBFloat16 ? 1 : 0;
    const int o = op == ReduceOp::kAvg ? 0 : static_cast<int>(op);
    return ops16()->op[b][o];
  }
  switch (op) {
    case ReduceOp::kSum:
    case ReduceOp::kAvg: return MPI_SUM;
    case ReduceOp::kProd: return MPI_PROD;
    case ReduceOp::kMin: return MPI_MIN;
    case ReduceOp::kMax: return MPI_MAX;
  }
  throw InvalidArgument("op: unknown reduce op");
}

MpiComm::MpiComm(MPI_Comm comm, bool owned, std::vector<int> worldRanks)
    : comm_(comm), owned_(owned), worldRanks_(std::move(worldRanks)) {
  checkMpi(MPI_Comm_rank(comm_, &rank_), "MPI_Comm_rank");
  checkMpi(MPI_Comm_size(comm_, &size_), "MPI_Comm_size");
  // Errors come back as codes (turned into fourd exceptions), never abort the job.
  MPI_Comm_set_errhandler(comm_, MPI_ERRORS_RETURN);
}

MpiComm::~MpiComm() {
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (owned_ && !finalized && comm_ != MPI_COMM_NULL) MPI_Comm_free(&comm_);
}

void MpiComm::wait(MPI_Request* reqs, int n, const int* peers, OpContext& ctx) {
  if (n == 0) return;
  Backoff backoff;
  WaitWatch watch(ctx);
  while (true) {
    int done = 0;
    checkMpi(MPI_Testall(n, reqs, &done, MPI_STATUSES_IGNORE), "MPI_Testall");
    if (done) return;
    if (watch.expired()) {
      std::ostringstream os;
      os << "fourd: " << ctx.describe() << " timed out after " << ctx.elapsed()
         << " s (timeout " << ctx.timeoutSeconds << " s)";
      std::vector<int> missing;
      if (peers) {
        for (int i = 0; i < n; ++i) {
          int flag = 1;
          if (reqs[i] != MPI_REQUEST_NULL) MPI_Test(&reqs[i], &flag, MPI_STATUS_IGNORE);
          if (!flag && peers[i] >= 0) {
            const int w = worldRanks_.at(peers[i]);
            bool seen = false;
            for (int m : missing) seen = seen || m == w;
            if (!seen) missing.push_back(w);
          }
        }
      }
      if (!missing.empty()) {
        os << "; peers that never arrived: world ranks [";
        for (size_t i = 0; i < missing.size(); ++i) os << (i ? ", " : "") << missing[i];
        os << "]";
      } else {
        os << "; the ranks that did not arrive are not known (the MPI library's collective did "
              "not complete; set FOURD_DEBUG=1 to compare the calls of every rank)";
      }
      throw TimeoutError(os.str());
    }
    backoff.pause();
  }
}

void MpiComm::isend(const void* buf, size_t bytes, int dst, int tag, std::vector<MPI_Request>& reqs,
                    std::vector<int>& peers) {
  postInPieces(static_cast<const char*>(buf), bytes, dst, reqs, peers,
               [&](const char* p, int n, MPI_Request* r) {
                 checkMpi(MPI_Isend(p, n, MPI_BYTE, dst, tag, comm_, r), "MPI_Isend");
               });
}

void MpiComm::irecv(void* buf, size_t bytes, int src, int tag, std::vector<MPI_Request>& reqs,
                    std::vector<int>& peers) {
  postInPieces(static_cast<char*>(buf), bytes, src, reqs, peers,
               [&](char* p, int n, MPI_Request* r) {
                 checkMpi(MPI_Irecv(p, n, MPI_BYTE, src, tag, comm_, r), "MPI_Irecv");
               });
}

void MpiComm::sendRecv(const void* sendBuf, size_t sendBytes, int dst, void* recvBuf,
                       size_t recvBytes, int src, OpContext& ctx) {
  std::vector<MPI_Request> reqs;
  std::vector<int> peers;
  reqs.reserve(4);
  peers.reserve(4);
  if (src >= 0) irecv(recvBuf, recvBytes, src, ctx.tag, reqs, peers);
  if (dst >= 0) isend(sendBuf, sendBytes, dst, ctx.tag, reqs, peers);
  wait(reqs.data(), static_cast<int>(reqs.size()), peers.data(), ctx);
}

void MpiComm::send(const void* buf, size_t bytes, int dst, OpContext& ctx) {
  sendRecv(buf, bytes, dst, nullptr, 0, -1, ctx);
}

void MpiComm::recv(void* buf, size_t bytes, int src, OpContext& ctx) {
  sendRecv(nullptr, 0, -1, buf, bytes, src, ctx);
}

void MpiComm::allReduce(const Buffer& in, const Buffer& out, ReduceOp op, OpContext& ctx) {
  const int n = checkedCount(out.count, "count");
  MPI_Request r;
  const void* sendBuf = in.data == out.data ? MPI_IN_PLACE : in.data;
  checkMpi(MPI_Iallreduce(sendBuf, out.data, n, mpiType(out.dtype), mpiOp(out.dtype, op), comm_, &r),
           "MPI_Iallreduce");
  wait(&r, 1, nullptr, ctx);
}

void MpiComm::allGather(const Buffer& in, const Buffer& out, OpContext& ctx) {
  const int n = checkedCount(in.count, "count");
  MPI_Request r;
  const char* myBlock = static_cast<const char*>(out.data) + in.bytes() * rank_;
  const void* sendBuf = in.data == myBlock ? MPI_IN_PLACE : in.data;
  checkMpi(MPI_Iallgather(sendBuf, n, mpiType(in.dtype), out.data, n, mpiType(out.dtype), comm_, &r),
           "MPI_Iallgather");
  wait(&r, 1, nullptr, ctx);
}

void MpiComm::reduceScatter(const Buffer& in, const Buffer& out, ReduceOp op, OpContext& ctx) {
  const int n = checkedCount(out.count, "count");
  checkedCount(in.count, "count");
  MPI_Request r;
  checkMpi(MPI_Ireduce_scatter_block(in.data, out.data, n, mpiType(out.dtype), mpiOp(out.dtype, op),
                                     comm_, &r),
           "MPI_Ireduce_scatter_block");
  wait(&r, 1, nullptr, ctx);
}

void MpiComm::broadcast(const Buffer& buf, int root, OpContext& ctx) {
  const int n = checkedCount(buf.count, "count");
  MPI_Request r;
  checkMpi(MPI_Ibcast(buf.data, n, mpiType(buf.dtype), root, comm_, &r), "MPI_Ibcast");
  wait(&r, 1, nullptr, ctx);
}

void MpiComm::barrier(OpContext& ctx) {
  MPI_Request r;
  checkMpi(MPI_Ibarrier(comm_, &r), "MPI_Ibarrier");
  wait(&r, 1, nullptr, ctx);
}

void MpiComm::allGatherBytes(const void* in, size_t bytes, void* out, OpContext& ctx) {
  const int n = checkedCount(bytes, "bytes");
  MPI_Request r;
  checkMpi(MPI_Iallgather(in, n, MPI_BYTE, out, n, MPI_BYTE, comm_, &r), "MPI_Iallgather");
  wait(&r, 1, nullptr, ctx);
}

MpiComm* MpiComm::split(int color, int key, OpContext& ctx) {
  barrier(ctx);
  MPI_Comm c;
  checkMpi(MPI_Comm_split(comm_, color, key, &c), "MPI_Comm_split");
  // World ranks of the new communicator's members, in its rank order.
  int n = 0, me = 0;
  MPI_Comm_size(c, &n);
  MPI_Comm_rank(c, &me);
  std::vector<int> wr(n);
  int myWorld = worldRanks_.at(rank_);
  MPI_Request r;
  checkMpi(MPI_Iallgather(&myWorld, 1, MPI_INT, wr.data(), 1, MPI_INT, c, &r), "MPI_Iallgather");
  MpiComm* out = new MpiComm(c, true, {});
  out->worldRanks_ = {};
  try {
    out->worldRanks_.assign(n, -1);
    out->worldRanks_[me] = myWorld;
    out->wait(&r, 1, nullptr, ctx);
    out->worldRanks_ = wr;
  } catch (...) {
    delete out;
    throw;
  }
  return out;
}

}  // namespace fourd::detail

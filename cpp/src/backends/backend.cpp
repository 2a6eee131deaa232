// The blocking forms every backend shares (internal/backend.hpp): post, then wait with the
// operation's deadline.
#include "internal/backend.hpp"

namespace fourd::detail {

void Backend::allReduce(const Buffer& in, const Buffer& out, ReduceOp op, OpContext& ctx) {
  auto r = requests();
  iallReduce(in, out, op, *r);
  r->waitAll(ctx);
}

void Backend::allGather(const Buffer& in, const Buffer& out, OpContext& ctx) {
  auto r = requests();
  iallGather(in, out, *r);
  r->waitAll(ctx);
}

void Backend::reduceScatter(const Buffer& in, const Buffer& out, ReduceOp op, OpContext& ctx) {
  auto r = requests();
  ireduceScatter(in, out, op, *r);
  r->waitAll(ctx);
}

void Backend::broadcast(const Buffer& buf, int root, OpContext& ctx) {
  auto r = requests();
  ibroadcast(buf, root, *r);
  r->waitAll(ctx);
}

void Backend::barrier(OpContext& ctx) {
  auto r = requests();
  ibarrier(*r);
  r->waitAll(ctx);
}

void Backend::allGatherBytes(const void* in, size_t bytes, void* out, OpContext& ctx) {
  allGather(Buffer(const_cast<void*>(in), bytes, DataType::kUInt8),
            Buffer(out, bytes * static_cast<size_t>(size()), DataType::kUInt8), ctx);
}

}  // namespace fourd::detail

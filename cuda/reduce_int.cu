// Reduction kernels for int8, uint8, int32 and int64 (see reduce_kernels.cuh).
#include "reduce_kernels.cuh"

namespace fourd::cuda::detail {
template void launchReduce<int8_t>(const ReduceParams&, ReduceOp, cudaStream_t);
template void launchReduce<uint8_t>(const ReduceParams&, ReduceOp, cudaStream_t);
template void launchReduce<int32_t>(const ReduceParams&, ReduceOp, cudaStream_t);
template void launchReduce<int64_t>(const ReduceParams&, ReduceOp, cudaStream_t);
}  // namespace fourd::cuda::detail

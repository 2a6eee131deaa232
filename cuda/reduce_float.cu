// Reduction kernels for float32 and float64 (see reduce_kernels.cuh).
#include "reduce_kernels.cuh"

namespace fourd::cuda::detail {
template void launchReduce<float>(const ReduceParams&, ReduceOp, cudaStream_t);
template void launchReduce<double>(const ReduceParams&, ReduceOp, cudaStream_t);
}  // namespace fourd::cuda::detail

// Reduction kernels for float16 and bfloat16, accumulating in float32 (see reduce_kernels.cuh).
#include "reduce_kernels.cuh"

namespace fourd::cuda::detail {
template void launchReduce<__half>(const ReduceParams&, ReduceOp, cudaStream_t);
template void launchReduce<__nv_bfloat16>(const ReduceParams&, ReduceOp, cudaStream_t);
}  // namespace fourd::cuda::detail

// bf16 round trip: float -> __nv_bfloat16 (round to nearest even) -> float.
#include <cuda_bf16.h>
extern "C" __global__ void to_bf16(const float* __restrict__ x, __nv_bfloat16* __restrict__ y, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = __float2bfloat16(x[i]);
}
extern "C" __global__ void from_bf16(const __nv_bfloat16* __restrict__ x, float* __restrict__ y, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = __bfloat162float(x[i]);
}

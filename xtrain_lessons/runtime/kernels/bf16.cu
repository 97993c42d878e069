// bf16.cu — float32 <-> bfloat16 conversion (phase T12, mixed precision).
//
// bf16 is the top 16 bits of a float32 (sign, 8 exponent bits, 7 mantissa bits).
// __float2bfloat16 rounds to nearest, ties to even: add 0x7FFF plus the lowest kept bit, then
// drop the low 16 bits; a NaN stays a NaN. Widening back is exact: the bits shifted left by 16.
// One thread per element; the last block may be partial, hence the bounds check.
#include <cuda_bf16.h>

extern "C" __global__ void f32_to_bf16(const float* __restrict__ x, __nv_bfloat16* __restrict__ y, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) {
        y[i] = __float2bfloat16(x[i]);
    }
}

extern "C" __global__ void bf16_to_f32(const __nv_bfloat16* __restrict__ x, float* __restrict__ y, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) {
        y[i] = __bfloat162float(x[i]);
    }
}

// Row softmax, one block per row. Each thread strides over the row; the block's maximum and
// sum are reduced first within each warp with shuffles, then across warps through shared
// memory (at most 32 warps per block).
#include <cuda_bf16.h>

// NVRTC (CuPy's compiler), unlike nvcc, does not include math.h, where INFINITY lives.
#ifndef INFINITY
#define INFINITY __int_as_float(0x7f800000)
#endif

__device__ __forceinline__ float warp_max(float v) {
    for (int offset = 16; offset > 0; offset >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, offset));
    return v;
}

__device__ __forceinline__ float warp_sum(float v) {
    for (int offset = 16; offset > 0; offset >>= 1) v += __shfl_down_sync(0xffffffffu, v, offset);
    return v;
}

extern "C" __global__ void softmax_rows(const float* __restrict__ x, float* __restrict__ y, int rows, int cols) {
    __shared__ float partial[32];
    int row = blockIdx.x;
    if (row >= rows) return;
    const float* xr = x + (size_t)row * cols;
    float* yr = y + (size_t)row * cols;
    int lane = threadIdx.x % 32, warp = threadIdx.x / 32, nwarps = (blockDim.x + 31) / 32;

    float m = -INFINITY;
    for (int j = threadIdx.x; j < cols; j += blockDim.x) m = fmaxf(m, xr[j]);
    m = warp_max(m);
    if (lane == 0) partial[warp] = m;
    __syncthreads();
    m = -INFINITY;
    for (int w = 0; w < nwarps; w++) m = fmaxf(m, partial[w]);
    __syncthreads();  // everyone has read partial[] before it is reused

    float s = 0.0f;
    for (int j = threadIdx.x; j < cols; j += blockDim.x) s += __expf(xr[j] - m);
    s = warp_sum(s);  // lane 0 holds the warp's sum
    if (lane == 0) partial[warp] = s;
    __syncthreads();
    s = 0.0f;
    for (int w = 0; w < nwarps; w++) s += partial[w];

    float inv = 1.0f / s;
    for (int j = threadIdx.x; j < cols; j += blockDim.x) yr[j] = __expf(xr[j] - m) * inv;
}

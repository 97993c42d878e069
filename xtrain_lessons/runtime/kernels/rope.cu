// rope.cu — rotary position embedding for the GPU engine (phase T07b), the CUDA twin of
// runtime/host/fused_rows.cpp's rope (the rotate-half convention of Qwen/Llama).
//
// x, out (B, T, H, D) of storage type S (float, __nv_bfloat16, __half); cos, sin (T, D) float32.
// For each head at position t, the pair (x1, x2) = (x[i], x[i + D/2]), i < D/2, becomes
//   o1 = x1 * cos[t, i]       + x2 * (-sign * sin[t, i])
//   o2 = x2 * cos[t, i + D/2] + x1 * ( sign * sin[t, i + D/2])
// i.e. out = x * cos + rotate_half(x) * sin * sign with rotate_half([x1, x2]) = [-x2, x1];
// sign = -1 is the inverse rotation (the backward). Float32 arithmetic, one rounding on store.
//
// Launch shape: grid-stride loop over the B*T*H*D/2 pairs, 256 threads per block. One thread
// owns a pair: it reads both elements before writing either, so out may be x (in place).
// Consecutive threads take consecutive i of one head: coalesced loads of x, cos and sin.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

__device__ __forceinline__ float to_float(float v) { return v; }
__device__ __forceinline__ float to_float(__nv_bfloat16 v) { return __bfloat162float(v); }
__device__ __forceinline__ float to_float(__half v) { return __half2float(v); }
template <typename T> __device__ __forceinline__ T from_float(float v);
template <> __device__ __forceinline__ float from_float<float>(float v) { return v; }
template <> __device__ __forceinline__ __nv_bfloat16 from_float<__nv_bfloat16>(float v) { return __float2bfloat16(v); }
template <> __device__ __forceinline__ __half from_float<__half>(float v) { return __float2half(v); }

template <typename S>
__global__ void rope(const S* x, const float* __restrict__ cos, const float* __restrict__ sin, S* out,
                     long long n_pairs, int seq, int H, int D, float sign) {
    const int h = D / 2;
    for (long long p = (long long)blockIdx.x * blockDim.x + threadIdx.x; p < n_pairs;
         p += (long long)gridDim.x * blockDim.x) {
        const int i = (int)(p % h);
        const long long head = p / h;             // (b * T + t) * H + head index
        const int t = (int)((head / H) % seq);
        const long long base = head * D;
        const float* c = cos + (long long)t * D;
        const float* s = sin + (long long)t * D;
        float x1 = to_float(x[base + i]), x2 = to_float(x[base + i + h]);
        float o1 = x1 * c[i] + x2 * (-sign * s[i]);
        float o2 = x2 * c[i + h] + x1 * (sign * s[i + h]);
        out[base + i] = from_float<S>(o1);
        out[base + i + h] = from_float<S>(o2);
    }
}

// The instantiations the launcher uses (explicit, so a plain nvcc/NVRTC compile emits them).
template __global__ void rope<float>(const float*, const float*, const float*, float*, long long, int, int, int, float);
template __global__ void rope<__nv_bfloat16>(const __nv_bfloat16*, const float*, const float*, __nv_bfloat16*,
                                             long long, int, int, int, float);
template __global__ void rope<__half>(const __half*, const float*, const float*, __half*, long long, int, int, int,
                                      float);

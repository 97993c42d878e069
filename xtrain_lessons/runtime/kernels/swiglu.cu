// swiglu.cu — the SwiGLU gate of the MLP for the GPU engine (phase T07b), the CUDA twin of
// runtime/host/fused_rows.cpp's swiglu_fwd / swiglu_bwd.
//
//   forward:  out = silu(a) * u = a * s * u,            s = sigmoid(a)
//   backward: du = g * (a * s),  da = g * (u * (s * (1 + a * (1 - s))))
//
// All arrays have one storage type T (float, __nv_bfloat16, __half) and n elements; values are
// loaded into float, computed in float32 and rounded once on store. The sigmoid never
// overflows: with e = exp(-|a|) <= 1, s = 1 / (1 + e) for a >= 0 and e / (1 + e) for a < 0.
//
// Launch shape: grid-stride loop, 256 threads per block, any grid (the launcher caps it at a
// few thousand blocks); each element is read once and written once — memory bound, so the
// exp and the division are free.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

__device__ __forceinline__ float to_float(float v) { return v; }
__device__ __forceinline__ float to_float(__nv_bfloat16 v) { return __bfloat162float(v); }
__device__ __forceinline__ float to_float(__half v) { return __half2float(v); }
template <typename T> __device__ __forceinline__ T from_float(float v);
template <> __device__ __forceinline__ float from_float<float>(float v) { return v; }
template <> __device__ __forceinline__ __nv_bfloat16 from_float<__nv_bfloat16>(float v) { return __float2bfloat16(v); }
template <> __device__ __forceinline__ __half from_float<__half>(float v) { return __float2half(v); }

__device__ __forceinline__ float sigmoid(float a) {
    float e = expf(-fabsf(a));
    return a >= 0.0f ? 1.0f / (1.0f + e) : e / (1.0f + e);
}

template <typename T>
__global__ void swiglu_fwd(const T* __restrict__ a, const T* __restrict__ u, T* __restrict__ out, long long n) {
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (long long)gridDim.x * blockDim.x) {
        float ai = to_float(a[i]);
        out[i] = from_float<T>(ai * sigmoid(ai) * to_float(u[i]));
    }
}

template <typename T>
__global__ void swiglu_bwd(const T* __restrict__ a, const T* __restrict__ u, const T* __restrict__ g,
                           T* __restrict__ da, T* __restrict__ du, long long n) {
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (long long)gridDim.x * blockDim.x) {
        float ai = to_float(a[i]), ui = to_float(u[i]), gi = to_float(g[i]);
        float s = sigmoid(ai);
        du[i] = from_float<T>(gi * (ai * s));
        da[i] = from_float<T>(gi * (ui * (s * (1.0f + ai * (1.0f - s)))));
    }
}

// The instantiations the launchers use (explicit, so a plain nvcc/NVRTC compile emits them).
#define SWIGLU_INSTANTIATE(T)                                                                 \
    template __global__ void swiglu_fwd<T>(const T*, const T*, T*, long long);                \
    template __global__ void swiglu_bwd<T>(const T*, const T*, const T*, T*, T*, long long);
SWIGLU_INSTANTIATE(float)
SWIGLU_INSTANTIATE(__nv_bfloat16)
SWIGLU_INSTANTIATE(__half)

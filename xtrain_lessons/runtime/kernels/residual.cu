// residual.cu — the residual add of the GPU engine (phase T07b), the CUDA twin of
// runtime/host/fused_rows.cpp's add: out = a + b elementwise.
//
// One storage type T (float, __nv_bfloat16, __half) for a, b and out: both values are loaded
// into float, added once in float32 and rounded once on store — for 16-bit storage that is the
// correctly rounded 16-bit sum (float holds every such sum exactly enough). out may be a or b
// (each element is read before it is written by the same thread), so no __restrict__.
//
// Launch shape: grid-stride loop, 256 threads per block, any grid.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

__device__ __forceinline__ float to_float(float v) { return v; }
__device__ __forceinline__ float to_float(__nv_bfloat16 v) { return __bfloat162float(v); }
__device__ __forceinline__ float to_float(__half v) { return __half2float(v); }
template <typename T> __device__ __forceinline__ T from_float(float v);
template <> __device__ __forceinline__ float from_float<float>(float v) { return v; }
template <> __device__ __forceinline__ __nv_bfloat16 from_float<__nv_bfloat16>(float v) { return __float2bfloat16(v); }
template <> __device__ __forceinline__ __half from_float<__half>(float v) { return __float2half(v); }

template <typename T>
__global__ void add(const T* a, const T* b, T* out, long long n) {
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (long long)gridDim.x * blockDim.x)
        out[i] = from_float<T>(to_float(a[i]) + to_float(b[i]));
}

// The instantiations the launcher uses (explicit, so a plain nvcc/NVRTC compile emits them).
template __global__ void add<float>(const float*, const float*, float*, long long);
template __global__ void add<__nv_bfloat16>(const __nv_bfloat16*, const __nv_bfloat16*, __nv_bfloat16*, long long);
template __global__ void add<__half>(const __half*, const __half*, __half*, long long);

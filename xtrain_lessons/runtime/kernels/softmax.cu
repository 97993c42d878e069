// softmax.cu — the softmax rows of the GPU engine (phase T07b), the CUDA twins of
// runtime/host/fused_rows.cpp's causal_softmax_fwd / causal_softmax_bwd / softmax_exp_rows /
// scale_rows. T (float, __nv_bfloat16, __half) is the storage type of the rows; the row
// statistics are float32; every value is loaded into float, computed in float32 and rounded
// once on store.
//
// causal_softmax_fwd (in place): row q of the scores (n_rows, Tk) holds the query at absolute
//   position Tk - Tq + (q % Tq); it sees keys 0 .. that position, so its first
//   n = Tk - Tq + q % Tq + 1 entries. p = softmax(s * scale) over those (scale applied before
//   the max), exactly 0 after them.
// causal_softmax_bwd (in place over dp): ds = p * (dp - sum(dp * p)) * scale on the seen keys,
//   0 after.
// softmax_exp_rows (in place, the cross-entropy's first half): x (N, V) -> exp(x - rowmax);
//   s = the row sums of exp(x - rowmax), lse = rowmax + log(s).
// scale_rows (in place): x[r, :] *= f[r] (the cross-entropy's backward, after the upstream
//   gradient arrived).
//
// Launch shape: one block per row, blockDim a multiple of 32 from 32 (one warp, short rows) to
// 1024, each thread striding over the row by blockDim — any row length, up to V = 32768 and
// beyond. Row max and row sum come in ONE read (an online softmax, as in flash attention:
// each thread keeps a running max m and a sum l of exp(v - m), rescaling l when m grows); the
// (m, l) pairs are merged with warp shuffles (__shfl_xor_sync), then across warps through
// shared memory. A second read writes the outputs. Loads go through float, so T = bf16 rows
// cost half the memory traffic of float rows.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#ifndef INFINITY
#define INFINITY __int_as_float(0x7f800000)
#endif

__device__ __forceinline__ float to_float(float v) { return v; }
__device__ __forceinline__ float to_float(__nv_bfloat16 v) { return __bfloat162float(v); }
__device__ __forceinline__ float to_float(__half v) { return __half2float(v); }
template <typename T> __device__ __forceinline__ T from_float(float v);
template <> __device__ __forceinline__ float from_float<float>(float v) { return v; }
template <> __device__ __forceinline__ __nv_bfloat16 from_float<__nv_bfloat16>(float v) { return __float2bfloat16(v); }
template <> __device__ __forceinline__ __half from_float<__half>(float v) { return __float2half(v); }

// One value v into the running (m, l): l = sum of exp(values - m). A NaN makes l NaN; -inf
// adds nothing (and never forms -inf - -inf).
__device__ __forceinline__ void online_add(float& m, float& l, float v) {
    if (v > m) {
        l = l * expf(m - v) + 1.0f;
        m = v;
    } else if (v != -INFINITY) {
        l += expf(v - m);
    }
}

// Merge (m2, l2) into (m, l). An empty side (l == 0, m == -inf) adds nothing.
__device__ __forceinline__ void online_merge(float& m, float& l, float m2, float l2) {
    float mm = fmaxf(m, m2);
    float a = l == 0.0f ? 0.0f : l * expf(m - mm);
    float b = l2 == 0.0f ? 0.0f : l2 * expf(m2 - mm);
    m = mm;
    l = a + b;
}

// The block's (max, sum of exp(v - max)) in every thread (every thread must call it).
__device__ void block_max_sum(float& m, float& l) {
    __shared__ float bm[32];
    __shared__ float bl[32];
    const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
    for (int o = 16; o > 0; o >>= 1)
        online_merge(m, l, __shfl_xor_sync(0xffffffffu, m, o), __shfl_xor_sync(0xffffffffu, l, o));
    __syncthreads();
    if (lane == 0) {
        bm[warp] = m;
        bl[warp] = l;
    }
    __syncthreads();
    const bool have = lane < (int)(blockDim.x / 32);
    m = have ? bm[lane] : -INFINITY;
    l = have ? bl[lane] : 0.0f;
    for (int o = 16; o > 0; o >>= 1)
        online_merge(m, l, __shfl_xor_sync(0xffffffffu, m, o), __shfl_xor_sync(0xffffffffu, l, o));
}

__device__ float block_sum(float v) {
    __shared__ float buf[32];
    const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    __syncthreads();
    if (lane == 0) buf[warp] = v;
    __syncthreads();
    v = lane < (int)(blockDim.x / 32) ? buf[lane] : 0.0f;
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

// grid (n_rows), block (32..1024)
template <typename T>
__global__ void causal_softmax_fwd(T* s, int Tq, int Tk, float scale) {
    const long long row = blockIdx.x;
    T* x = s + row * Tk;
    const int n = Tk - Tq + (int)(row % Tq) + 1;  // the keys this query sees
    float m = -INFINITY, l = 0.0f;
    for (int j = threadIdx.x; j < n; j += blockDim.x) online_add(m, l, to_float(x[j]) * scale);
    block_max_sum(m, l);
    for (int j = threadIdx.x; j < Tk; j += blockDim.x)
        x[j] = j < n ? from_float<T>(expf(to_float(x[j]) * scale - m) / l) : from_float<T>(0.0f);
}

// grid (n_rows), block (32..1024)
template <typename T>
__global__ void causal_softmax_bwd(const T* __restrict__ p, T* __restrict__ dp, int Tq, int Tk, float scale) {
    const long long row = blockIdx.x;
    const T* pr = p + row * Tk;
    T* d = dp + row * Tk;
    const int n = Tk - Tq + (int)(row % Tq) + 1;
    float c = 0.0f;
    for (int j = threadIdx.x; j < n; j += blockDim.x) c += to_float(d[j]) * to_float(pr[j]);
    c = block_sum(c);
    for (int j = threadIdx.x; j < Tk; j += blockDim.x)
        d[j] = j < n ? from_float<T>((to_float(d[j]) - c) * to_float(pr[j]) * scale) : from_float<T>(0.0f);
}

// grid (N), block (32..1024)
template <typename T>
__global__ void softmax_exp_rows(T* x, float* __restrict__ s, float* __restrict__ lse, int V) {
    const long long row = blockIdx.x;
    T* xr = x + row * V;
    float m = -INFINITY, l = 0.0f;
    for (int j = threadIdx.x; j < V; j += blockDim.x) online_add(m, l, to_float(xr[j]));
    block_max_sum(m, l);
    for (int j = threadIdx.x; j < V; j += blockDim.x) xr[j] = from_float<T>(expf(to_float(xr[j]) - m));
    if (threadIdx.x == 0) {
        s[row] = l;
        lse[row] = m + logf(l);
    }
}

// grid (N), block (256): no reduction, one block per row so f[row] is read once per thread
template <typename T>
__global__ void scale_rows(T* x, const float* __restrict__ f, int V) {
    const long long row = blockIdx.x;
    const float fr = f[row];
    T* xr = x + row * V;
    for (int j = threadIdx.x; j < V; j += blockDim.x) xr[j] = from_float<T>(to_float(xr[j]) * fr);
}

// The instantiations the launchers use (explicit, so a plain nvcc/NVRTC compile emits them).
#define SOFTMAX_INSTANTIATE(T)                                                               \
    template __global__ void causal_softmax_fwd<T>(T*, int, int, float);                     \
    template __global__ void causal_softmax_bwd<T>(const T*, T*, int, int, float);           \
    template __global__ void softmax_exp_rows<T>(T*, float*, float*, int);                   \
    template __global__ void scale_rows<T>(T*, const float*, int);
SOFTMAX_INSTANTIATE(float)
SOFTMAX_INSTANTIATE(__nv_bfloat16)
SOFTMAX_INSTANTIATE(__half)

// cross_entropy.cu — the lm_head's cross-entropy loss for the GPU engine (phase T07b): llm.c's
// fused classifier split in two, so that the upstream gradient of the loss can arrive later
// (the backward runs after the forward of the whole step).
//
// cross_entropy_fwd (in place): logits (N, V) of storage type T (float, __nv_bfloat16, __half)
//   become e = exp(logits - rowmax); s[r] = the row sum of e, lse[r] = rowmax + log(s[r]),
//   losses[r] = lse[r] - logits[r, t_r] (the target's logit is read before the row is
//   overwritten), 0 where t_r == ignore_index, NaN where t_r lies outside [0, V) (the caller
//   checks the targets; this is the last line of defence).
// cross_entropy_bwd (in place over e): d loss / d logits = (e / s - onehot(t)) * dloss[0] * inv_count
//   for valid rows, exactly 0 for ignored rows (NaN for out-of-range targets). dloss is the
//   gradient of the MEAN loss, read from device memory (no host sync); inv_count = 1 / the
//   number of valid targets, which the host knows from the batch.
// mean_loss: out[0] = (sum of losses) * inv_count by one block — a fixed reduction order, so
//   the same bits on every run.
//
// Launch shape: one block per row for the row kernels (blockDim a multiple of 32, 32..1024,
// striding over V); the forward reads the row twice (an online max/sum, then exp and store),
// the backward once. Float32 arithmetic, one rounding on store; s, lse, losses are float32.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#ifndef INFINITY
#define INFINITY __int_as_float(0x7f800000)
#endif
#define XT_NAN __int_as_float(0x7fc00000)

__device__ __forceinline__ float to_float(float v) { return v; }
__device__ __forceinline__ float to_float(__nv_bfloat16 v) { return __bfloat162float(v); }
__device__ __forceinline__ float to_float(__half v) { return __half2float(v); }
template <typename T> __device__ __forceinline__ T from_float(float v);
template <> __device__ __forceinline__ float from_float<float>(float v) { return v; }
template <> __device__ __forceinline__ __nv_bfloat16 from_float<__nv_bfloat16>(float v) { return __float2bfloat16(v); }
template <> __device__ __forceinline__ __half from_float<__half>(float v) { return __float2half(v); }

// The online max/sum of softmax.cu: (m, l) with l = sum of exp(values - m).
__device__ __forceinline__ void online_add(float& m, float& l, float v) {
    if (v > m) {
        l = l * expf(m - v) + 1.0f;
        m = v;
    } else if (v != -INFINITY) {
        l += expf(v - m);
    }
}

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

// grid (N), block (32..1024)
template <typename T>
__global__ void cross_entropy_fwd(T* logits, const long long* __restrict__ targets, float* __restrict__ s,
                                  float* __restrict__ lse, float* __restrict__ losses, int V, long long ignore_index) {
    const long long row = blockIdx.x;
    T* x = logits + row * V;
    const long long t = targets[row];
    // read by thread 0 before the barriers of block_max_sum: no thread has written the row yet
    const float x_t = (threadIdx.x == 0 && t >= 0 && t < V) ? to_float(x[t]) : 0.0f;
    float m = -INFINITY, l = 0.0f;
    for (int j = threadIdx.x; j < V; j += blockDim.x) online_add(m, l, to_float(x[j]));
    block_max_sum(m, l);
    for (int j = threadIdx.x; j < V; j += blockDim.x) x[j] = from_float<T>(expf(to_float(x[j]) - m));
    if (threadIdx.x == 0) {
        const float lse_r = m + logf(l);
        s[row] = l;
        lse[row] = lse_r;
        losses[row] = t == ignore_index ? 0.0f : (t >= 0 && t < V ? lse_r - x_t : XT_NAN);
    }
}

// grid (N), block (32..1024). dloss: one float in device memory.
template <typename T>
__global__ void cross_entropy_bwd(T* e, const float* __restrict__ s, const long long* __restrict__ targets,
                                  const float* __restrict__ dloss, float inv_count, int V, long long ignore_index) {
    const long long row = blockIdx.x;
    T* x = e + row * V;
    const long long t = targets[row];
    if (t == ignore_index) {
        for (int j = threadIdx.x; j < V; j += blockDim.x) x[j] = from_float<T>(0.0f);
        return;
    }
    const float f = dloss[0] * inv_count;
    const float sr = (t >= 0 && t < V) ? s[row] : XT_NAN;
    for (int j = threadIdx.x; j < V; j += blockDim.x)
        x[j] = from_float<T>((to_float(x[j]) / sr - (j == t ? 1.0f : 0.0f)) * f);
}

// grid (1), block (256): out[0] = sum(losses) * inv_count
extern "C" __global__ void mean_loss(const float* __restrict__ losses, int n, float inv_count,
                                     float* __restrict__ out) {
    __shared__ float buf[32];
    float v = 0.0f;
    for (int i = threadIdx.x; i < n; i += blockDim.x) v += losses[i];
    const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    if (lane == 0) buf[warp] = v;
    __syncthreads();
    if (warp == 0) {
        v = lane < (int)(blockDim.x / 32) ? buf[lane] : 0.0f;
        for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
        if (lane == 0) out[0] = v * inv_count;
    }
}

// The instantiations the launchers use (explicit, so a plain nvcc/NVRTC compile emits them).
#define CROSS_ENTROPY_INSTANTIATE(T)                                                                           \
    template __global__ void cross_entropy_fwd<T>(T*, const long long*, float*, float*, float*, int, long long); \
    template __global__ void cross_entropy_bwd<T>(T*, const float*, const long long*, const float*, float, int,  \
                                                  long long);
CROSS_ENTROPY_INSTANTIATE(float)
CROSS_ENTROPY_INSTANTIATE(__nv_bfloat16)
CROSS_ENTROPY_INSTANTIATE(__half)

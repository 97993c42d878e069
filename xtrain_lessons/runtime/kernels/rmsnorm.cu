// rmsnorm.cu — RMSNorm forward and backward for the GPU engine (phase T07b), the CUDA twins of
// runtime/host/fused_rows.cpp's rmsnorm_fwd / rmsnorm_bwd (same names, arguments, semantics).
//
// Storage: X is the dtype of the input x (and of its gradient gx), Y the dtype of the
// normalised xhat, of out and of the upstream gradient g: float, __nv_bfloat16 or __half.
// Every value is loaded into float, all arithmetic is float32, and each output is rounded once
// when stored. r (the per-row 1/rms), the weight w, its gradient gw and the scratch are float32.
//
// Forward, per row:  r = 1 / sqrt(mean(x^2) + eps),  xhat = x * r,  out = xhat * w
// Backward, per row: gh = g * w,  gx = r * (gh - xhat * mean(gh * xhat))
//                    gw = sum over rows of g * xhat  (deterministic, no atomics: see below)
//
// Launch shape: one block per row (forward; backward without gw), blockDim a multiple of 32 from
// 32 (one warp, short rows) to 1024; each thread strides over the row by blockDim, so any D
// works. The row's sums are reduced with warp shuffles (__shfl_xor_sync), then across warps
// through 32 floats of shared memory. x is read twice (sum of squares, then normalise), g and
// xhat twice (the dot product, then gx).
//
// The weight gradient without atomics: block k of the backward takes the rows
// [k * rows_per_block, (k + 1) * rows_per_block) one after another; each thread keeps its own
// columns' running sums of g * xhat in (dynamic) shared memory, D floats (D <= 12288 in the
// default 48 KB) — no other thread touches them, so no barrier and no atomic — and writes them
// to gw_parts[k, :]. rmsnorm_gw_sum then adds the partial rows in order, one thread per column.
// The summation order depends only on N and rows_per_block, never on blockDim or on
// scheduling: the same bits on every run.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

__device__ __forceinline__ float to_float(float v) { return v; }
__device__ __forceinline__ float to_float(__nv_bfloat16 v) { return __bfloat162float(v); }
__device__ __forceinline__ float to_float(__half v) { return __half2float(v); }
template <typename T> __device__ __forceinline__ T from_float(float v);
template <> __device__ __forceinline__ float from_float<float>(float v) { return v; }
template <> __device__ __forceinline__ __nv_bfloat16 from_float<__nv_bfloat16>(float v) { return __float2bfloat16(v); }
template <> __device__ __forceinline__ __half from_float<__half>(float v) { return __float2half(v); }

__device__ __forceinline__ float warp_sum(float v) {
    for (int offset = 16; offset > 0; offset >>= 1) v += __shfl_xor_sync(0xffffffffu, v, offset);
    return v;
}

// The sum of v over the block, returned to every thread (all in the same order: the same bits).
// blockDim.x must be a multiple of 32. Every thread of the block must call it (it has barriers).
__device__ float block_sum(float v) {
    __shared__ float buf[32];  // one per block, shared by every call
    const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
    v = warp_sum(v);
    __syncthreads();  // buf may still be read from the previous call
    if (lane == 0) buf[warp] = v;
    __syncthreads();
    v = lane < (int)(blockDim.x / 32) ? buf[lane] : 0.0f;
    return warp_sum(v);
}

// grid (N), block (32..1024). has_w == 0: no weight, out is not written (the launcher passes a
// placeholder pointer for w and out).
template <typename X, typename Y>
__global__ void rmsnorm_fwd(const X* __restrict__ x, const float* __restrict__ w, Y* __restrict__ xhat,
                            Y* __restrict__ out, float* __restrict__ r, int D, float eps, int has_w) {
    const long long row = blockIdx.x;
    const X* xr = x + row * D;
    float ss = 0.0f;
    for (int i = threadIdx.x; i < D; i += blockDim.x) {
        float v = to_float(xr[i]);
        ss += v * v;
    }
    ss = block_sum(ss);
    const float rr = 1.0f / sqrtf(ss * (1.0f / (float)D) + eps);
    if (threadIdx.x == 0) r[row] = rr;
    for (int i = threadIdx.x; i < D; i += blockDim.x) {
        float h = to_float(xr[i]) * rr;
        xhat[row * D + i] = from_float<Y>(h);
        if (has_w) out[row * D + i] = from_float<Y>(h * w[i]);
    }
}

// grid (ceil(N / rows_per_block)), block (32..1024), dynamic shared memory D floats when
// want_gw. want_gx == 0: gx is a placeholder; want_gw == 0: gw_parts is a placeholder.
template <typename X, typename Y>
__global__ void rmsnorm_bwd(const Y* __restrict__ g, const Y* __restrict__ xhat, const float* __restrict__ w,
                            const float* __restrict__ r, X* __restrict__ gx, float* __restrict__ gw_parts,
                            int N, int D, int rows_per_block, int has_w, int want_gx, int want_gw) {
    extern __shared__ float acc[];  // this block's column sums of g * xhat (want_gw)
    const int row0 = blockIdx.x * rows_per_block;
    const int row1 = min(N, row0 + rows_per_block);
    if (want_gw)
        for (int i = threadIdx.x; i < D; i += blockDim.x) acc[i] = 0.0f;
    const float inv_d = 1.0f / (float)D;
    for (int row = row0; row < row1; row++) {
        const Y* gr = g + (long long)row * D;
        const Y* hr = xhat + (long long)row * D;
        float dot = 0.0f;
        // explicit roundings (__fmul_rn, __fadd_rn are never contracted into an FMA): nvcc may
        // contract a*b + c differently in the loop it specialises for each flag; this way gx has
        // the same bits with or without gw, and on the GPU as on the emulator
        for (int i = threadIdx.x; i < D; i += blockDim.x) {
            float gi = to_float(gr[i]), hi = to_float(hr[i]);
            if (want_gw) acc[i] = __fadd_rn(acc[i], __fmul_rn(gi, hi));
            float gh = has_w ? __fmul_rn(gi, w[i]) : gi;
            dot = __fadd_rn(dot, __fmul_rn(gh, hi));
        }
        if (!want_gx) continue;  // the same for every thread of the block: no divergent barrier
        dot = block_sum(dot) * inv_d;
        const float rr = r[row];
        X* o = gx + (long long)row * D;
        for (int i = threadIdx.x; i < D; i += blockDim.x) {
            float gi = to_float(gr[i]), hi = to_float(hr[i]);
            float gh = has_w ? __fmul_rn(gi, w[i]) : gi;
            o[i] = from_float<X>(__fmul_rn(__fsub_rn(gh, __fmul_rn(hi, dot)), rr));
        }
    }
    if (want_gw)
        for (int i = threadIdx.x; i < D; i += blockDim.x) gw_parts[(long long)blockIdx.x * D + i] = acc[i];
}

// gw[d] = parts[0, d] + parts[1, d] + ... in this order (one thread per column, coalesced rows).
// grid-stride over the D columns, any grid.
extern "C" __global__ void rmsnorm_gw_sum(const float* __restrict__ parts, float* __restrict__ gw, int n_parts,
                                          int D) {
    for (int d = blockIdx.x * blockDim.x + threadIdx.x; d < D; d += gridDim.x * blockDim.x) {
        float s = 0.0f;
        for (int k = 0; k < n_parts; k++) s += parts[(long long)k * D + d];
        gw[d] = s;
    }
}

// The instantiations the launchers use (name expressions "rmsnorm_fwd<float, __nv_bfloat16>", ...);
// explicit, so that a plain nvcc/NVRTC compile of this file emits them too.
#define RMSNORM_INSTANTIATE(X, Y)                                                                              \
    template __global__ void rmsnorm_fwd<X, Y>(const X*, const float*, Y*, Y*, float*, int, float, int);      \
    template __global__ void rmsnorm_bwd<X, Y>(const Y*, const Y*, const float*, const float*, X*, float*, int, \
                                               int, int, int, int, int);
RMSNORM_INSTANTIATE(float, float)
RMSNORM_INSTANTIATE(float, __nv_bfloat16)
RMSNORM_INSTANTIATE(__nv_bfloat16, __nv_bfloat16)
RMSNORM_INSTANTIATE(float, __half)
RMSNORM_INSTANTIATE(__half, __half)

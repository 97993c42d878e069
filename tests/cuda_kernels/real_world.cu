// CUDA as public teaching code writes it: cache-hint loads and stores, cooperative groups,
// template kernels, __constant__ memory, nvcc's atomics, __trap, half / bfloat16 pairs, and
// helpers named like standard-library functions. tests/test_emulator_features.py runs each
// against NumPy; test_nvrtc_compile.py compiles the file with CuPy's compiler.
#include <cooperative_groups.h>
#include <cooperative_groups/reduce.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>

namespace cg = cooperative_groups;

#ifndef INFINITY  // NVRTC has no math.h
#define INFINITY __int_as_float(0x7f800000)
#endif

// A user's own lerp and max: they must not clash with the standard library's.
__device__ float lerp(float a, float b, float t) { return a + t * (b - a); }
template <typename T> __device__ T max(T a, T b, T c) { return max(max(a, b), c); }

extern "C" __global__ void cache_hints(const float* __restrict__ x, const float4* __restrict__ x4, float* y,
                                       float4* y4, int n, int n4) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) {
        const float* p = x + i;
        float v = __ldg(p) + __ldcs(p) + __ldcg(p) + __ldca(p) + __ldlu(p) + __ldcv(p);  // 6 x
        switch (i % 4) {
            case 0: __stcs(y + i, v); break;
            case 1: __stcg(y + i, v); break;
            case 2: __stwb(y + i, v); break;
            default: __stwt(y + i, v); break;
        }
    }
    if (i < n4) {
        float4 a = __ldcs(x4 + i), b = __ldg(x4 + i);
        __stcs(y4 + i, make_float4(a.x + b.x, a.y + b.y, a.z + b.z, lerp(a.w, b.w, 0.5f)));
    }
}

// Per tile of 8 threads: the tile operations, each into its own row of `out` (9 rows of blocks*64).
extern "C" __global__ void cg_tiles(const int* __restrict__ x, int* __restrict__ out, int n) {
    cg::thread_block block = cg::this_thread_block();
    cg::thread_block_tile<8> t8 = cg::tiled_partition<8>(block);
    int i = blockIdx.x * blockDim.x + block.thread_rank();
    int v = i < n ? x[i] : -1;  // every thread takes part: a tile operation needs all its lanes
    int total = gridDim.x * blockDim.x;
    int row[9] = {t8.shfl(v, 2), t8.shfl_down(v, 1), t8.shfl_xor(v, 3), t8.shfl_up(v, 2), (int)t8.any(v > 50),
                  (int)t8.all(v > 0), (int)t8.ballot(v % 2 == 0),
                  (int)(t8.meta_group_rank() * 100 + t8.meta_group_size()), cg::reduce(t8, v, cg::plus<int>())};
    t8.sync();
    for (int k = 0; k < 9; k++) out[k * total + i] = row[k];
}

// Per warp: the sum and the maximum (cg::reduce), written by lane 0; the block synchronises
// through block.sync() and adds the warp sums in shared memory.
extern "C" __global__ void cg_warp_reduce(const float* __restrict__ x, float* __restrict__ warp_sum,
                                          float* __restrict__ warp_max, float* __restrict__ block_sum, int n) {
    __shared__ float partial[32];
    cg::thread_block block = cg::this_thread_block();
    auto warp = cg::tiled_partition<32>(block);
    int i = blockIdx.x * block.size() + block.thread_rank();
    float v = i < n ? x[i] : 0.0f;
    float s = cg::reduce(warp, v, cg::plus<float>());
    float m = cg::reduce(warp, i < n ? v : -INFINITY, cg::greater<float>());
    int w = blockIdx.x * warp.meta_group_size() + warp.meta_group_rank();
    if (warp.thread_rank() == 0) {
        warp_sum[w] = s;
        warp_max[w] = m;
        partial[warp.meta_group_rank()] = s;
    }
    block.sync();
    if (block.thread_rank() == 0) {
        float t = 0.0f;
        for (unsigned k = 0; k < warp.meta_group_size(); k++) t += partial[k];
        block_sum[blockIdx.x] = t;
    }
}

// A template kernel, launched by name expression: block_sum_t<float, 128>, block_sum_t<double, 64>.
template <typename T, int BLOCK>
__global__ void block_sum_t(const T* __restrict__ x, T* __restrict__ out, int n) {
    __shared__ T s[BLOCK];
    int i = blockIdx.x * BLOCK + threadIdx.x;
    s[threadIdx.x] = i < n ? x[i] : T(0);
    __syncthreads();
    for (int stride = BLOCK / 2; stride > 0; stride >>= 1) {
        if (threadIdx.x < stride) s[threadIdx.x] += s[threadIdx.x + stride];
        __syncthreads();
    }
    if (threadIdx.x == 0) out[blockIdx.x] = s[0];
}

// __constant__ memory set from the host (RawModule.get_global): y = p0 + p1 x + p2 x^2 + p3 x^3.
__constant__ float poly[4];
extern "C" __global__ void horner(const float* __restrict__ x, float* __restrict__ y, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = ((poly[3] * x[i] + poly[2]) * x[i] + poly[1]) * x[i] + poly[0];
}

// nvcc's atomics; counters[0] atomicInc (limit 9), [1] atomicDec (limit 9), [2] a CAS-loop count.
extern "C" __global__ void atomics_nvcc(const int* __restrict__ v, unsigned* counters, int* minmax,
                                        long long* llminmax, unsigned long long* exch, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    atomicInc(&counters[0], 9u);
    atomicDec(&counters[1], 9u);
    unsigned old = counters[2], seen;
    do { seen = old; old = atomicCAS(&counters[2], seen, seen + 1u); } while (old != seen);
    atomicMin(&minmax[0], v[i]);
    atomicMax(&minmax[1], v[i]);
    atomicMin(&llminmax[0], (long long)v[i] * 1000000000LL);
    atomicMax(&llminmax[1], (long long)v[i] * 1000000000LL);
    atomicExch(exch, (unsigned long long)(i + 1));
}

extern "C" __global__ void trap_on_negative(const int* __restrict__ x, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n && x[i] < 0) __trap();
}

// half and bfloat16, single and paired: 8 rows of n results.
extern "C" __global__ void half_ops(const float* __restrict__ a, const float* __restrict__ b, float* __restrict__ out,
                                    int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    __half ha = __float2half(a[i]), hb = __float2half_rn(b[i]);
    out[0 * n + i] = __half2float(ha + hb);
    out[1 * n + i] = __half2float(__hmul(ha, hb));
    out[2 * n + i] = __half2float(__hfma(ha, hb, ha));
    half2 h2 = __floats2half2_rn(a[i], b[i]);
    float2 f2 = __half22float2(__hadd2(h2, __hmul2(h2, h2)));
    out[3 * n + i] = f2.x;
    out[4 * n + i] = f2.y;
    __nv_bfloat162 b2 = __floats2bfloat162_rn(a[i], b[i]);
    float2 g2 = __bfloat1622float2(__hmul2(b2, __hadd2(b2, b2)));
    out[5 * n + i] = g2.x;
    out[6 * n + i] = __high2float(b2) - g2.y;
    out[7 * n + i] = __bfloat162float(__float2bfloat16(a[i]) / __float2bfloat16(b[i]));
}

// Every half bit pattern to float, and floats to half (round to nearest even).
extern "C" __global__ void half_convert(const float* __restrict__ x, unsigned short* __restrict__ to_half,
                                       const unsigned short* __restrict__ bits, float* __restrict__ to_float, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    to_half[i] = __half_as_ushort(__float2half_rn(x[i]));
    to_float[i] = __half2float(__ushort_as_half(bits[i]));
}

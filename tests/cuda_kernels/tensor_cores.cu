// tensor_cores.cu — the warp-matrix instruction mma.sync.m16n8k16 and 16-bit atomics, as a GPU
// kernel writes them (inline PTX, fragments loaded by the PTX ISA's layout). The emulator runs
// them (tests/test_emulator_features.py); NVRTC and nvcc compile them for sm_80.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

__device__ __forceinline__ unsigned short bits16(__nv_bfloat16 x) { return __bfloat16_as_ushort(x); }
__device__ __forceinline__ unsigned short bits16(__half x) { return __half_as_ushort(x); }

// two 16-bit values in one 32-bit register, the first in the low half
template <typename T> __device__ __forceinline__ unsigned pack(T lo, T hi) {
    return (unsigned)bits16(lo) | ((unsigned)bits16(hi) << 16);
}

__device__ __forceinline__ void mma_16816(float d[4], const unsigned a[4], const unsigned b[2], const float c[4],
                                          __nv_bfloat16) {
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 "
                 "{%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%10, %11, %12, %13};\n"
                 : "=f"(d[0]), "=f"(d[1]), "=f"(d[2]), "=f"(d[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]),
                   "f"(c[0]), "f"(c[1]), "f"(c[2]), "f"(c[3]));
}
__device__ __forceinline__ void mma_16816(float d[4], const unsigned a[4], const unsigned b[2], const float c[4],
                                          __half) {
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 "
                 "{%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%10, %11, %12, %13};\n"
                 : "=f"(d[0]), "=f"(d[1]), "=f"(d[2]), "=f"(d[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]),
                   "f"(c[0]), "f"(c[1]), "f"(c[2]), "f"(c[3]));
}

// One warp: D (16x8) = A (16x16, row-major, lda) B (16x8, row-major, ldb) + C (16x8 float).
template <typename T>
__device__ void tile(const T* A, int lda, const T* B, int ldb, const float* C, float* D) {
    const int lane = threadIdx.x % 32, g = lane >> 2, t = lane & 3;
    unsigned a[4], b[2];
    float c[4], d[4];
    for (int r = 0; r < 4; ++r) {  // a[r] holds A[g + 8 (r & 1)][2t + 8 (r >> 1) + {0, 1}]
        const int row = g + 8 * (r & 1), col = 2 * t + 8 * (r >> 1);
        a[r] = pack(A[row * lda + col], A[row * lda + col + 1]);
    }
    for (int r = 0; r < 2; ++r) {  // b[r] holds B[2t + 8r + {0, 1}][g]
        const int k = 2 * t + 8 * r;
        b[r] = pack(B[k * ldb + g], B[(k + 1) * ldb + g]);
    }
    for (int i = 0; i < 4; ++i) c[i] = C[(g + 8 * (i >> 1)) * 8 + 2 * t + (i & 1)];
    mma_16816(d, a, b, c, T());
    for (int i = 0; i < 4; ++i) D[(g + 8 * (i >> 1)) * 8 + 2 * t + (i & 1)] = d[i];
}

extern "C" __global__ void mma_tile_bf16(const __nv_bfloat16* A, const __nv_bfloat16* B, const float* C, float* D) {
    tile(A, 16, B, 8, C, D);
}

extern "C" __global__ void mma_tile_f16(const __half* A, const __half* B, const float* C, float* D) {
    tile(A, 16, B, 8, C, D);
}

// C (M x N) = A (M x K) B (K x N), all row-major, bf16 in and float out; M, K multiples of 16,
// N of 8. Block (32, W): warp w of block (bx, by) computes the 16x8 tile (16 (by W + w), 8 bx).
extern "C" __global__ void mma_gemm_bf16(const __nv_bfloat16* A, const __nv_bfloat16* B, float* C, int M, int N,
                                         int K) {
    const int lane = threadIdx.x, g = lane >> 2, t = lane & 3;
    const int m0 = 16 * (blockIdx.y * blockDim.y + threadIdx.y), n0 = 8 * blockIdx.x;
    if (m0 >= M) return;  // the whole warp leaves together
    float acc[4] = {0.0f, 0.0f, 0.0f, 0.0f};
    for (int k0 = 0; k0 < K; k0 += 16) {
        unsigned a[4], b[2];
        for (int r = 0; r < 4; ++r) {
            const int row = m0 + g + 8 * (r & 1), col = k0 + 2 * t + 8 * (r >> 1);
            a[r] = pack(A[row * K + col], A[row * K + col + 1]);
        }
        for (int r = 0; r < 2; ++r) {
            const int k = k0 + 2 * t + 8 * r;
            b[r] = pack(B[k * N + n0 + g], B[(k + 1) * N + n0 + g]);
        }
        mma_16816(acc, a, b, acc, __nv_bfloat16());
    }
    for (int i = 0; i < 4; ++i) C[(m0 + g + 8 * (i >> 1)) * N + n0 + 2 * t + (i & 1)] = acc[i];
}

// Mistakes the emulator names: half the warp has left before the mma; half waits elsewhere.
extern "C" __global__ void mma_after_early_exit(const __nv_bfloat16* A, const __nv_bfloat16* B, const float* C,
                                                float* D) {
    if (threadIdx.x >= 16) return;
    tile(A, 16, B, 8, C, D);
}

extern "C" __global__ void mma_divergent(const __nv_bfloat16* A, const __nv_bfloat16* B, const float* C, float* D) {
    if (threadIdx.x % 2) {
        __syncwarp();
        return;
    }
    tile(A, 16, B, 8, C, D);
}

// Every thread adds (x[i], y[i]) to pair i % npairs: atomicAdd on __nv_bfloat162 (sm_80+), and
// the same on __nv_bfloat16, __half2 and __half.
extern "C" __global__ void atomic_add_16bit(const float* x, const float* y, __nv_bfloat162* pb, __nv_bfloat16* sb,
                                            __half2* ph, __half* sh, int n, int npairs) {
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    const int p = i % npairs;
    atomicAdd(&pb[p], __floats2bfloat162_rn(x[i], y[i]));
    atomicAdd(&sb[p], __float2bfloat16(x[i]));
    atomicAdd(&ph[p], __floats2half2_rn(x[i], y[i]));
    atomicAdd(&sh[p], __float2half(y[i]));
}

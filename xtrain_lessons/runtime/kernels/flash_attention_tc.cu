// flash_attention_tc.cu — flash-attention on the tensor cores: bf16 in, float32 softmax statistics
// (phase T14's algorithm as the GPU's attention; issue 39).
//
// Layout (C-contiguous, bf16): q, o, dout, dq (B, Tq, H, D); k, v, dk, dv (B, Tk, Hkv, D);
// lse, dsum (B, H, Tq) float32. Grouped-query attention: query head h reads kv head h / (H / Hkv).
// Causal with Tk >= Tq: query row i sits at absolute position Tk - Tq + i and sees keys
// 0 .. Tk - Tq + i. `scale` multiplies q k^T (1 / sqrt(D) in attention).
//
// The products run on the tensor cores: mma.sync.m16n8k16 (bf16 x bf16 -> float32, sm_80+),
// written as inline PTX; a warp multiplies 16 rows at a time and every lane holds the pieces
// the PTX ISA assigns it (see mma() below). The float32 accumulator of S = q k^T is laid out
// like the A operand of the next product, so P goes from S to P V without leaving the
// registers (packed to bf16), as in FlashAttention-2. Memory is O(T): no T x T matrix exists,
// only tiles of K, V (or Q, dO) in shared memory, per-row statistics in registers, and lse.
//
// flash_tc_fwd<DP>      grid (ceil(Tq / 64), B * H), 128 threads: warp w owns query rows
//                       16w .. 16w + 15 of the block's tile, loops over key tiles of 64 with the
//                       online softmax (running max m, sum l, O rescaled by exp(m_old - m_new)),
//                       writes o and lse = m + log(l). Query tiles run longest first.
// flash_tc_bwd_prep     grid (ceil(B * H * Tq / 4)), 128 threads: dsum = rowsum(dO * O), one warp a row.
// flash_tc_bwd_dq<DP>   grid (ceil(Tq / BQ), B * H): a warp owns 16 query rows and loops over the
//                       key tiles: P = exp(S - lse) recomputed, dP = dO V^T, dS = P (dP - dsum),
//                       dQ += scale dS K.
// flash_tc_bwd_dkdv<DP> grid (ceil(Tk / BK), B * Hkv): a warp owns 16 keys and loops over the G
//                       query heads of its group and their query tiles: dV += P^T dO,
//                       dK += scale dS^T Q. One block owns each dK, dV row: no atomics, the same
//                       bits on every run.
// Causal: key tiles in the future of every query of a tile are never loaded; inside a tile a
// warp skips its 16 x 8 pieces that lie wholly in the future of its rows (not computed, then
// masked); only the pieces that cross the diagonal are masked element by element.
// DP is the head dim rounded up to a bucket (16, 32, 48, 64, 96, 128): columns D .. DP - 1 are zero.
// vec != 0 (the launcher checks it): D % 8 == 0 and 16-byte aligned arrays, tiles are copied
// to shared memory 8 values at a time.

#include <cuda_bf16.h>

#ifndef INFINITY
#define INFINITY __int_as_float(0x7f800000)  // NVRTC does not include math.h
#endif

#define FA_PAD 8  // bf16 padding per shared row: the fragment loads of a warp hit 32 different banks
#define FA_FULL 0xffffffffu

typedef __nv_bfloat16 bf16;

// D (4 floats, 16x8) += A (4 registers, 16x16 bf16) B (2 registers, 16x8 bf16) for one warp. With
// g = lane / 4, t = lane % 4 (PTX ISA, "Matrix Fragments for mma.m16n8k16"):
//   a[r] holds A[g + 8 (r & 1)][2t + 8 (r >> 1) + {0, 1}]   (two bf16, the first in the low half)
//   b[r] holds B[2t + 8 r + {0, 1}][g]
//   d[i] is    D[g + 8 (i >> 1)][2t + (i & 1)]
__device__ __forceinline__ void mma(float d[4], const unsigned a[4], unsigned b0, unsigned b1) {
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 "
                 "{%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

__device__ __forceinline__ unsigned pack(float lo, float hi) {  // two floats -> one register of bf16
    return (unsigned)__bfloat16_as_ushort(__float2bfloat16(lo)) |
           ((unsigned)__bfloat16_as_ushort(__float2bfloat16(hi)) << 16);
}

__device__ __forceinline__ unsigned bits(bf16 x) { return __bfloat16_as_ushort(x); }

// row[col], row[col + 1] of a global row (zero past D, or everywhere for row == nullptr)
__device__ __forceinline__ unsigned global_pair(const bf16* row, int col, int D) {
    unsigned lo = 0, hi = 0;
    if (row != nullptr && col < D) lo = bits(row[col]);
    if (row != nullptr && col + 1 < D) hi = bits(row[col + 1]);
    return lo | (hi << 16);
}

// Two adjacent values of a shared row (one 32-bit load), and two values one row apart.
template <class Tile> __device__ __forceinline__ unsigned shared_pair(Tile& s, int r, int c) {
    return *reinterpret_cast<const unsigned*>(&s[r][c]);
}
template <class Tile> __device__ __forceinline__ unsigned shared_column_pair(Tile& s, int r, int c) {
    return bits(s[r][c]) | (bits(s[r + 1][c]) << 16);
}

// Rows row0 .. row0 + ROWS - 1 of one head into s[ROWS][DP + FA_PAD], zeros past T and past D.
// base points at (b, 0, head, 0); rows are `stride` values apart. All threads of the block take part.
template <int ROWS, int DP, class Tile>
__device__ void load_tile(Tile& s, const bf16* base, long stride, int row0, int T, int D, int vec) {
    if (vec) {  // 16 bytes at a time: D % 8 == 0, so a chunk is wholly inside or outside D
        constexpr int C = DP / 8;
        for (int e = threadIdx.x; e < ROWS * C; e += blockDim.x) {
            const int r = e / C, c = (e % C) * 8;
            uint4 x = make_uint4(0u, 0u, 0u, 0u);
            if (row0 + r < T && c < D) x = *reinterpret_cast<const uint4*>(base + (long)(row0 + r) * stride + c);
            *reinterpret_cast<uint4*>(&s[r][c]) = x;
        }
    } else {
        for (int e = threadIdx.x; e < ROWS * DP; e += blockDim.x) {
            const int r = e / DP, c = e % DP;
            s[r][c] = (row0 + r < T && c < D) ? base[(long)(row0 + r) * stride + c] : __float2bfloat16(0.0f);
        }
    }
}

// The A fragments (kd = 0 .. DP/16 - 1) of 16 rows of a global head, rows row0 .. row0 + 15
// (zero rows past T): what a warp keeps in registers for its own queries.
template <int DP>
__device__ void global_a_fragments(unsigned a[][4], const bf16* base, long stride, int row0, int T, int D) {
    const int lane = threadIdx.x % 32, g = lane >> 2, t = lane & 3;
    const bf16* top = row0 + g < T ? base + (long)(row0 + g) * stride : nullptr;
    const bf16* bottom = row0 + g + 8 < T ? base + (long)(row0 + g + 8) * stride : nullptr;
#pragma unroll
    for (int kd = 0; kd < DP / 16; ++kd) {
        a[kd][0] = global_pair(top, kd * 16 + 2 * t, D);
        a[kd][1] = global_pair(bottom, kd * 16 + 2 * t, D);
        a[kd][2] = global_pair(top, kd * 16 + 2 * t + 8, D);
        a[kd][3] = global_pair(bottom, kd * 16 + 2 * t + 8, D);
    }
}

// The same from a shared tile, rows r0 .. r0 + 15.
template <int DP, class Tile> __device__ __forceinline__ void shared_a_fragment(unsigned a[4], Tile& s, int r0, int kd) {
    const int lane = threadIdx.x % 32, g = lane >> 2, t = lane & 3, c = kd * 16 + 2 * t;
    a[0] = shared_pair(s, r0 + g, c);
    a[1] = shared_pair(s, r0 + g + 8, c);
    a[2] = shared_pair(s, r0 + g, c + 8);
    a[3] = shared_pair(s, r0 + g + 8, c + 8);
}

// acc[nb] (16 x 8 pieces, nb = 0 .. N/8 - 1) = A (16 x DP, fragments a) times the transpose of
// rows 0 .. N - 1 of a shared tile (N x DP): S = Q K^T, dP = dO V^T and their transposes.
// Only the pieces lo <= nb < hi are computed (the others are masked for every row: left at zero).
template <int DP, int N, class Tile>
__device__ __forceinline__ void times_rows_t(float acc[][4], const unsigned a[][4], Tile& s, int lo, int hi) {
    const int lane = threadIdx.x % 32, g = lane >> 2, t = lane & 3;
#pragma unroll
    for (int nb = 0; nb < N / 8; ++nb) {
        acc[nb][0] = acc[nb][1] = acc[nb][2] = acc[nb][3] = 0.0f;
        if (nb < lo || nb >= hi) continue;
#pragma unroll
        for (int kd = 0; kd < DP / 16; ++kd)  // B[k = d][n = row] = s[row][d]: pairs along d
            mma(acc[nb], a[kd], shared_pair(s, nb * 8 + g, kd * 16 + 2 * t), shared_pair(s, nb * 8 + g, kd * 16 + 2 * t + 8));
    }
}

// acc[nd] += P (16 x N, as float accumulators p[nb]) times rows 0 .. N - 1 of a shared tile
// (N x DP): O += P V, dV += P^T dO, dK += dS^T Q, dQ += dS K. The accumulator layout of two
// neighbouring 16 x 8 pieces is the A layout of one 16 x 16 piece: P is packed in place.
// Only the k-steps lo16 <= kk < hi16 are computed (P is zero in the others).
template <int DP, int N, class Tile>
__device__ __forceinline__ void p_times_rows(float acc[][4], const float p[][4], Tile& s, int lo16, int hi16) {
    const int lane = threadIdx.x % 32, g = lane >> 2, t = lane & 3;
#pragma unroll
    for (int kk = 0; kk < N / 16; ++kk) {
        if (kk < lo16 || kk >= hi16) continue;
        const unsigned a[4] = {pack(p[2 * kk][0], p[2 * kk][1]), pack(p[2 * kk][2], p[2 * kk][3]),
                               pack(p[2 * kk + 1][0], p[2 * kk + 1][1]), pack(p[2 * kk + 1][2], p[2 * kk + 1][3])};
#pragma unroll
        for (int nd = 0; nd < DP / 8; ++nd)  // B[k = row][n = d] = s[row][d]: pairs down a column
            mma(acc[nd], a, shared_column_pair(s, kk * 16 + 2 * t, nd * 8 + g),
                shared_column_pair(s, kk * 16 + 2 * t + 8, nd * 8 + g));
    }
}

// Reduce over the 4 lanes that hold one row (a quad: lanes 4g .. 4g + 3).
__device__ __forceinline__ float quad_max(float x) {
    x = fmaxf(x, __shfl_xor_sync(FA_FULL, x, 1));
    return fmaxf(x, __shfl_xor_sync(FA_FULL, x, 2));
}
__device__ __forceinline__ float quad_sum(float x) {
    x += __shfl_xor_sync(FA_FULL, x, 1);
    return x + __shfl_xor_sync(FA_FULL, x, 2);
}

// Store a warp's 16 x DP float accumulators (rows row0 .. row0 + 15) as bf16, times f[r] for the
// rows g (r = 0) and g + 8 (r = 1); rows past T and columns past D are not written.
template <int DP>
__device__ void store_rows(bf16* base, long stride, int row0, int T, int D, const float acc[][4], const float f[2]) {
    const int lane = threadIdx.x % 32, g = lane >> 2, t = lane & 3;
#pragma unroll
    for (int r = 0; r < 2; ++r) {
        const int row = row0 + g + 8 * r;
        if (row >= T) continue;
        bf16* out = base + (long)row * stride;
#pragma unroll
        for (int nd = 0; nd < DP / 8; ++nd) {
            const int c = nd * 8 + 2 * t;
            if (c < D) out[c] = __float2bfloat16(acc[nd][2 * r] * f[r]);
            if (c + 1 < D) out[c + 1] = __float2bfloat16(acc[nd][2 * r + 1] * f[r]);
        }
    }
}

// ------------------------------------------------------------------------------------- forward
template <int DP>
__global__ void __launch_bounds__(128) flash_tc_fwd(const bf16* __restrict__ q, const bf16* __restrict__ k,
                                                    const bf16* __restrict__ v, bf16* __restrict__ o,
                                                    float* __restrict__ lse, int B, int Tq, int Tk, int H, int Hkv,
                                                    int D, float scale, int causal, int vec) {
    constexpr int BQ = 64, BK = 64;
    __shared__ __align__(16) bf16 Ks[BK][DP + FA_PAD];
    __shared__ __align__(16) bf16 Vs[BK][DP + FA_PAD];
    const int tile = gridDim.x - 1 - blockIdx.x;  // the tiles with the most keys first
    const int b = blockIdx.y / H, h = blockIdx.y % H, hk = h / (H / Hkv);
    const int lane = threadIdx.x % 32, g = lane >> 2, t = lane & 3;
    const int q0 = tile * BQ + (threadIdx.x / 32) * 16;  // the warp's first query row
    const int offset = Tk - Tq;
    const long qstride = (long)H * D, kstride = (long)Hkv * D;
    const bf16* kb = k + (long)b * Tk * kstride + (long)hk * D;
    const bf16* vb = v + (long)b * Tk * kstride + (long)hk * D;

    unsigned qa[DP / 16][4];  // the warp's 16 query rows, as A fragments
    global_a_fragments<DP>(qa, q + (long)b * Tq * qstride + (long)h * D, qstride, q0, Tq, D);
    float acc[DP / 8][4];
#pragma unroll
    for (int nd = 0; nd < DP / 8; ++nd) acc[nd][0] = acc[nd][1] = acc[nd][2] = acc[nd][3] = 0.0f;
    float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f};  // rows g and g + 8

    const int last = min(tile * BQ + BQ, Tq) - 1;  // keys past this query's are masked for the tile
    const int kv_end = causal ? min(Tk, offset + last + 1) : Tk;
    const int warp_last = min(q0 + 15, Tq - 1);
    for (int j0 = 0; j0 < kv_end; j0 += BK) {
        __syncthreads();  // every warp is done with the previous tile
        load_tile<BK, DP>(Ks, kb, kstride, j0, Tk, D, vec);
        load_tile<BK, DP>(Vs, vb, kstride, j0, Tk, D, vec);
        __syncthreads();
        if (q0 >= Tq || (causal && j0 > offset + warp_last)) continue;  // no rows, or all of them masked
        // 8-key pieces wholly in the future of the warp's rows are skipped
        const int live = causal ? min(BK / 8, (offset + warp_last - j0) / 8 + 1) : BK / 8;
        float s[BK / 8][4];
        times_rows_t<DP, BK>(s, qa, Ks, 0, live);  // S = Q K^T
        float mx[2] = {m[0], m[1]};
#pragma unroll
        for (int nb = 0; nb < BK / 8; ++nb)
#pragma unroll
            for (int i = 0; i < 4; ++i) {
                const int row = q0 + g + 8 * (i >> 1), col = j0 + nb * 8 + 2 * t + (i & 1);
                const bool seen = col < Tk && (!causal || col <= offset + row);
                s[nb][i] = seen ? s[nb][i] * scale : -INFINITY;
                mx[i >> 1] = fmaxf(mx[i >> 1], s[nb][i]);
            }
        float alpha[2], sum[2] = {0.0f, 0.0f};
#pragma unroll
        for (int r = 0; r < 2; ++r) {
            mx[r] = quad_max(mx[r]);  // finite: key 0 is in the first tile and every row sees it
            alpha[r] = expf(m[r] - mx[r]);  // rescales what was summed under the old max
            m[r] = mx[r];
        }
#pragma unroll
        for (int nb = 0; nb < BK / 8; ++nb)
#pragma unroll
            for (int i = 0; i < 4; ++i) {
                s[nb][i] = expf(s[nb][i] - m[i >> 1]);  // P (unnormalised); 0 where masked
                sum[i >> 1] += s[nb][i];
            }
#pragma unroll
        for (int r = 0; r < 2; ++r) l[r] = alpha[r] * l[r] + quad_sum(sum[r]);
#pragma unroll
        for (int nd = 0; nd < DP / 8; ++nd)
#pragma unroll
            for (int i = 0; i < 4; ++i) acc[nd][i] *= alpha[i >> 1];
        p_times_rows<DP, BK>(acc, s, Vs, 0, (live + 1) / 2);  // O += P V
    }
    if (q0 >= Tq) return;
    const float inv_l[2] = {1.0f / l[0], 1.0f / l[1]};
    store_rows<DP>(o + (long)b * Tq * qstride + (long)h * D, qstride, q0, Tq, D, acc, inv_l);
    for (int r = 0; r < 2; ++r)
        if (t == 0 && q0 + g + 8 * r < Tq) lse[((long)b * H + h) * Tq + q0 + g + 8 * r] = m[r] + logf(l[r]);
}

// ------------------------------------------------------------------------------------ backward
// dsum[b, h, i] = sum_d dout[b, i, h, d] * o[b, i, h, d] (= rowsum(dP * P)), one warp per row.
extern "C" __global__ void flash_tc_bwd_prep(const bf16* __restrict__ o, const bf16* __restrict__ dout,
                                             float* __restrict__ dsum, int B, int Tq, int H, int D) {
    const long row = (long)blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32;  // (b, h, i) order
    if (row >= (long)B * H * Tq) return;  // the whole warp leaves together
    const long b = row / ((long)H * Tq), h = (row / Tq) % H, i = row % Tq;
    const long base = ((b * Tq + i) * H + h) * D;
    float acc = 0.0f;
    for (int d = threadIdx.x % 32; d < D; d += 32) acc += __bfloat162float(o[base + d]) * __bfloat162float(dout[base + d]);
    for (int off = 16; off > 0; off /= 2) acc += __shfl_xor_sync(FA_FULL, acc, off);
    if (threadIdx.x % 32 == 0) dsum[row] = acc;
}

// dq: a warp owns 16 query rows; key tiles of BK.
template <int DP>
__global__ void __launch_bounds__(128) flash_tc_bwd_dq(const bf16* __restrict__ q, const bf16* __restrict__ k,
                                                       const bf16* __restrict__ v, const float* __restrict__ lse,
                                                       const float* __restrict__ dsum, const bf16* __restrict__ dout,
                                                       bf16* __restrict__ dq, int B, int Tq, int Tk, int H, int Hkv,
                                                       int D, float scale, int causal, int vec) {
    constexpr int BQ = 64, BK = DP > 64 ? 32 : 64;
    __shared__ __align__(16) bf16 Ks[BK][DP + FA_PAD];
    __shared__ __align__(16) bf16 Vs[BK][DP + FA_PAD];
    const int tile = gridDim.x - 1 - blockIdx.x;
    const int b = blockIdx.y / H, h = blockIdx.y % H, hk = h / (H / Hkv);
    const int lane = threadIdx.x % 32, g = lane >> 2, t = lane & 3;
    const int q0 = tile * BQ + (threadIdx.x / 32) * 16;
    const int offset = Tk - Tq;
    const long qstride = (long)H * D, kstride = (long)Hkv * D;
    const bf16* kb = k + (long)b * Tk * kstride + (long)hk * D;
    const bf16* vb = v + (long)b * Tk * kstride + (long)hk * D;
    const long qoff = (long)b * Tq * qstride + (long)h * D;

    unsigned qa[DP / 16][4], da[DP / 16][4];  // the warp's rows of q and dout
    global_a_fragments<DP>(qa, q + qoff, qstride, q0, Tq, D);
    global_a_fragments<DP>(da, dout + qoff, qstride, q0, Tq, D);
    float L[2], Dr[2];  // lse and dsum of rows g, g + 8
    for (int r = 0; r < 2; ++r) {
        const int row = q0 + g + 8 * r;
        L[r] = row < Tq ? lse[((long)b * H + h) * Tq + row] : 0.0f;
        Dr[r] = row < Tq ? dsum[((long)b * H + h) * Tq + row] : 0.0f;
    }
    float acc[DP / 8][4];
#pragma unroll
    for (int nd = 0; nd < DP / 8; ++nd) acc[nd][0] = acc[nd][1] = acc[nd][2] = acc[nd][3] = 0.0f;

    const int last = min(tile * BQ + BQ, Tq) - 1;
    const int kv_end = causal ? min(Tk, offset + last + 1) : Tk;
    const int warp_last = min(q0 + 15, Tq - 1);
    for (int j0 = 0; j0 < kv_end; j0 += BK) {
        __syncthreads();
        load_tile<BK, DP>(Ks, kb, kstride, j0, Tk, D, vec);
        load_tile<BK, DP>(Vs, vb, kstride, j0, Tk, D, vec);
        __syncthreads();
        if (q0 >= Tq || (causal && j0 > offset + warp_last)) continue;
        const int live = causal ? min(BK / 8, (offset + warp_last - j0) / 8 + 1) : BK / 8;
        float p[BK / 8][4], ds[BK / 8][4];
        times_rows_t<DP, BK>(p, qa, Ks, 0, live);   // S = Q K^T
        times_rows_t<DP, BK>(ds, da, Vs, 0, live);  // dP = dO V^T
#pragma unroll
        for (int nb = 0; nb < BK / 8; ++nb)
#pragma unroll
            for (int i = 0; i < 4; ++i) {
                const int row = q0 + g + 8 * (i >> 1), col = j0 + nb * 8 + 2 * t + (i & 1);
                const bool seen = col < Tk && (!causal || col <= offset + row);
                p[nb][i] = seen ? expf(p[nb][i] * scale - L[i >> 1]) : 0.0f;  // P, from the saved lse
                ds[nb][i] = p[nb][i] * (ds[nb][i] - Dr[i >> 1]) * scale;    // dS, scaled for dQ
            }
        p_times_rows<DP, BK>(acc, ds, Ks, 0, (live + 1) / 2);  // dQ += dS K
    }
    if (q0 >= Tq) return;
    const float one[2] = {1.0f, 1.0f};
    store_rows<DP>(dq + qoff, qstride, q0, Tq, D, acc, one);
}

// dk, dv: a warp owns 16 keys; the block loops over the G query heads of its kv head and their
// query tiles of BQ (the ones that see its keys).
template <int DP>
__global__ void __launch_bounds__(128) flash_tc_bwd_dkdv(const bf16* __restrict__ q, const bf16* __restrict__ k,
                                                         const bf16* __restrict__ v, const float* __restrict__ lse,
                                                         const float* __restrict__ dsum,
                                                         const bf16* __restrict__ dout, bf16* __restrict__ dk,
                                                         bf16* __restrict__ dv, int B, int Tq, int Tk, int H,
                                                         int Hkv, int D, float scale, int causal, int vec) {
    constexpr int BK = DP > 64 ? 32 : 64, BQ = DP > 64 ? 32 : 64;
    __shared__ __align__(16) bf16 Ks[BK][DP + FA_PAD];
    __shared__ __align__(16) bf16 Vs[BK][DP + FA_PAD];
    __shared__ __align__(16) bf16 Qs[BQ][DP + FA_PAD];
    __shared__ __align__(16) bf16 Os[BQ][DP + FA_PAD];  // dout rows
    __shared__ float Ls[BQ];
    __shared__ float Ds[BQ];
    const int b = blockIdx.y / Hkv, hk = blockIdx.y % Hkv, G = H / Hkv;
    const int lane = threadIdx.x % 32, g = lane >> 2, t = lane & 3;
    const int warp = threadIdx.x / 32, j0 = blockIdx.x * BK, k0 = j0 + warp * 16;  // the warp's first key
    const int offset = Tk - Tq;
    const long qstride = (long)H * D, kstride = (long)Hkv * D;
    const long koff = (long)b * Tk * kstride + (long)hk * D;
    load_tile<BK, DP>(Ks, k + koff, kstride, j0, Tk, D, vec);
    load_tile<BK, DP>(Vs, v + koff, kstride, j0, Tk, D, vec);

    float dka[DP / 8][4], dva[DP / 8][4];
#pragma unroll
    for (int nd = 0; nd < DP / 8; ++nd)
        for (int i = 0; i < 4; ++i) dka[nd][i] = dva[nd][i] = 0.0f;
    const int first = causal ? max(0, j0 - offset) : 0;  // the first query that sees key j0
    for (int gi = 0; gi < G; ++gi) {
        const int h = hk * G + gi;
        const long qoff = (long)b * Tq * qstride + (long)h * D;
        for (int i0 = first / BQ * BQ; i0 < Tq; i0 += BQ) {
            __syncthreads();  // the previous tiles are consumed
            load_tile<BQ, DP>(Qs, q + qoff, qstride, i0, Tq, D, vec);
            load_tile<BQ, DP>(Os, dout + qoff, qstride, i0, Tq, D, vec);
            for (int r = threadIdx.x; r < BQ; r += blockDim.x) {
                const bool in = i0 + r < Tq;
                Ls[r] = in ? lse[((long)b * H + h) * Tq + i0 + r] : 0.0f;
                Ds[r] = in ? dsum[((long)b * H + h) * Tq + i0 + r] : 0.0f;
            }
            __syncthreads();
            const int q_last = min(i0 + BQ, Tq) - 1;
            if (k0 >= Tk || (causal && k0 > offset + q_last)) continue;  // no keys, or all in the future
            // 8-query pieces wholly before the warp's first key (they cannot see it) are skipped
            const int dead = causal ? max(0, min(BQ / 8, (k0 - offset - i0) / 8)) : 0;
            float p[BQ / 8][4], ds[BQ / 8][4];
            unsigned a[DP / 16][4];
#pragma unroll
            for (int kd = 0; kd < DP / 16; ++kd) shared_a_fragment<DP>(a[kd], Ks, warp * 16, kd);
            times_rows_t<DP, BQ>(p, a, Qs, dead, BQ / 8);  // S^T = K Q^T (16 keys x BQ queries)
#pragma unroll
            for (int kd = 0; kd < DP / 16; ++kd) shared_a_fragment<DP>(a[kd], Vs, warp * 16, kd);
            times_rows_t<DP, BQ>(ds, a, Os, dead, BQ / 8);  // dP^T = V dO^T
#pragma unroll
            for (int nb = 0; nb < BQ / 8; ++nb)
#pragma unroll
                for (int i = 0; i < 4; ++i) {
                    const int key = k0 + g + 8 * (i >> 1), c = nb * 8 + 2 * t + (i & 1), query = i0 + c;
                    const bool seen = nb >= dead && query < Tq && key < Tk && (!causal || key <= offset + query);
                    p[nb][i] = seen ? expf(p[nb][i] * scale - Ls[c]) : 0.0f;
                    ds[nb][i] = p[nb][i] * (ds[nb][i] - Ds[c]) * scale;
                }
            p_times_rows<DP, BQ>(dva, p, Os, dead / 2, BQ / 16);   // dV += P^T dO
            p_times_rows<DP, BQ>(dka, ds, Qs, dead / 2, BQ / 16);  // dK += dS^T Q
        }
    }
    if (k0 >= Tk) return;
    const float one[2] = {1.0f, 1.0f};
    store_rows<DP>(dk + koff, kstride, k0, Tk, D, dka, one);
    store_rows<DP>(dv + koff, kstride, k0, Tk, D, dva, one);
}

// Every head-dim bucket the launcher picks (flash_attention_tc.py: the smallest DP >= D), for nvcc.
// NVRTC (CuPy) and the CPU emulator instantiate only the bucket a launcher asks for by name
// expression: one bucket compiles in a few seconds, all six take a minute.
#if defined(__CUDACC__) && !defined(__CUDACC_RTC__)
#define FA_INSTANTIATE(DP)                                                                                       \
    template __global__ void flash_tc_fwd<DP>(const bf16*, const bf16*, const bf16*, bf16*, float*, int, int, int, \
                                              int, int, int, float, int, int);                                \
    template __global__ void flash_tc_bwd_dq<DP>(const bf16*, const bf16*, const bf16*, const float*,         \
                                                 const float*, const bf16*, bf16*, int, int, int, int, int, int, \
                                                 float, int, int);                                            \
    template __global__ void flash_tc_bwd_dkdv<DP>(const bf16*, const bf16*, const bf16*, const float*,       \
                                                   const float*, const bf16*, bf16*, bf16*, int, int, int, int, \
                                                   int, int, float, int, int);
FA_INSTANTIATE(16)
FA_INSTANTIATE(32)
FA_INSTANTIATE(48)
FA_INSTANTIATE(64)
FA_INSTANTIATE(96)
FA_INSTANTIATE(128)
#undef FA_INSTANTIATE
#endif

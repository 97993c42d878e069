// flash_attention.cu — flash-attention forward and backward in float32 (phase T14).
//
// Layout (all C-contiguous): q, o, dq (B, Tq, H, D); k, v, dk, dv (B, Tk, Hkv, D);
// lse (B, H, Tq). Grouped-query attention: query head h reads kv head h / (H / Hkv).
// Causal with Tk >= Tq: query row i sits at absolute position Tk - Tq + i and sees keys
// 0 .. Tk - Tq + i. scale = 1 / sqrt(D).
//
// flash_attention_fwd        grid (B*H, ceil(Tq / BQ)), block BQ threads: one thread per query
//                            row; key/value tiles of BK rows staged in shared memory; online
//                            softmax per row; writes o and lse. shared_mem = 2 * BK * D floats.
// flash_attention_bwd_dq     grid (B*H, ceil(Tq / BQ)), block BQ: one thread per query row,
//                            recomputes P = exp(S - lse) tile by tile, accumulates dq.
//                            shared_mem = 2 * BK * D floats.
// flash_attention_bwd_dkdv   grid (B*Hkv, ceil(Tk / BK)), block BK: one thread per key row,
//                            loops over the G query heads of its group and over query tiles
//                            (staged in shared memory), accumulates dk, dv. No atomics: each
//                            dk/dv row has exactly one writer, so the result is deterministic.
//                            shared_mem = (2 * BQ * D + 2 * BQ) floats.
// Block sizes are runtime values up to FA_MAX_BLOCK; D up to FA_MAX_D. Threads with no row
// (past the end) still load tiles and reach every barrier.

// NVRTC (CuPy's compiler), unlike nvcc, does not include math.h, where INFINITY lives.
#ifndef INFINITY
#define INFINITY __int_as_float(0x7f800000)
#endif

#define FA_MAX_D 128
#define FA_MAX_BLOCK 64

extern "C" __global__ void flash_attention_fwd(const float* __restrict__ q, const float* __restrict__ k,
                                               const float* __restrict__ v, float* __restrict__ o,
                                               float* __restrict__ lse, int B, int Tq, int Tk, int H,
                                               int Hkv, int D, int BQ, int BK, int causal) {
    extern __shared__ float smem[];
    float* Ks = smem;           // [BK][D]
    float* Vs = smem + BK * D;  // [BK][D]
    const int bh = blockIdx.x, b = bh / H, h = bh % H, hk = h / (H / Hkv);
    const int i0 = blockIdx.y * BQ, row = i0 + threadIdx.x;
    const bool active = row < Tq;
    const int offset = Tk - Tq;  // absolute position of query row 0
    const float scale = rsqrtf((float)D);

    float qr[FA_MAX_D], acc[FA_MAX_D], s[FA_MAX_BLOCK];
    float m = -INFINITY, l = 0.0f;
    for (int d = 0; d < D; ++d) {
        qr[d] = active ? q[(((long)b * Tq + row) * H + h) * D + d] : 0.0f;
        acc[d] = 0.0f;
    }
    // keys past the last query of this tile are masked for every row: do not load them
    const int last_q = min(i0 + BQ, Tq) - 1;
    const int kv_end = causal ? min(Tk, offset + last_q + 1) : Tk;
    for (int j0 = 0; j0 < kv_end; j0 += BK) {
        const int n = min(BK, Tk - j0);
        for (int e = threadIdx.x; e < n * D; e += blockDim.x) {  // cooperative tile load
            const int r = e / D, d = e % D;
            const long src = (((long)b * Tk + j0 + r) * Hkv + hk) * D + d;
            Ks[r * D + d] = k[src];
            Vs[r * D + d] = v[src];
        }
        __syncthreads();
        if (active) {
            float tile_max = -INFINITY;
            for (int j = 0; j < n; ++j) {
                float dot = 0.0f;
                for (int d = 0; d < D; ++d) dot += qr[d] * Ks[j * D + d];
                dot *= scale;
                if (causal && j0 + j > offset + row) dot = -INFINITY;
                s[j] = dot;
                tile_max = fmaxf(tile_max, dot);
            }
            const float m_new = fmaxf(m, tile_max);  // finite: key 0 is visible to every row
            const float alpha = expf(m - m_new);     // rescales the old sum and accumulator
            l *= alpha;
            for (int d = 0; d < D; ++d) acc[d] *= alpha;
            for (int j = 0; j < n; ++j) {
                const float p = expf(s[j] - m_new);
                l += p;
                for (int d = 0; d < D; ++d) acc[d] += p * Vs[j * D + d];
            }
            m = m_new;
        }
        __syncthreads();  // the tile is consumed before the next load overwrites it
    }
    if (active) {
        const float inv_l = 1.0f / l;
        for (int d = 0; d < D; ++d) o[(((long)b * Tq + row) * H + h) * D + d] = acc[d] * inv_l;
        lse[((long)b * H + h) * Tq + row] = m + logf(l);
    }
}

extern "C" __global__ void flash_attention_bwd_dq(const float* __restrict__ q, const float* __restrict__ k,
                                                  const float* __restrict__ v, const float* __restrict__ o,
                                                  const float* __restrict__ lse, const float* __restrict__ dout,
                                                  float* __restrict__ dq, int B, int Tq, int Tk, int H,
                                                  int Hkv, int D, int BQ, int BK, int causal) {
    extern __shared__ float smem[];
    float* Ks = smem;           // [BK][D]
    float* Vs = smem + BK * D;  // [BK][D]
    const int bh = blockIdx.x, b = bh / H, h = bh % H, hk = h / (H / Hkv);
    const int i0 = blockIdx.y * BQ, row = i0 + threadIdx.x;
    const bool active = row < Tq;
    const int offset = Tk - Tq;
    const float scale = rsqrtf((float)D);

    float qr[FA_MAX_D], dor[FA_MAX_D], acc[FA_MAX_D];
    float L = 0.0f, Dr = 0.0f;  // the row's logsumexp and rowsum(dO * O)
    const long qbase = (((long)b * Tq + row) * H + h) * D;
    for (int d = 0; d < D; ++d) {
        qr[d] = active ? q[qbase + d] : 0.0f;
        dor[d] = active ? dout[qbase + d] : 0.0f;
        Dr += active ? dor[d] * o[qbase + d] : 0.0f;
        acc[d] = 0.0f;
    }
    if (active) L = lse[((long)b * H + h) * Tq + row];
    const int last_q = min(i0 + BQ, Tq) - 1;
    const int kv_end = causal ? min(Tk, offset + last_q + 1) : Tk;
    for (int j0 = 0; j0 < kv_end; j0 += BK) {
        const int n = min(BK, Tk - j0);
        for (int e = threadIdx.x; e < n * D; e += blockDim.x) {
            const int r = e / D, d = e % D;
            const long src = (((long)b * Tk + j0 + r) * Hkv + hk) * D + d;
            Ks[r * D + d] = k[src];
            Vs[r * D + d] = v[src];
        }
        __syncthreads();
        if (active) {
            for (int j = 0; j < n; ++j) {
                if (causal && j0 + j > offset + row) break;  // the rest of the tile is masked too
                float sdot = 0.0f, dp = 0.0f;
                for (int d = 0; d < D; ++d) {
                    sdot += qr[d] * Ks[j * D + d];
                    dp += dor[d] * Vs[j * D + d];
                }
                const float p = expf(sdot * scale - L);  // P recomputed from the saved lse
                const float ds = p * (dp - Dr) * scale;
                for (int d = 0; d < D; ++d) acc[d] += ds * Ks[j * D + d];
            }
        }
        __syncthreads();
    }
    if (active)
        for (int d = 0; d < D; ++d) dq[qbase + d] = acc[d];
}

extern "C" __global__ void flash_attention_bwd_dkdv(const float* __restrict__ q, const float* __restrict__ k,
                                                    const float* __restrict__ v, const float* __restrict__ o,
                                                    const float* __restrict__ lse, const float* __restrict__ dout,
                                                    float* __restrict__ dk, float* __restrict__ dv, int B, int Tq,
                                                    int Tk, int H, int Hkv, int D, int BQ, int BK, int causal) {
    extern __shared__ float smem[];
    float* Qs = smem;                // [BQ][D]
    float* dOs = smem + BQ * D;      // [BQ][D]
    float* Ls = smem + 2 * BQ * D;   // [BQ]
    float* Ds = Ls + BQ;             // [BQ]  rowsum(dO * O) of the tile's rows
    const int bk = blockIdx.x, b = bk / Hkv, hk = bk % Hkv, G = H / Hkv;
    const int j0 = blockIdx.y * BK, col = j0 + threadIdx.x;
    const bool active = col < Tk;
    const int offset = Tk - Tq;
    const float scale = rsqrtf((float)D);

    float kr[FA_MAX_D], vr[FA_MAX_D], dka[FA_MAX_D], dva[FA_MAX_D];
    const long kbase = (((long)b * Tk + col) * Hkv + hk) * D;
    for (int d = 0; d < D; ++d) {
        kr[d] = active ? k[kbase + d] : 0.0f;
        vr[d] = active ? v[kbase + d] : 0.0f;
        dka[d] = 0.0f;
        dva[d] = 0.0f;
    }
    // causal: the first query row that sees key j0 is j0 - offset; earlier tiles are skipped
    const int first = causal ? max(0, j0 - offset) : 0;
    for (int g = 0; g < G; ++g) {
        const int h = hk * G + g;
        for (int i0 = (first / BQ) * BQ; i0 < Tq; i0 += BQ) {
            const int n = min(BQ, Tq - i0);
            for (int e = threadIdx.x; e < n * D; e += blockDim.x) {
                const int r = e / D, d = e % D;
                const long src = (((long)b * Tq + i0 + r) * H + h) * D + d;
                Qs[r * D + d] = q[src];
                dOs[r * D + d] = dout[src];
            }
            for (int r = threadIdx.x; r < n; r += blockDim.x) {
                const long base = (((long)b * Tq + i0 + r) * H + h) * D;
                float acc = 0.0f;
                for (int d = 0; d < D; ++d) acc += dout[base + d] * o[base + d];
                Ds[r] = acc;
                Ls[r] = lse[((long)b * H + h) * Tq + i0 + r];
            }
            __syncthreads();
            if (active) {
                for (int i = 0; i < n; ++i) {
                    if (causal && col > offset + i0 + i) continue;  // key in this query's future
                    float sdot = 0.0f, dp = 0.0f;
                    for (int d = 0; d < D; ++d) {
                        sdot += Qs[i * D + d] * kr[d];
                        dp += dOs[i * D + d] * vr[d];
                    }
                    const float p = expf(sdot * scale - Ls[i]);
                    const float ds = p * (dp - Ds[i]) * scale;
                    for (int d = 0; d < D; ++d) {
                        dva[d] += p * dOs[i * D + d];
                        dka[d] += ds * Qs[i * D + d];
                    }
                }
            }
            __syncthreads();
        }
    }
    if (active)
        for (int d = 0; d < D; ++d) {
            dk[kbase + d] = dka[d];
            dv[kbase + d] = dva[d];
        }
}

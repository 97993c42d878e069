// Fused row kernels for the CPU (phase T07): what torch.compile generates for the elementwise
// chains of a transformer step, written by hand. One pass over each row, in registers and L1,
// where NumPy makes one pass over the whole array per operation.
//
// Compiled by runtime/host/fused_rows.py with g++ -O3 -march=native -ffp-contract=off: the
// loops vectorise (AVX2 / AVX-512), and no multiply-add is fused, so every result is a fixed
// sequence of IEEE float operations. Sums over a row use 16 partial sums added in a fixed
// order, so they vectorise without reassociation and give the same bits on any row range:
// the same bits for any thread count (each thread gets a run of whole rows).
//
// Every function takes base pointers and a row range [lo, hi): Python passes addresses,
// not slices. NumPy references of each function: fused_rows.py.
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <thread>
#include <vector>

#define EXPORT extern "C" __attribute__((visibility("default")))
typedef long long i64;

// ------------------------------------------------------------------ the worker pool
// Each exported kernel takes the cuts of its rows, [cuts[i], cuts[i+1]) for part i, one part
// per thread (runs of whole grid blocks, chosen in Python: cpu_threads.runs). The caller runs
// part 0; part i > 0 goes to worker i, which waits for its next part spinning for 200
// microseconds (the next kernel of a step comes that soon), then asleep. A hand-over costs
// about a microsecond, where waking a Python thread costs tens (T07 measures both). Each
// worker has its own doorbell: a job of 2 parts wakes worker 1 only, so workers made for a
// larger thread count earlier in the process sleep instead of spinning on the cores the job needs.
namespace pool {
typedef void (*Body)(const void* ctx, i64 lo, i64 hi);
struct Job { Body body; const void* ctx; const i64* cuts; int parts; };
struct alignas(64) Doorbell { std::atomic<unsigned> rings{0}; };  // one cache line each

static const int MAX_WORKERS = 255;
static Job job;
static Doorbell doorbell[MAX_WORKERS + 1];  // doorbell[i]: worker i's jobs
static std::atomic<int> pending{0};         // workers still on the current job
static std::atomic<bool> busy{false};       // a job in flight: a second caller runs inline
static int n_workers = 0;
static pid_t owner = 0;  // a forked child has none of the parent's threads: it starts its own
static std::atomic<long> spin_us{200};

static inline void relax() {
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#endif
}

// wait until `a` no longer holds `old`: spinning for spin_us, then asleep (a futex)
template <class T> static T await_change(std::atomic<T>& a, T old) {
    auto until = std::chrono::steady_clock::now() + std::chrono::microseconds(spin_us.load(std::memory_order_relaxed));
    for (;;) {
        T now = a.load(std::memory_order_acquire);
        if (now != old) return now;
        if (std::chrono::steady_clock::now() < until) {
            relax();
        } else {
            a.wait(old, std::memory_order_acquire);
        }
    }
}

static void worker(int index, unsigned seen) {
    for (;;) {
        seen = await_change(doorbell[index].rings, seen);
        job.body(job.ctx, job.cuts[index], job.cuts[index + 1]);
        if (pending.fetch_sub(1, std::memory_order_acq_rel) == 1) pending.notify_one();
    }
}

static void run(Body body, const void* ctx, const i64* cuts, int parts) {
    if (parts <= 1 || busy.exchange(true, std::memory_order_acquire)) {  // one part, or nested
        for (int i = 0; i < parts; i++) body(ctx, cuts[i], cuts[i + 1]);
        return;
    }
    if (owner != getpid()) { owner = getpid(); n_workers = 0; }
    int helpers = std::min(parts - 1, MAX_WORKERS);
    while (n_workers < helpers) {
        n_workers++;
        new std::thread(worker, n_workers, doorbell[n_workers].rings.load());  // lives with the process
    }
    job = Job{body, ctx, cuts, parts};
    pending.store(helpers, std::memory_order_relaxed);
    for (int i = 1; i <= helpers; i++) {
        doorbell[i].rings.fetch_add(1, std::memory_order_release);
        doorbell[i].rings.notify_one();
    }
    body(ctx, cuts[0], cuts[1]);
    for (int i = helpers + 1; i < parts; i++) body(ctx, cuts[i], cuts[i + 1]);  // more parts than workers
    for (int left = pending.load(std::memory_order_acquire); left != 0;) left = await_change(pending, left);
    busy.store(false, std::memory_order_release);
}
}  // namespace pool

EXPORT void set_spin(long us) { pool::spin_us.store(us); }

template <class F> static void par(const i64* cuts, int parts, const F& f) {
    pool::run([](const void* c, i64 lo, i64 hi) { (*(const F*)c)(lo, hi); }, &f, cuts, parts);
}

static const int LANES = 16;

// sum of a[i] * b[i], in 16 lanes then the lanes in order
static inline float dot(const float* __restrict__ a, const float* __restrict__ b, int n) {
    float acc[LANES] = {0};
    int i = 0;
    for (; i + LANES <= n; i += LANES)
        for (int j = 0; j < LANES; j++) acc[j] += a[i + j] * b[i + j];
    for (int j = 0; i + j < n; j++) acc[j] += a[i + j] * b[i + j];
    float s = 0.0f;
    for (int j = 0; j < LANES; j++) s += acc[j];
    return s;
}

// sum of a[i], in 16 lanes then the lanes in order
static inline float row_sum(const float* __restrict__ a, int n) {
    float acc[LANES] = {0};
    int i = 0;
    for (; i + LANES <= n; i += LANES)
        for (int j = 0; j < LANES; j++) acc[j] += a[i + j];
    for (int j = 0; i + j < n; j++) acc[j] += a[i + j];
    float s = 0.0f;
    for (int j = 0; j < LANES; j++) s += acc[j];
    return s;
}

// max of a[i] (-inf for n = 0); NaNs are skipped, as the exp of the row brings them back
static inline float row_max(const float* __restrict__ a, int n) {
    float acc[LANES];
    for (int j = 0; j < LANES; j++) acc[j] = -INFINITY;
    int i = 0;
    for (; i + LANES <= n; i += LANES)
        for (int j = 0; j < LANES; j++) acc[j] = a[i + j] > acc[j] ? a[i + j] : acc[j];
    for (int j = 0; i + j < n; j++) acc[j] = a[i + j] > acc[j] ? a[i + j] : acc[j];
    float m = -INFINITY;
    for (int j = 0; j < LANES; j++) m = acc[j] > m ? acc[j] : m;
    return m;
}

static inline float bits_to_float(int32_t bits) {
    float f;
    std::memcpy(&f, &bits, sizeof f);
    return f;
}

// exp(x) as vector hardware computes it: x = n ln2 + r with |r| <= ln2/2, exp(r) by a
// degree-6 polynomial (Cephes expf's coefficients, error < 2 ulp), times 2^n built from bits.
// Branch-free, so the loops calling it vectorise. exp(-inf) = 0, exp(+inf) = inf, NaN stays.
static inline float xt_exp(float x) {
    const float hi = 88.72283935546875f, lo = -87.33654475f;
    float xc = x > hi ? hi : x;
    xc = xc < lo ? lo : xc;
    float fn = std::floor(xc * 1.44269504088896341f + 0.5f);
    float r = xc - fn * 0.693359375f;  // ln2 in two parts: this product is exact
    r = r - fn * -2.12194440e-4f;
    float p = 1.9875691500e-4f;
    p = p * r + 1.3981999507e-3f;
    p = p * r + 8.3334519073e-3f;
    p = p * r + 4.1665795894e-2f;
    p = p * r + 1.6666665459e-1f;
    p = p * r + 5.0000001201e-1f;
    p = p * (r * r) + r + 1.0f;
    int32_t n = (int32_t)fn, n1 = n / 2;  // 2^n as two factors: n = 128 and n = -126 stay normal
    float y = p * bits_to_float((n1 + 127) << 23) * bits_to_float((n - n1 + 127) << 23);
    y = x > hi ? INFINITY : y;
    return x < lo ? 0.0f : y;
}

EXPORT void exp_rows(const float* x, float* y, i64 n) {  // for the tests: y = exp(x)
    for (i64 i = 0; i < n; i++) y[i] = xt_exp(x[i]);
}

static inline float sigmoid(float a) { return 1.0f / (1.0f + xt_exp(-a)); }

// ------------------------------------------------------------------ RMSNorm
// xhat = x * r, out = xhat * w (w may be null: out is not written), r = 1 / sqrt(mean(x^2) + eps)
static void rmsnorm_fwd_rows(const float* x, const float* w, float* xhat, float* out, float* r,
                        i64 lo, i64 hi, int D, float eps) {
    const float inv_d = 1.0f / (float)D;
    for (i64 row = lo; row < hi; row++) {
        const float* xr = x + row * D;
        float rr = 1.0f / std::sqrt(dot(xr, xr, D) * inv_d + eps);
        r[row] = rr;
        float* xh = xhat + row * D;
        for (int i = 0; i < D; i++) xh[i] = xr[i] * rr;
        if (w) {
            float* o = out + row * D;
            for (int i = 0; i < D; i++) o[i] = xh[i] * w[i];
        }
    }
}

// gx = r * (gh - xhat * mean(gh * xhat)), gh = g * w (gx may be null);
// gw_parts[k] += g * xhat over the rows of block k (blocks of block_rows rows from row 0;
// null: no weight gradient). [lo, hi) starts on a block, so no block has two writers.
static void rmsnorm_bwd_rows(const float* g, const float* xhat, const float* w, const float* r,
                        float* gx, float* gw_parts, i64 lo, i64 hi, int D, i64 block_rows) {
    const float inv_d = 1.0f / (float)D;
    float* tmp = new float[D];  // gh = g * w of one row
    for (i64 row = lo; row < hi; row++) {
        const float* gr = g + row * D;
        const float* xh = xhat + row * D;
        if (gw_parts) {
            float* part = gw_parts + (row / block_rows) * D;
            for (int i = 0; i < D; i++) part[i] += gr[i] * xh[i];
        }
        if (!gx) continue;
        const float* ghr = gr;
        if (w) {
            for (int i = 0; i < D; i++) tmp[i] = gr[i] * w[i];
            ghr = tmp;
        }
        float d = dot(ghr, xh, D) * inv_d;
        float rr = r[row];
        float* o = gx + row * D;
        for (int i = 0; i < D; i++) o[i] = (ghr[i] - xh[i] * d) * rr;
    }
    delete[] tmp;
}

// ------------------------------------------------------------------ sum (elements [lo, hi))
// out = a + b: one IEEE addition per element, the bits of NumPy's; out may be a or b
static void add_rows(const float* a, const float* b, float* out, i64 lo, i64 hi) {
    for (i64 i = lo; i < hi; i++) out[i] = a[i] + b[i];
}

// ------------------------------------------------------------------ SwiGLU (elements [lo, hi))
static void swiglu_fwd_rows(const float* a, const float* u, float* out, i64 lo, i64 hi) {
    for (i64 i = lo; i < hi; i++) out[i] = a[i] * sigmoid(a[i]) * u[i];
}

// du = g * silu(a), da = g * u * s * (1 + a * (1 - s)), s = sigmoid(a)
static void swiglu_bwd_rows(const float* a, const float* u, const float* g, float* da, float* du,
                       i64 lo, i64 hi) {
    for (i64 i = lo; i < hi; i++) {
        float s = sigmoid(a[i]);
        du[i] = g[i] * (a[i] * s);
        da[i] = g[i] * (u[i] * (s * (1.0f + a[i] * (1.0f - s))));
    }
}

// ------------------------------------------------------------------ RoPE (sequences [lo, hi))
// x, out (B, T, H, D); cos, sin (T, D). Pair (i, i + D/2) of each head at position t:
// o1 = x1 c - x2 s, o2 = x2 c + x1 s (sign = -1: the inverse rotation, the backward)
// o[i] = a[i] c[i] + b[i] (sign s[i]): one half of a head (two loops that vectorise, where one
// loop writing both halves through pointers that may alias does not)
static inline void rope_half(const float* __restrict__ a, const float* __restrict__ b, const float* __restrict__ c,
                             const float* __restrict__ s, float* __restrict__ o, int h, float sign) {
    for (int i = 0; i < h; i++) o[i] = a[i] * c[i] + b[i] * (sign * s[i]);
}

static void rope_rows(const float* x, const float* cos, const float* sin, float* out,
                 i64 lo, i64 hi, int T, int H, int D, float sign) {
    const int h = D / 2;
    for (i64 b = lo; b < hi; b++)
        for (int t = 0; t < T; t++) {
            const float* c = cos + (i64)t * D;
            const float* s = sin + (i64)t * D;
            for (int head = 0; head < H; head++) {
                i64 base = ((b * T + t) * H + head) * D;
                rope_half(x + base, x + base + h, c, s, out + base, h, -sign);
                rope_half(x + base + h, x + base, c + h, s + h, out + base + h, h, sign);
            }
        }
}

// ------------------------------------------------------------------ causal softmax
// Rows of scores (n_rows, Tk); row q's query sits at absolute position Tk - Tq + (q % Tq) and
// sees keys 0 .. that position. In place: p = softmax(s * scale) over the keys it sees, 0 after.
static void causal_softmax_fwd_rows(float* s, i64 lo, i64 hi, int Tq, int Tk, float scale) {
    for (i64 row = lo; row < hi; row++) {
        float* x = s + row * Tk;
        int n = Tk - Tq + (int)(row % Tq) + 1;
        for (int j = 0; j < n; j++) x[j] *= scale;
        float m = row_max(x, n);
        for (int j = 0; j < n; j++) x[j] = xt_exp(x[j] - m);
        float sum = row_sum(x, n);
        for (int j = 0; j < n; j++) x[j] /= sum;
        for (int j = n; j < Tk; j++) x[j] = 0.0f;
    }
}

// In place over dp: ds = p * (dp - sum(dp * p)) * scale on the keys a row sees, 0 after.
static void causal_softmax_bwd_rows(const float* p, float* dp, i64 lo, i64 hi, int Tq, int Tk, float scale) {
    for (i64 row = lo; row < hi; row++) {
        const float* pr = p + row * Tk;
        float* d = dp + row * Tk;
        int n = Tk - Tq + (int)(row % Tq) + 1;
        float c = dot(d, pr, n);
        for (int j = 0; j < n; j++) d[j] = (d[j] - c) * pr[j] * scale;
        for (int j = n; j < Tk; j++) d[j] = 0.0f;
    }
}

// ------------------------------------------------------------------ cross-entropy rows
// In place: x (n_rows, V) becomes exp(x - max); s = its row sums, lse = max + log(s).
static void softmax_exp_rows_rows(float* x, float* s, float* lse, i64 lo, i64 hi, int V) {
    for (i64 row = lo; row < hi; row++) {
        float* xr = x + row * V;
        float m = row_max(xr, V);
        for (int j = 0; j < V; j++) xr[j] = xt_exp(xr[j] - m);
        float sum = row_sum(xr, V);
        s[row] = sum;
        lse[row] = m + std::log(sum);
    }
}

// ------------------------------------------------------------------ AdamW (one array of n)
// training/optim.py's _adamw_update in one pass, operation for operation (the constants come
// from Python already rounded to float32, as NumPy rounds them): the same bits as NumPy.
static void adamw(float* p, const float* g, float* m, float* v, i64 n, float decay, int decays,
                  float one_minus_b1, float b2, float one_minus_b2, float bc2_sqrt, float eps, float step) {
    for (i64 i = 0; i < n; i++) {
        float pi = decays ? p[i] * decay : p[i];
        float mi = m[i] + one_minus_b1 * (g[i] - m[i]);
        float vi = v[i] * b2;
        vi = vi + one_minus_b2 * (g[i] * g[i]);
        float d = std::sqrt(vi) / bc2_sqrt + eps;
        p[i] = pi + step * (mi / d);
        m[i] = mi;
        v[i] = vi;
    }
}


// ------------------------------------------------------------------ the exported kernels
// Each runs its rows (elements, for SwiGLU) on the pool: part i gets [cuts[i], cuts[i+1]).
EXPORT void rmsnorm_fwd(const float* x, const float* w, float* xhat, float* out, float* r, int D, float eps,
                        const i64* cuts, int parts) {
    par(cuts, parts, [&](i64 lo, i64 hi) { rmsnorm_fwd_rows(x, w, xhat, out, r, lo, hi, D, eps); });
}

EXPORT void rmsnorm_bwd(const float* g, const float* xhat, const float* w, const float* r, float* gx,
                        float* gw_parts, int D, i64 block_rows, const i64* cuts, int parts) {
    par(cuts, parts, [&](i64 lo, i64 hi) { rmsnorm_bwd_rows(g, xhat, w, r, gx, gw_parts, lo, hi, D, block_rows); });
}

EXPORT void add(const float* a, const float* b, float* out, const i64* cuts, int parts) {
    par(cuts, parts, [&](i64 lo, i64 hi) { add_rows(a, b, out, lo, hi); });
}

EXPORT void swiglu_fwd(const float* a, const float* u, float* out, const i64* cuts, int parts) {
    par(cuts, parts, [&](i64 lo, i64 hi) { swiglu_fwd_rows(a, u, out, lo, hi); });
}

EXPORT void swiglu_bwd(const float* a, const float* u, const float* g, float* da, float* du, const i64* cuts,
                       int parts) {
    par(cuts, parts, [&](i64 lo, i64 hi) { swiglu_bwd_rows(a, u, g, da, du, lo, hi); });
}

EXPORT void rope(const float* x, const float* cos, const float* sin, float* out, int T, int H, int D, float sign,
                 const i64* cuts, int parts) {
    par(cuts, parts, [&](i64 lo, i64 hi) { rope_rows(x, cos, sin, out, lo, hi, T, H, D, sign); });
}

EXPORT void causal_softmax_fwd(float* s, int Tq, int Tk, float scale, const i64* cuts, int parts) {
    par(cuts, parts, [&](i64 lo, i64 hi) { causal_softmax_fwd_rows(s, lo, hi, Tq, Tk, scale); });
}

EXPORT void causal_softmax_bwd(const float* p, float* dp, int Tq, int Tk, float scale, const i64* cuts, int parts) {
    par(cuts, parts, [&](i64 lo, i64 hi) { causal_softmax_bwd_rows(p, dp, lo, hi, Tq, Tk, scale); });
}

EXPORT void softmax_exp_rows(float* x, float* s, float* lse, int V, const i64* cuts, int parts) {
    par(cuts, parts, [&](i64 lo, i64 hi) { softmax_exp_rows_rows(x, s, lse, lo, hi, V); });
}

// ------------------------------------------------------------------ causal attention, by blocks
// runtime/opset/attention.py's algorithm with no Python between the matmuls: one task per
// (sequence, kv head), every product a CBLAS sgemm on the arrays' own layout (leading
// dimensions H*D and Hkv*D: no copies), the causal softmax of each query block in between.
// The sgemm is the one runtime/blas.py chose (MKL's or NumPy's OpenBLAS's), set from Python.
typedef void (*sgemm32_t)(int, int, int, int, int, int, float, const float*, int, const float*, int, float,
                          float*, int);
typedef void (*sgemm64_t)(int, int, int, i64, i64, i64, float, const float*, i64, const float*, i64, float,
                          float*, i64);
typedef int (*set_threads_t)(int);
static void* g_sgemm = nullptr;
static int g_sgemm_int64 = 0;
static set_threads_t g_set_local_threads = nullptr;  // MKL: this thread's count, for one call

EXPORT void set_sgemm(void* fn, int int64, void* set_local_threads) {
    g_sgemm = fn;
    g_sgemm_int64 = int64;
    g_set_local_threads = (set_threads_t)set_local_threads;
}

// C = A·B (+ beta·C), A (M, K) or its transpose, row-major with the given leading dimensions
static void sgemm(bool ta, bool tb, i64 M, i64 N, i64 K, const float* A, i64 lda, const float* B, i64 ldb,
                  float beta, float* C, i64 ldc) {
    const int row_major = 101, TA = ta ? 112 : 111, TB = tb ? 112 : 111;
    int before = g_set_local_threads ? g_set_local_threads(1) : 0;  // one thread inside (runtime/blas.py)
    if (g_sgemm_int64)
        ((sgemm64_t)g_sgemm)(row_major, TA, TB, M, N, K, 1.0f, A, lda, B, ldb, beta, C, ldc);
    else
        ((sgemm32_t)g_sgemm)(row_major, TA, TB, (int)M, (int)N, (int)K, 1.0f, A, (int)lda, B, (int)ldb, beta, C,
                             (int)ldc);
    if (g_set_local_threads) g_set_local_threads(before);
}

struct Attention {  // the shapes, the query blocks and the probability buffer of each block
    int B, Tq, Tk, H, Hkv, D, n_blocks;
    const i64 *qa, *qb, *nk;
    float* const* probs;  // block i: (B, Hkv, G*(qb-qa), nk), rows ordered (query head of the group, query)
    float scale;
    int G() const { return H / Hkv; }
    float* p(int i, i64 b, int j, int g) const {
        i64 rows = qb[i] - qa[i];
        return probs[i] + (((b * Hkv + j) * G() + g) * rows) * nk[i];
    }
};

EXPORT void attention_fwd(const float* q, const float* k, const float* v, float* out, float* const* probs,
                          const i64* qa, const i64* qb, const i64* nk, int n_blocks, int B, int Tq, int Tk, int H,
                          int Hkv, int D, float scale, const i64* cuts, int parts) {
    Attention a{B, Tq, Tk, H, Hkv, D, n_blocks, qa, qb, nk, probs, scale};
    par(cuts, parts, [&](i64 lo, i64 hi) {
        for (i64 task = lo; task < hi; task++) {  // (sequence b, kv head j)
            i64 b = task / Hkv;
            int j = (int)(task % Hkv);
            const float* kh = k + (b * Tk * Hkv + j) * D;
            const float* vh = v + (b * Tk * Hkv + j) * D;
            for (int i = 0; i < n_blocks; i++)
                for (int g = 0; g < a.G(); g++) {
                    int h = j * a.G() + g;
                    i64 rows = qb[i] - qa[i], off = ((b * Tq + qa[i]) * H + h) * D;
                    float* p = a.p(i, b, j, g);
                    sgemm(false, true, rows, nk[i], D, q + off, (i64)H * D, kh, (i64)Hkv * D, 0.0f, p, nk[i]);
                    causal_softmax_fwd_rows(p, 0, rows, (int)rows, (int)nk[i], scale);
                    sgemm(false, false, rows, D, nk[i], p, nk[i], vh, (i64)Hkv * D, 0.0f, out + off, (i64)H * D);
                }
        }
    });
}

EXPORT void attention_bwd(const float* q, const float* k, const float* v, const float* dout, float* const* probs,
                          const i64* qa, const i64* qb, const i64* nk, int n_blocks, int B, int Tq, int Tk, int H,
                          int Hkv, int D, float scale, float* dq, float* dk, float* dv, const i64* cuts, int parts) {
    Attention a{B, Tq, Tk, H, Hkv, D, n_blocks, qa, qb, nk, probs, scale};
    i64 most = 0;  // the largest block of scores: the dP scratch of a task
    for (int i = 0; i < n_blocks; i++) most = std::max(most, (qb[i] - qa[i]) * nk[i]);
    par(cuts, parts, [&](i64 lo, i64 hi) {
        std::vector<float> ds(most);
        for (i64 task = lo; task < hi; task++) {
            i64 b = task / Hkv;
            int j = (int)(task % Hkv);
            i64 kv = (b * Tk * Hkv + j) * D, ld_kv = (i64)Hkv * D, ld_q = (i64)H * D;
            for (i64 t = 0; t < Tk; t++) {
                std::memset(dk + kv + t * ld_kv, 0, sizeof(float) * D);
                std::memset(dv + kv + t * ld_kv, 0, sizeof(float) * D);
            }
            for (int i = 0; i < n_blocks; i++)
                for (int g = 0; g < a.G(); g++) {
                    int h = j * a.G() + g;
                    i64 rows = qb[i] - qa[i], n = nk[i], off = ((b * Tq + qa[i]) * H + h) * D;
                    const float* p = a.p(i, b, j, g);
                    sgemm(true, false, n, D, rows, p, n, dout + off, ld_q, 1.0f, dv + kv, ld_kv);  // dV += P^T dO
                    sgemm(false, true, rows, n, D, dout + off, ld_q, v + kv, ld_kv, 0.0f, ds.data(), n);  // dP
                    causal_softmax_bwd_rows(p, ds.data(), 0, rows, (int)rows, (int)n, scale);  // dS
                    sgemm(false, false, rows, D, n, ds.data(), n, k + kv, ld_kv, 0.0f, dq + off, ld_q);  // dQ = dS K
                    sgemm(true, false, n, D, rows, ds.data(), n, q + off, ld_q, 1.0f, dk + kv, ld_kv);  // dK += dS^T Q
                }
        }
    });
}

// ------------------------------------------------------------------ the optimizer's passes
// One task per parameter array, taken by the threads one by one (the largest first, as Python
// sorted them): a sum keeps its bits only whole, so no array is split. Elementwise passes
// (the clip's scale, AdamW) would give the same bits on any split; whole arrays keep it simple.
struct ArrayTask {
    float* p;        // the array (theta for AdamW)
    const float* g;  // AdamW: its gradient
    float *m, *v;    // AdamW: its moments
    i64 n;
    float decay, one_minus_b1, b2, one_minus_b2, bc2_sqrt, eps, step;  // AdamW's constants
    int decays;
};

// f(0) .. f(n-1) on `threads` threads, each taking the next task nobody has started
template <class F> static void each_task(int n, int threads, const F& f) {
    std::atomic<int> next{0};
    std::vector<i64> cuts(threads + 1);
    for (int i = 0; i <= threads; i++) cuts[i] = i;
    par(cuts.data(), threads, [&](i64, i64) {
        for (int i; (i = next.fetch_add(1, std::memory_order_relaxed)) < n;) f(i);
    });
}

// out[i] = sum of p^2 over array i, in float64: 16 lanes, then the lanes in order
EXPORT void sum_squares(const ArrayTask* tasks, int n, double* out, int threads) {
    each_task(n, threads, [&](int i) {
        const float* a = tasks[i].p;
        i64 size = tasks[i].n, j = 0;
        double acc[LANES] = {0};
        for (; j + LANES <= size; j += LANES)
            for (int k = 0; k < LANES; k++) acc[k] += (double)a[j + k] * (double)a[j + k];
        for (int k = 0; j + k < size; k++) acc[k] += (double)a[j + k] * (double)a[j + k];
        double s = 0.0;
        for (int k = 0; k < LANES; k++) s += acc[k];
        out[i] = s;
    });
}

// p *= coef, one float32 rounding per element (NumPy's `grad *= np.float32(coef)`)
EXPORT void scale_arrays(const ArrayTask* tasks, int n, float coef, int threads) {
    each_task(n, threads, [&](int i) {
        float* a = tasks[i].p;
        for (i64 j = 0; j < tasks[i].n; j++) a[j] *= coef;
    });
}

EXPORT void adamw_arrays(const ArrayTask* tasks, int n, int threads) {
    each_task(n, threads, [&](int i) {
        const ArrayTask& t = tasks[i];
        adamw(t.p, t.g, t.m, t.v, t.n, t.decay, t.decays, t.one_minus_b1, t.b2, t.one_minus_b2, t.bc2_sqrt,
              t.eps, t.step);
    });
}

// ------------------------------------------------------------------ row passes of the lm_head
// x[r, :] *= f[r]: the cross-entropy's backward turns exp(logits - max) into its gradient
EXPORT void scale_rows(float* x, const float* f, int V, const i64* cuts, int parts) {
    par(cuts, parts, [&](i64 lo, i64 hi) {
        for (i64 r = lo; r < hi; r++) {
            float* xr = x + r * V;
            const float fr = f[r];
            for (int j = 0; j < V; j++) xr[j] *= fr;
        }
    });
}

// ------------------------------------------------------------------ embedding backward
// gw (V, D) = sum over tokens t of g[t] into row ids[t]; the rows [lo, hi) of each part are
// summed in token order, as np.add.at does: the same bits, split by vocabulary rows
EXPORT void embedding_bwd(const i64* ids, i64 n_tokens, const float* g, float* gw, int D, const i64* cuts,
                          int parts) {
    par(cuts, parts, [&](i64 lo, i64 hi) {
        std::memset(gw + lo * D, 0, sizeof(float) * (hi - lo) * D);
        for (i64 t = 0; t < n_tokens; t++) {
            i64 id = ids[t];
            if (id < lo || id >= hi) continue;
            float* row = gw + id * D;
            const float* src = g + t * D;
            for (int j = 0; j < D; j++) row[j] += src[j];
        }
    });
}

// ------------------------------------------------------------------ matmul chunks on the pool
// cpu_threads.matmuls' row chunks, each one sgemm call, taken by the threads one by one (the
// largest first, as Python sorted them): the same calls whichever thread makes them.
struct GemmTask {
    i64 M, N, K, lda, ldb, ldc;
    const float* A;
    const float* B;
    float* C;
    int ta, tb;
};

EXPORT void gemm_tasks(const GemmTask* tasks, int n, int threads) {
    each_task(n, threads, [&](int i) {
        const GemmTask& t = tasks[i];
        sgemm(t.ta, t.tb, t.M, t.N, t.K, t.A, t.lda, t.B, t.ldb, 0.0f, t.C, t.ldc);
    });
}

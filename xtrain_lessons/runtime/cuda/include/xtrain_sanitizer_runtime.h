// xtrain_sanitizer_runtime.h — the runtime half of the sanitizer (part of the emulator runtime).
//
// Global memory: Python copies every array argument into a "region" whose data ends exactly
// where 64 KB of PROT_NONE guard pages begin, so the first access past the end faults. The
// SIGSEGV handler (installed only while a sanitized launch runs) turns the fault address into
// (parameter, index), reads the page-fault error code to tell a read from a write, and stops
// the CUDA thread with the report. An index a little below 0 lands in the data's own page and
// is not seen.
// Shared memory: the checked views of xtrain_sanitizer.h call xt_san_shared for every access;
// a per-byte shadow records the last writer and readers with their barrier epoch, which gives
// the uninitialised-read and race reports. Threads of one warp that met at a warp operation
// (__syncwarp, a shuffle) since the other access do not race.
#pragma once

namespace xt {

struct Region {
    char* map = nullptr;
    size_t maplen = 0;
    char* base = nullptr;
    size_t bytes = 0, item = 1;
    std::string name, ctype;
};
static std::mutex g_regions_mu;
static std::vector<Region> g_regions;
static constexpr size_t kGuard = 64 * 1024;

static std::string thread_name(Worker* w, int t) {
    uint3 id = w->th[t].tid;
    return "thread (" + std::to_string(id.x) + "," + std::to_string(id.y) + "," + std::to_string(id.z) + ")";
}

static std::string where(Worker* w) { return "in " + block_name(w) + ", " + thread_name(w, t_index); }

static const Region* region_of(const char* a) {
    for (const Region& r : g_regions)
        if (a >= r.map && a < r.map + r.maplen) return &r;
    return nullptr;
}

static void on_segv(int sig, siginfo_t* si, void* ctx);
static struct sigaction* g_old_segv = nullptr;

// Installs the SIGSEGV handler for the duration of a sanitized launch, then puts back the old one.
struct SanitizerSignals {
    bool on;
    struct sigaction old {};
    explicit SanitizerSignals(bool enable) : on(enable) {
        if (!on) return;
        struct sigaction sa {};
        sa.sa_sigaction = on_segv;
        sa.sa_flags = SA_SIGINFO | SA_NODEFER;  // NODEFER: the handler never returns, leaves it unblocked
        sigemptyset(&sa.sa_mask);
        sigaction(SIGSEGV, &sa, &old);
        g_old_segv = &old;
    }
    ~SanitizerSignals() { if (on) { sigaction(SIGSEGV, &old, nullptr); g_old_segv = nullptr; } }
};

static void on_segv(int sig, siginfo_t* si, void* ctx) {
    const char* a = (const char*)si->si_addr;
    Worker* w = t_w;
    const Region* r = region_of(a);
    if (!w || !w->L || !w->L->sanitize || !r) {  // not ours: the previous handler sees it happen again
        if (g_old_segv) sigaction(SIGSEGV, g_old_segv, nullptr); else signal(SIGSEGV, SIG_DFL);
        return;
    }
    const char* kind = "access";
#if defined(__x86_64__) && defined(REG_ERR)
    kind = (((ucontext_t*)ctx)->uc_mcontext.gregs[REG_ERR] & 2) ? "write" : "read";
#endif
    long long off = (long long)(a - r->base);
    long long index = off >= 0 ? off / (long long)r->item : -((-off + (long long)r->item - 1) / (long long)r->item);
    fail(std::string("out-of-bounds global ") + kind + " of " + r->name + "[" + std::to_string(index) +
         "]: parameter '" + r->name + "' (" + r->ctype + ") has " + std::to_string(r->bytes / r->item) +
         " elements " + where(w));
    (void)sig;
}

static Shadow* shadow_of(Worker* w, const char* a) {
    if (a >= w->stat && a < w->stat + kArena) {
        size_t off = a - w->stat;
        if (w->stat_shadow.size() <= off) w->stat_shadow.resize(std::max(off + 1, (size_t)4096));
        return &w->stat_shadow[off];
    }
    if (a >= w->dyn && a < w->dyn + w->L->shmem) {
        if (w->dyn_shadow.size() < w->L->shmem) w->dyn_shadow.resize(w->L->shmem);
        return &w->dyn_shadow[a - w->dyn];
    }
    return nullptr;
}

// The extent of dimension d of a declaration (the dynamic array's comes from the launch).
static long long extent(const xt_sinfo* info, int d) {
    return info->ext[0] < 0 ? (long long)(t_w->L->shmem / info->elem) : info->ext[d];
}

// "name[i][j]" for the first `depth` indices of the element (or sub-array) at `addr`.
static std::string element(const void* base, const xt_sinfo* info, const void* addr, int depth) {
    long long flat = ((const char*)addr - (const char*)base) / (long long)info->elem;
    long long inner = 1;
    for (int d = depth; d < info->nd; d++) inner *= extent(info, d);
    flat /= inner;
    std::vector<long long> idx(depth);
    for (int d = depth - 1; d >= 0; d--) { long long e = extent(info, d); idx[d] = flat % e; flat /= e; }
    std::string s = info->name;
    for (long long i : idx) s += "[" + std::to_string(i) + "]";
    return s;
}

static std::string since_barrier(Worker* w) {
    if (w->epoch == 0) return "since the kernel started (no __syncthreads() between them)";
    return "both after the same __syncthreads() (on line " + std::to_string(w->th[t_index].line) +
           ") with no barrier between them";
}

static void race(Worker* w, const std::string& elem, int other, const char* other_did, const char* we_do) {
    fail("shared-memory race on " + elem + " in " + block_name(w) + ": " + thread_name(w, other) + " " +
         other_did + " it and " + thread_name(w, t_index) + " now " + we_do + " it, " + since_barrier(w) +
         (other / 32 == t_index / 32 ? "; add a __syncthreads() between the two accesses (a __syncwarp() is enough if only "
                                       "the lanes of one warp share the element)"
                                     : "; add a __syncthreads() between the two accesses"));
}

}  // namespace xt

XT_EXPORT void xt_san_shared(const void* addr, unsigned size, int write, const void* base, const xt_sinfo* info) {
    using namespace xt;
    Worker* w = t_w;
    if (!w || !w->L->sanitize) return;
    Shadow* s = shadow_of(w, (const char*)addr);
    if (!s) return;
    (void)size;
    const int t = t_index;
    const uint32_t we = w->wep[t / 32];
    const uint64_t phase = (w->gen << 24) | w->epoch;
    auto conflict = [&](int o, uint32_t owe) { return o >= 0 && o != t && !(o / 32 == t / 32 && owe != we); };
    if (write) {
        if (s->wphase == phase && conflict(s->wt, s->wwe))
            race(w, element(base, info, addr, info->nd), s->wt, "wrote", "writes");
        if (s->rphase == phase)
            for (int k = 0; k < 2; k++)
                if (conflict(s->rt[k], s->rwe[k]))
                    race(w, element(base, info, addr, info->nd), s->rt[k], "read", "writes");
        s->wphase = phase, s->wt = (int16_t)t, s->wwe = we, s->init = w->gen;
        return;
    }
    if (s->init != w->gen)
        fail("read of shared memory never written: " + element(base, info, addr, info->nd) + " " + where(w) +
             " (no thread of this block has written it yet: a __syncthreads() missing between the writes and "
             "this read, or an element nobody initialises; on a GPU it holds what an earlier block left)");
    if (s->wphase == phase && conflict(s->wt, s->wwe))
        race(w, element(base, info, addr, info->nd), s->wt, "wrote", "reads");
    if (s->rphase != phase) {
        s->rphase = phase, s->rt[0] = (int16_t)t, s->rwe[0] = we, s->rt[1] = -1;
    } else if (s->rt[0] != t && s->rt[1] < 0) {
        s->rt[1] = (int16_t)t, s->rwe[1] = we;
    }
}

XT_EXPORT void xt_san_shared_oob(const void* base, const xt_sinfo* info, const void* sub, int depth, long long i) {
    using namespace xt;
    fail("out-of-bounds shared-memory access: " + element(base, info, sub, depth) + "[" + std::to_string(i) +
         "] (that dimension has " + std::to_string(extent(info, depth)) + " elements) " + where(t_w));
}

// A plain pointer to shared memory escapes the checks: count what it covers as written, so that
// reads through the checked view after writes through the pointer are not reported.
XT_EXPORT void xt_san_shared_escape(const void* addr, unsigned long long bytes) {
    using namespace xt;
    Worker* w = t_w;
    if (!w || !w->L->sanitize) return;
    for (unsigned long long k = 0; k < bytes; k++)
        if (Shadow* s = shadow_of(w, (const char*)addr + k)) s->init = w->gen;
}

XT_EXPORT unsigned long long xt_dynamic_shared_bytes() { return xt::t_w->L->shmem; }

// A guarded copy of one array argument: returns where its `bytes` bytes start.
XT_EXPORT char* xt_san_region(unsigned long long bytes, unsigned long long item, const char* name, const char* ctype) {
    using namespace xt;
    const size_t page = 4096, data = (bytes + page - 1) / page * page;
    const size_t len = kGuard + data + kGuard;
    void* p = mmap(nullptr, len, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (p == MAP_FAILED) return nullptr;
    char* map = (char*)p;
    if (data) mprotect(map + kGuard, data, PROT_READ | PROT_WRITE);
    Region r;
    r.map = map, r.maplen = len, r.base = map + kGuard + data - bytes, r.bytes = bytes;
    r.item = item ? item : 1, r.name = name, r.ctype = ctype;
    std::lock_guard<std::mutex> lock(g_regions_mu);
    g_regions.push_back(r);
    return r.base;
}

XT_EXPORT void xt_san_release() {
    using namespace xt;
    std::lock_guard<std::mutex> lock(g_regions_mu);
    for (Region& r : g_regions) munmap(r.map, r.maplen);
    g_regions.clear();
}

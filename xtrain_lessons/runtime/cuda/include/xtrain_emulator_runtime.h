// xtrain_emulator_runtime.h — the launch runtime of the xtrain CPU emulator.
//
// Compiled once (per machine and compiler) into its own shared library, which every kernel
// library links against; kernels reach it through the extern "C" functions declared at the
// end of xtrain_cuda_compat.h. (A header, not a .cpp, only so that it ships as package data.)
//
// A launch spreads the blocks over a few OS threads ("workers", one per core). A worker runs
// its blocks one at a time; inside a block each CUDA thread is a fiber with its own stack, and
// the scheduler below runs the fibers in turn until each one finishes or blocks at a barrier or
// warp operation, then completes whatever barriers can complete, and repeats. A state where no
// barrier can complete is a deadlock and is reported, never waited on.
//
// The rules, shared by all modes (complete_barriers): a __syncthreads completes when every
// live thread waits at it — threads that returned count as arrived — and all wait at the same
// source line; a warp operation completes when every live lane of the warp waits at the same
// kind of warp operation. In THREADS mode each CUDA thread is an OS thread instead of a fiber,
// and the same rules are applied under a mutex by whichever thread arrives last.
#pragma once
#if defined(__APPLE__) && !defined(_XOPEN_SOURCE)
#define _XOPEN_SOURCE 700  // macOS declares the ucontext functions only with it
#endif
#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <semaphore>
#include <string>
#include <thread>
#include <vector>
#include <signal.h>
#include <sys/mman.h>
#include <ucontext.h>

#include "xtrain_cuda_compat.h"

#define XT_EXPORT extern "C" __attribute__((visibility("default")))
extern "C" {
__attribute__((visibility("default"))) __thread xt_tls_t xt_tls;  // the definition (braces: not just extern)
}

// ---------------------------------------------------------------- the runtime
namespace xt {

enum class St : int { Ready, Sync, Warp, Done };
enum class Op : int { None = 0, SyncWarp = XT_SYNCWARP, Shfl, ShflUp, ShflDown, ShflXor, Ballot, Any, All, Active,
                      Collective };
enum Mode : int { FIBERS = 0, UCONTEXT = 1, THREADS = 2 };

static const char* op_name(Op op) {
    switch (op) {
        case Op::SyncWarp: return "__syncwarp";
        case Op::Shfl: return "__shfl_sync";
        case Op::ShflUp: return "__shfl_up_sync";
        case Op::ShflDown: return "__shfl_down_sync";
        case Op::ShflXor: return "__shfl_xor_sync";
        case Op::Ballot: return "__ballot_sync";
        case Op::Any: return "__any_sync";
        case Op::All: return "__all_sync";
        case Op::Active: return "__activemask";
        case Op::Collective: return "a warp-matrix instruction (mma.sync)";
        default: return "?";
    }
}

struct Thread {
    St state = St::Ready;
    bool started = false;
    int line = 0;               // source line of the barrier / warp op it waits at
    Op op = Op::None;
    uint64_t value = 0, result = 0;  // warp op operand and result (raw bits)
    int arg = 0, width = 32;
    uint3 tid{};
    void* sp = nullptr;         // FIBERS: saved stack pointer
    std::unique_ptr<ucontext_t> uc;  // UCONTEXT (allocated on first use: it is ~1 KB)
    std::unique_ptr<std::binary_semaphore> go;  // THREADS: start the next block
    std::unique_ptr<std::condition_variable> wake;  // THREADS: released from a barrier
};

struct Launch {
    void (*invoke)(void (*)(), void**);
    void (*fn)();
    void** args;
    uint3 grid, block;
    size_t shmem;
    int mode;
    bool fast;                  // no barriers / warp ops: run threads as plain calls
    bool sanitize = false;      // sanitizer mode: fibers, shared accesses checked
    long long nblocks;
    std::atomic<long long> next{0};
    std::atomic<bool> failed{false};
    std::mutex mu;
    std::string error;
};

static constexpr size_t kStaticShared = 48 * 1024;   // CUDA's static shared memory limit per block
static constexpr size_t kArena = 256 * 1024;         // static __shared__ of all kernels of a library
static constexpr size_t kStackSize = 128 * 1024;     // per fiber, one guard page included
// Stack tops 128 KB apart all fall in the same cache sets, and a barrier touches every fiber's
// top: shift fiber i's top by (i % 64) cache lines so that they spread over the sets.
static inline size_t stagger(int i) { return (size_t)(i % 64) * 64; }

// Sanitizer mode: what happened last to one byte of shared memory (the first byte of an access).
struct Shadow {
    uint64_t init = 0;              // the block (Worker::gen) that last wrote it
    uint64_t wphase = ~0ull, rphase = ~0ull;  // (block << 24 | barrier epoch) of the last write / reads
    int16_t wt = -1, rt[2] = {-1, -1};        // the writing thread, up to two reading threads
    uint32_t wwe = 0, rwe[2] = {0, 0};        // their warp epochs
};

struct Worker {
    Launch* L = nullptr;
    int nthreads = 0;
    std::vector<Thread> th;
    uint3 bidx{};
    std::vector<char> stat_buf, dyn_buf;
    char* stat = nullptr;       // static __shared__ arena
    std::vector<uint64_t> stamp;  // stamp[site] == gen: the site is initialised for this block
    uint64_t gen = 0;           // block counter
    size_t block_static = 0;    // static shared bytes this block has used
    char* dyn = nullptr;        // extern __shared__ (dynamic) arena
    char* stacks = nullptr;     // nthreads fiber stacks
    void* sched_sp = nullptr;
    ucontext_t sched_uc;
    std::string error;          // set by a failing thread or by the scheduler
    // sanitizer mode: barrier epoch of the block, one epoch per warp, shadow of shared memory
    uint32_t epoch = 0;
    std::vector<uint32_t> wep;
    std::vector<Shadow> stat_shadow, dyn_shadow;
    // THREADS mode: the block's CUDA threads run in parallel; mu guards the Thread states
    std::vector<std::thread> os;
    std::mutex mu;
    std::condition_variable cv;
    int live = 0, running = 0, unfinished = 0;
    int fibers_live = 0;        // FIBERS / UCONTEXT: threads of the block not finished
    bool quit = false, aborting = false;
};

static thread_local Worker* t_w = nullptr;
static thread_local int t_index = 0;

struct Abort {};  // unwinds a CUDA thread that must stop (THREADS mode, fast path)

}  // namespace xt

// ---------------------------------------------------------------- context switching
#if defined(__x86_64__) && defined(__ELF__)
// xt_switch_ctx(save, to): push the callee-saved registers, store the stack pointer in
// *save, load `to`, pop and return into the other context. About 20x cheaper than
// swapcontext, which also saves the signal mask with a system call.
extern "C" void xt_switch_ctx(void** save, void* to);
asm(R"(
    .text
    .p2align 4
    .globl xt_switch_ctx
    .hidden xt_switch_ctx
    .type xt_switch_ctx,@function
xt_switch_ctx:
    pushq %rbp
    pushq %rbx
    pushq %r12
    pushq %r13
    pushq %r14
    pushq %r15
    movq %rsp, (%rdi)
    movq %rsi, %rsp
    popq %r15
    popq %r14
    popq %r13
    popq %r12
    popq %rbx
    popq %rbp
    ret
    .size xt_switch_ctx, .-xt_switch_ctx
)");
#define XT_HAVE_ASM_SWITCH 1
#else
#define XT_HAVE_ASM_SWITCH 0
#endif

namespace xt {

static void fail(const std::string& msg);

static void set_error(Launch* L, const std::string& msg) {
    std::lock_guard<std::mutex> lock(L->mu);
    if (L->error.empty()) L->error = msg;
    L->failed = true;
}

static void leave(Worker* w, int i);

static void fiber_finish(Worker* w, int i) {
    w->th[i].state = St::Done;
    w->fibers_live--;
    leave(w, i);
    __builtin_trap();  // a finished fiber is never resumed
}

static void fiber_main() {
    Worker* w = t_w;
    int i = t_index;
    w->L->invoke(w->L->fn, w->L->args);
    fiber_finish(w, i);
}

// Make CUDA thread i the current one: its identity, and a fresh stack if it has not run yet.
static void enter(Worker* w, int i) {
    Thread& t = w->th[i];
    t_index = i;
    xt_tls.tid = t.tid;
    if (!t.started) {
        char* base = w->stacks + (size_t)i * kStackSize;
        t.started = true;
#if XT_HAVE_ASM_SWITCH
        if (w->L->mode == FIBERS) {
            // A fresh stack that "returns" into fiber_main with the ABI's alignment.
            void** sp = (void**)(((uintptr_t)(base + kStackSize - stagger(i))) & ~(uintptr_t)15);
            *--sp = nullptr;
            *--sp = (void*)&fiber_main;
            for (int k = 0; k < 6; k++) *--sp = nullptr;
            t.sp = sp;
        }
#endif
        if (w->L->mode != FIBERS || !XT_HAVE_ASM_SWITCH) {
            if (!t.uc) t.uc = std::make_unique<ucontext_t>();
            getcontext(t.uc.get());
            t.uc->uc_stack.ss_sp = base + 4096;
            t.uc->uc_stack.ss_size = kStackSize - 4096 - stagger(i);
            t.uc->uc_link = nullptr;
            makecontext(t.uc.get(), (void (*)())fiber_main, 0);
        }
    }
}

// The next fiber of this round: the first runnable one after i, or -1.
static inline int next_ready(Worker* w, int i) {
    for (int j = i + 1; j < w->nthreads; j++)
        if (w->th[j].state == St::Ready) return j;
    return -1;
}

// Switch from the scheduler into CUDA thread i. With FIBERS, the fibers then hand over to each
// other directly (leave) and only the last runnable one comes back here: one stack switch per
// thread and barrier instead of two.
static void resume(Worker* w, int i) {
    enter(w, i);
#if XT_HAVE_ASM_SWITCH
    if (w->L->mode == FIBERS) { xt_switch_ctx(&w->sched_sp, w->th[i].sp); return; }
#endif
    swapcontext(&w->sched_uc, w->th[i].uc.get());
}

// CUDA thread i stops (it waits or has finished): run the next fiber of the round, or go back
// to the scheduler when there is none.
static void leave(Worker* w, int i) {
#if XT_HAVE_ASM_SWITCH
    if (w->L->mode == FIBERS) {
        int j = next_ready(w, i);
        if (j < 0) { xt_switch_ctx(&w->th[i].sp, w->sched_sp); return; }
        enter(w, j);
        xt_switch_ctx(&w->th[i].sp, w->th[j].sp);
        return;
    }
#endif
    swapcontext(w->th[i].uc.get(), &w->sched_uc);
}

static void settle(Worker* w);

// Called by a CUDA thread: give control back to the scheduler.
static void yield() {
    Worker* w = t_w;
    int i = t_index;
#if XT_HAVE_ASM_SWITCH
    if (w->L->mode == FIBERS) {
        xt_switch_ctx(&w->th[i].sp, w->sched_sp);
        return;
    }
#endif
    swapcontext(w->th[i].uc.get(), &w->sched_uc);
}

// An error detected inside a CUDA thread: record it and stop this thread.
static void fail(const std::string& msg) {
    Worker* w = t_w;
    if (w->L->fast) { if (w->error.empty()) w->error = msg; throw Abort{}; }
    if (w->L->mode == THREADS) {
        std::lock_guard<std::mutex> lock(w->mu);
        if (w->error.empty()) w->error = msg;
        w->aborting = true;
        for (int i = 0; i < w->nthreads; i++) w->th[i].wake->notify_one();
        throw Abort{};
    }
    if (w->error.empty()) w->error = msg;
    w->th[t_index].state = St::Sync;
    for (;;) yield();  // never resumed
}

static void check_not_fast(const char* what) {
    if (t_w->L->fast)
        fail(std::string(what) + " reached, but the emulator found no barrier or warp operation in the "
             "kernel's source and ran it without fibers (is the call hidden behind a macro?)");
}

// A CUDA thread arrives at a barrier (Sync) or a warp operation (Warp) and waits there.
static void wait_at(St state, int line, Op op = Op::None, uint64_t value = 0, int arg = 0, int width = 32) {
    Worker* w = t_w;
    Thread& t = w->th[t_index];
    const bool threads = w->L->mode == THREADS;
    std::unique_lock<std::mutex> lock(w->mu, std::defer_lock);
    if (threads) lock.lock();  // other OS threads read these fields in settle()
    t.state = state;
    t.line = line;
    t.op = op;
    t.value = value;
    t.arg = arg;
    t.width = width;
    if (!threads) { leave(w, t_index); return; }
    w->running--;
    settle(w);
    t.wake->wait(lock, [&] { return t.state == St::Ready || w->aborting; });
    if (w->aborting) throw Abort{};
}

static void syncthreads(int line) {  // xt_syncthreads
    check_not_fast("__syncthreads");
    wait_at(St::Sync, line);
}

static uint64_t warp_op(int line, Op op, uint64_t value, int arg, int width) {
    if (width < 1 || width > 32 || (width & (width - 1)))
        fail("warp operation on line " + std::to_string(line) + ": width must be a power of 2 up to 32");
    check_not_fast(op_name(op));
    wait_at(St::Warp, line, op, value, arg, width);
    return t_w->th[t_index].result;
}

// ---------------------------------------------------------------- the block scheduler
static std::string ranges(const std::vector<int>& idx) {
    std::string s;
    for (size_t k = 0; k < idx.size();) {
        size_t j = k;
        while (j + 1 < idx.size() && idx[j + 1] == idx[j] + 1) j++;
        if (!s.empty()) s += ",";
        s += std::to_string(idx[k]);
        if (j > k) s += "-" + std::to_string(idx[j]);
        k = j + 1;
    }
    return s;
}

static std::string block_name(Worker* w) {
    return "block (" + std::to_string(w->bidx.x) + "," + std::to_string(w->bidx.y) + "," +
           std::to_string(w->bidx.z) + ")";
}

// "threads 0-15 wait at __syncthreads() on line 7; threads 16-31 have exited"
static std::string describe_state(Worker* w) {
    std::vector<std::pair<std::string, std::vector<int>>> groups;
    for (int i = 0; i < w->nthreads; i++) {
        const Thread& t = w->th[i];
        std::string what;
        if (t.state == St::Done) what = "have exited";
        else if (t.state == St::Sync) what = "wait at __syncthreads() on line " + std::to_string(t.line);
        else if (t.state == St::Warp) what = std::string("wait at ") + op_name(t.op) + " on line " + std::to_string(t.line);
        else what = "are runnable";
        auto it = std::find_if(groups.begin(), groups.end(), [&](auto& g) { return g.first == what; });
        if (it == groups.end()) groups.push_back({what, {i}}); else it->second.push_back(i);
    }
    std::string s;
    for (auto& g : groups) s += (s.empty() ? "threads " : "; threads ") + ranges(g.second) + " " + g.first;
    return s;
}

// A warp-collective instruction (mma.sync): the work is done once, here, with every lane's
// operands, while all 32 lanes wait; each lane's value points at its xt_collective_t. All 32
// lanes must take part (the instruction is .aligned: a GPU requires every lane of the warp to
// execute it). Returns false with w->error set when that or the instruction fails.
static bool run_collective(Worker* w, int base, int n) {
    std::vector<int> gone;
    for (int l = 0; l < n; l++) if (w->th[base + l].state == St::Done) gone.push_back(l);
    int lead = 0;
    while (w->th[base + lead].state == St::Done) lead++;  // a live lane: release_warps saw one
    const Thread& first = w->th[base + lead];
    const xt_collective_t* head = reinterpret_cast<const xt_collective_t*>(first.value);
    const std::string where = " in " + block_name(w) + ", warp " + std::to_string(base / 32);
    if (n < 32 || !gone.empty()) {
        w->error = std::string(head->name) + " on line " + std::to_string(first.line) +
                   " needs all 32 lanes of the warp" + where + ": " +
                   (n < 32 ? "the block has only " + std::to_string(n) + " threads in this warp (make the block "
                                                                          "a multiple of 32 threads)"
                           : "lanes " + ranges(gone) + " have exited (" + describe_state(w) + ")");
        return false;
    }
    void* lanes[32];
    for (int l = 0; l < 32; l++) {
        const Thread& t = w->th[base + l];
        lanes[l] = reinterpret_cast<void*>(t.value);
        const xt_collective_t* h = reinterpret_cast<const xt_collective_t*>(t.value);
        if (h->run != head->run || t.line != first.line) {
            w->error = "warp divergence" + where + ": lanes wait at different warp-matrix instructions (" +
                       std::string(head->name) + " on line " + std::to_string(first.line) + ", " + h->name +
                       " on line " + std::to_string(t.line) + ")";
            return false;
        }
    }
    char err[512] = "";
    if (head->run(lanes, err, sizeof err) != 0) {
        w->error = std::string(head->name) + " on line " + std::to_string(first.line) + where + ": " + err;
        return false;
    }
    if (w->L->sanitize) w->wep[base / 32]++;
    for (int l = 0; l < 32; l++) {
        w->th[base + l].result = 0;
        w->th[base + l].state = St::Ready;
    }
    return true;
}

// Complete the warp operations whose live lanes have all arrived. Returns how many threads
// were released; sets w->error if lanes of one warp wait at different kinds of operation.
static int release_warps(Worker* w) {
    int released = 0;
    for (int base = 0; base < w->nthreads; base += 32) {
        int n = std::min(32, w->nthreads - base);
        bool live = false, ready = true;
        Op op = Op::None;
        for (int l = 0; l < n; l++) {
            const Thread& t = w->th[base + l];
            if (t.state == St::Done) continue;
            live = true;
            if (t.state != St::Warp) { ready = false; break; }
            if (op == Op::None) op = t.op;
            else if (t.op != op) {
                w->error = "warp divergence in " + block_name(w) + ", warp " + std::to_string(base / 32) +
                           ": lanes wait at different warp operations (" + describe_state(w) + ")";
                return released;
            }
        }
        if (!live || !ready) continue;
        if (op == Op::Collective) {
            if (!run_collective(w, base, n)) return released;
            released += n;
            continue;
        }
        if (w->L->sanitize) w->wep[base / 32]++;  // the lanes have met: a new warp epoch
        uint64_t ballot = 0;
        bool any = false, all = true;
        for (int l = 0; l < n; l++) {
            const Thread& t = w->th[base + l];
            if (t.state == St::Done) continue;
            if (t.value) { ballot |= 1ull << l; any = true; } else all = false;
        }
        for (int l = 0; l < n; l++) {
            Thread& t = w->th[base + l];
            if (t.state == St::Done) continue;
            int width = t.width, seg = l & ~(width - 1), src = l;
            switch (op) {
                case Op::Shfl: src = seg + (t.arg & (width - 1)); break;
                case Op::ShflUp: src = l - t.arg; if (src < seg) src = l; break;
                case Op::ShflDown: src = l + t.arg; if (src >= seg + width) src = l; break;
                case Op::ShflXor: src = l ^ t.arg; if (src >= seg + width) src = l; break;
                default: break;
            }
            // A lane that exited (or does not exist) has no value to give: keep our own.
            if (src < 0 || src >= n || w->th[base + src].state == St::Done) src = l;
            switch (op) {
                case Op::Ballot: case Op::Active: t.result = ballot; break;
                case Op::Any: t.result = any; break;
                case Op::All: t.result = all; break;
                case Op::SyncWarp: t.result = 0; break;
                default: t.result = w->th[base + src].value; break;
            }
            t.state = St::Ready;
            released++;
        }
    }
    return released;
}

// Complete the barriers that can complete, given `live` unfinished threads. Returns the number
// of threads released, 0 if none can be, -1 on an error (w->error set).
static int complete_barriers(Worker* w, int live) {
    const int T = w->nthreads;
    int nsync = 0, line = -1;
    bool same = true;
    for (int i = 0; i < T; i++) {
        const Thread& t = w->th[i];
        if (t.state != St::Sync) continue;
        nsync++;
        if (line < 0) line = t.line; else if (t.line != line) same = false;
    }
    if (nsync == live) {  // threads that exited count as arrived
        if (!same) {
            w->error = "__syncthreads() divergence in " + block_name(w) + ": " + describe_state(w) +
                       ". Every thread of a block must reach the same __syncthreads() "
                       "(on a GPU this hangs or corrupts results).";
            return -1;
        }
        for (int i = 0; i < T; i++) if (w->th[i].state == St::Sync) w->th[i].state = St::Ready;
        w->epoch++;
        return nsync;
    }
    int released = release_warps(w);
    return w->error.empty() ? released : -1;
}

static std::string deadlock_message(Worker* w) {
    return "deadlock in " + block_name(w) + ": " + describe_state(w) +
           ". A barrier that some threads never reach can never complete.";
}

// ---- THREADS mode: every CUDA thread of the block is an OS thread, all running in parallel.
// A thread that reaches a barrier records it under the block's mutex, completes whatever
// barriers can complete, and sleeps until it is released. When no thread is running and
// nothing can be released, the block is deadlocked.
static void settle(Worker* w) {  // with w->mu held
    if (w->aborting) return;
    int released = complete_barriers(w, w->live);
    if (released == 0 && w->running == 0 && w->live > 0) w->error = deadlock_message(w);
    if (!w->error.empty()) {
        w->aborting = true;
        for (int i = 0; i < w->nthreads; i++) w->th[i].wake->notify_one();
    } else if (released > 0) {
        w->running += released;
        for (int i = 0; i < w->nthreads; i++)  // wake only the released threads
            if (w->th[i].state == St::Ready) w->th[i].wake->notify_one();
    }
}

static void thread_main(Worker* w, int i) {
    t_w = w;
    t_index = i;
    for (;;) {
        w->th[i].go->acquire();
        if (w->quit) return;
        xt_tls.tid = w->th[i].tid;
        xt_tls.bid = w->bidx;
        xt_tls.bdim = w->L->block;
        xt_tls.gdim = w->L->grid;
        bool exited = true;
        try { w->L->invoke(w->L->fn, w->L->args); } catch (Abort&) { exited = false; }
        std::lock_guard<std::mutex> lock(w->mu);
        w->th[i].state = St::Done;
        if (exited) { w->live--; w->running--; settle(w); }
        if (--w->unfinished == 0) w->cv.notify_all();
    }
}

static bool run_block_threads(Worker* w) {
    const int T = w->nthreads;
    {
        std::lock_guard<std::mutex> lock(w->mu);
        for (int i = 0; i < T; i++) w->th[i].state = St::Ready;
        w->live = w->running = w->unfinished = T;
        w->aborting = false;
    }
    for (int i = 0; i < T; i++) w->th[i].go->release();
    std::unique_lock<std::mutex> lock(w->mu);
    w->cv.wait(lock, [&] { return w->unfinished == 0; });
    return w->error.empty();
}

// Run one block. Returns false (with w->error set) on a kernel error.
static bool run_block(Worker* w) {
    Launch* L = w->L;
    const int T = w->nthreads;
    w->gen++;  // static __shared__ sites are NaN-filled when first reached in this block
    if (L->sanitize) { w->epoch = 0; w->wep.assign((T + 31) / 32, 0); }
    w->block_static = 0;
    if (L->shmem) std::memset(w->dyn, 0xFF, L->shmem);  // NaN everywhere: uninitialised reads show
    xt_tls.bid = w->bidx;
    if (L->fast) {
        for (int i = 0; i < T; i++) {
            t_index = i;
            xt_tls.tid = w->th[i].tid;
            try { L->invoke(L->fn, L->args); } catch (Abort&) { return false; }
        }
        return true;
    }
    if (L->mode == THREADS) return run_block_threads(w);
    for (int i = 0; i < T; i++) { w->th[i].state = St::Ready; w->th[i].started = false; }
    w->fibers_live = T;
    for (;;) {
        // Run every runnable fiber, in thread order, until it blocks or exits. FIBERS: one
        // resume starts a chain through all of them; UCONTEXT: one resume each.
        for (int i = next_ready(w, -1); i >= 0; i = next_ready(w, i)) {
            resume(w, i);
            if (!w->error.empty()) return false;
            if (L->mode == FIBERS && XT_HAVE_ASM_SWITCH) break;
        }
        const int live = w->fibers_live;
        if (live == 0) return true;
        int released = complete_barriers(w, live);
        if (released < 0) return false;
        if (released == 0) { w->error = deadlock_message(w); return false; }
    }
}

// Stack memory for fibers: kept in a pool so that launches reuse touched pages.
struct StackPool {
    std::mutex mu;
    std::vector<std::pair<char*, size_t>> free;
    std::pair<char*, size_t> get(size_t bytes) {
        {
            std::lock_guard<std::mutex> lock(mu);
            for (size_t k = 0; k < free.size(); k++)
                if (free[k].second >= bytes) { auto r = free[k]; free.erase(free.begin() + k); return r; }
        }
        void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
        if (p == MAP_FAILED) return {nullptr, 0};
        for (size_t off = 0; off < bytes; off += kStackSize) mprotect((char*)p + off, 4096, PROT_NONE);  // guard
        return {(char*)p, bytes};
    }
    void put(std::pair<char*, size_t> r) { std::lock_guard<std::mutex> lock(mu); free.push_back(r); }
};
static StackPool g_stacks;

// Workers (their arenas and thread tables) are kept between launches: a launch of a small
// kernel then costs microseconds, not the allocation of a few hundred KB.
static std::mutex g_workers_mu;
static std::vector<Worker*> g_workers;

static Worker* take_worker() {
    std::lock_guard<std::mutex> lock(g_workers_mu);
    if (g_workers.empty()) {
        Worker* w = new Worker;
        w->stat_buf.assign(kArena + 64, (char)0xFF);
        w->stat = (char*)(((uintptr_t)w->stat_buf.data() + 63) & ~(uintptr_t)63);
        return w;
    }
    Worker* w = g_workers.back();
    g_workers.pop_back();
    return w;
}

static void give_back(Worker* w) {
    std::lock_guard<std::mutex> lock(g_workers_mu);
    g_workers.push_back(w);
}

static void run_worker_on(Worker& w, Launch* L);

static void run_worker(Launch* L) {
    Worker* w = take_worker();
    run_worker_on(*w, L);
    give_back(w);
}

static void run_worker_on(Worker& w, Launch* L) {
    w.L = L;
    w.error.clear();
    w.quit = w.aborting = false;
    w.os.clear();
    t_w = &w;
    xt_tls.bdim = L->block;
    xt_tls.gdim = L->grid;
    const unsigned bx = L->block.x, by = L->block.y;
    w.nthreads = (int)(L->block.x * L->block.y * L->block.z);
    if ((int)w.th.size() < w.nthreads) w.th.resize(w.nthreads);
    for (int i = 0; i < w.nthreads; i++) w.th[i].tid = uint3{i % bx, (i / bx) % by, i / (bx * by)};
    if (w.dyn_buf.size() < L->shmem + 64) w.dyn_buf.resize(L->shmem + 64);
    w.dyn = (char*)(((uintptr_t)w.dyn_buf.data() + 63) & ~(uintptr_t)63);
    std::pair<char*, size_t> stacks{nullptr, 0};
    if (!L->fast && L->mode != THREADS) {
        stacks = g_stacks.get((size_t)w.nthreads * kStackSize);
        if (!stacks.first) { set_error(L, "could not allocate fiber stacks"); return; }
        w.stacks = stacks.first;
    }
    if (!L->fast && L->mode == THREADS)
        for (int i = 0; i < w.nthreads; i++) {
            w.th[i].go = std::make_unique<std::binary_semaphore>(0);
            w.th[i].wake = std::make_unique<std::condition_variable>();
            w.os.emplace_back(thread_main, &w, i);
        }
    const unsigned gx = L->grid.x, gy = L->grid.y;
    for (;;) {
        long long b = L->next.fetch_add(1);
        if (b >= L->nblocks || L->failed) break;
        w.bidx = uint3{(unsigned)(b % gx), (unsigned)((b / gx) % gy), (unsigned)(b / ((long long)gx * gy))};
        if (!run_block(&w)) { set_error(L, w.error); break; }
    }
    if (L->mode == THREADS && !L->fast) {  // stop the OS threads
        w.quit = true;
        for (int i = 0; i < w.nthreads; i++) w.th[i].go->release();
        for (auto& t : w.os) t.join();
    }
    if (stacks.first) g_stacks.put(stacks);
    t_w = nullptr;
}

// Helper OS threads, started once and kept: each launch wakes `helpers` of them to run
// blocks beside the calling thread.
struct ThreadPool {
    std::mutex launch_mu, mu;
    std::condition_variable wake, done;
    std::vector<std::thread> threads;
    Launch* job = nullptr;
    int pending = 0, running = 0;

    void run(Launch* L, int helpers) {
        std::unique_lock<std::mutex> lock(mu);
        while ((int)threads.size() < helpers) {
            threads.emplace_back([this] { loop(); });
            threads.back().detach();  // never joined: they sleep until the process exits
        }
        job = L;
        pending = running = helpers;
        wake.notify_all();
        lock.unlock();
        run_worker(L);  // the calling thread is a worker too
        lock.lock();
        done.wait(lock, [&] { return running == 0; });
        job = nullptr;
    }

    void loop() {
        std::unique_lock<std::mutex> lock(mu);
        for (;;) {
            wake.wait(lock, [&] { return pending > 0; });
            pending--;
            Launch* L = job;
            lock.unlock();
            run_worker(L);
            lock.lock();
            if (--running == 0) done.notify_all();
        }
    }
};
static ThreadPool* g_pool = new ThreadPool;  // leaked on purpose: no destructor at exit

}  // namespace xt
#include "xtrain_sanitizer_runtime.h"
namespace xt {

static int run_launch(Launch& L, int workers, char* err, unsigned long long errlen) {
    SanitizerSignals signals(L.sanitize);
    try {
        if (L.mode == FIBERS && !XT_HAVE_ASM_SWITCH) L.mode = UCONTEXT;
        L.nblocks = (long long)L.grid.x * L.grid.y * L.grid.z;
        if (L.nblocks == 0) return 0;
        if (workers < 1) workers = 1;
        if (workers > L.nblocks) workers = (int)L.nblocks;
        std::lock_guard<std::mutex> one_launch_at_a_time(g_pool->launch_mu);
        g_pool->run(&L, workers - 1);
    } catch (std::exception& e) {
        set_error(&L, std::string("emulator error: ") + e.what());
    }
    if (!L.failed) return 0;
    std::snprintf(err, errlen, "%s", L.error.c_str());
    return 1;
}

}  // namespace xt

// ---------------------------------------------------------------- the C interface
using namespace xt;

XT_EXPORT void xt_syncthreads(int line) { syncthreads(line); }

XT_EXPORT unsigned long long xt_warp_op(int line, int op, unsigned long long value, int arg, int width) {
    return warp_op(line, (Op)op, value, arg, width);
}

XT_EXPORT char* xt_shared_site(const xt_site_t* site) {
    Worker* w = t_w;
    std::string error;
    {
        std::unique_lock<std::mutex> lock(w->mu, std::defer_lock);
        if (w->L->mode == THREADS && !w->L->fast) lock.lock();  // threads of a block run in parallel
        if ((size_t)site->id >= w->stamp.size()) w->stamp.resize(site->id + 64, 0);
        if (w->stamp[site->id] != w->gen) {  // first thread of this block to reach the declaration
            w->stamp[site->id] = w->gen;
            w->block_static += site->size;
            if (site->offset + site->size > kArena)
                error = "the static __shared__ variables of this library exceed the emulator's 256 KB arena";
            else if (w->block_static > kStaticShared)
                error = "static __shared__ memory of " + std::to_string(w->block_static) +
                        " bytes exceeds CUDA's 48 KB per block (use extern __shared__ for more)";
            else
                std::memset(w->stat + site->offset, 0xFF, site->size);
        }
    }
    if (!error.empty()) fail(error);
    return w->stat + site->offset;
}

XT_EXPORT char* xt_dynamic_shared() { return t_w->dyn; }

// The fragment layout of mma.sync.m16n8k16 (xtrain_mma.h), for Python: operand 0 (A, 8 elements
// a lane), 1 (B, 4) or 2 (C and D, 4); rows[lane * n + i], cols[...] of element i of each lane.
XT_EXPORT int xt_mma_layout(int operand, int* rows, int* cols) {
    const int n = operand == 0 ? 8 : 4;
    if (operand < 0 || operand > 2) return 0;
    for (int lane = 0; lane < 32; lane++)
        for (int i = 0; i < n; i++) {
            int* r = rows + lane * n + i;
            int* c = cols + lane * n + i;
            if (operand == 0) xt::mma_a_rc(lane, i, *r, *c);
            else if (operand == 1) xt::mma_b_rc(lane, i, *r, *c);
            else xt::mma_c_rc(lane, i, *r, *c);
        }
    return n;
}

XT_EXPORT void xt_trap(int line) {
    xt::fail("__trap() on line " + std::to_string(line) + " " + xt::where(xt::t_w));
    std::abort();  // not reached: fail() stops this CUDA thread
}

XT_EXPORT long long xt_clock64() {
    return std::chrono::duration_cast<std::chrono::nanoseconds>(
               std::chrono::steady_clock::now().time_since_epoch()).count();
}

XT_EXPORT int xt_run(const xt_launch_t* in, char* err, unsigned long long errlen) {
    Launch L;
    L.invoke = in->invoke;
    L.fn = in->fn;
    L.args = in->args;
    L.grid = uint3{in->grid[0], in->grid[1], in->grid[2]};
    L.block = uint3{in->block[0], in->block[1], in->block[2]};
    L.shmem = in->shmem;
    L.mode = in->mode;
    L.fast = (in->fast & 1) != 0;
    L.sanitize = (in->fast & 2) != 0;
    if (L.sanitize) { L.fast = false; L.mode = FIBERS; }  // the checks need one thread at a time
    return run_launch(L, in->workers, err, errlen);
}

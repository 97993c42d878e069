// xtrain_cuda_compat.h — the CUDA built-ins for the xtrain CPU emulator.
//
// A .cu file is compiled by g++ with `-include xtrain_cuda_compat.h`, so kernel sources need
// no special include. This header is kept light (it is compiled with every kernel); it holds
//   * the CUDA keywords and types (__global__, dim3, threadIdx, float4, ...),
//   * device math, atomics and __nv_bfloat16,
//   * barriers and warp operations, which call into the emulator runtime
//     (xtrain_emulator_runtime.h, compiled once into its own shared library),
//   * the tensor-core instruction mma.sync (xtrain_mma.h; the emulator turns a kernel's inline
//     PTX into a call of it),
//   * the launcher template that unpacks `void** args` by the kernel's parameter types.
// Python (xtrain_lessons/cuda/emulator.py) rewrites `__shared__` declarations into
// xt_shared_* calls and appends one extern "C" launcher per kernel.
#pragma once

#include <cassert>
#include <cfloat>
#include <climits>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <cmath>
#include <type_traits>
#include <utility>

// CUDA's math functions are global overloads for float and double. <math.h> would give them,
// but in C++20 it also puts std::lerp, std::beta, ... in the global namespace, so a kernel that
// defines its own lerp would not compile (it does with nvcc). Bring in the math functions only.
using std::abs; using std::fabs; using std::sqrt; using std::cbrt; using std::exp; using std::exp2;
using std::expm1; using std::log; using std::log2; using std::log10; using std::log1p; using std::pow;
using std::sin; using std::cos; using std::tan; using std::asin; using std::acos; using std::atan;
using std::atan2; using std::sinh; using std::cosh; using std::tanh; using std::asinh; using std::acosh;
using std::atanh; using std::floor; using std::ceil; using std::round; using std::trunc; using std::rint;
using std::nearbyint; using std::lround; using std::llround; using std::lrint; using std::llrint;
using std::fmod; using std::remainder; using std::remquo; using std::fmin; using std::fmax; using std::fma;
using std::hypot; using std::erf; using std::erfc; using std::tgamma; using std::lgamma; using std::copysign;
using std::ldexp; using std::frexp; using std::modf; using std::scalbn; using std::ilogb; using std::logb;
using std::nextafter; using std::fdim; using std::isnan; using std::isinf; using std::isfinite;
using std::signbit;

// ---------------------------------------------------------------- keywords
#define __global__
#define __device__
#define __host__
#define __forceinline__ inline __attribute__((always_inline))
#define __noinline__ __attribute__((noinline))
#define __launch_bounds__(...)
#define __align__(n) __attribute__((aligned(n)))
#define __constant__
#define __managed__
// The emulator rewrites `__shared__ T name[N];` and `extern __shared__ T name[];` before
// compiling; any __shared__ left over is a form it does not understand.
#define __shared__ static_assert(false, "xtrain emulator: unsupported __shared__ declaration; write one variable per statement, e.g. __shared__ float tile[16][16];");
// __restrict__ is already a g++ keyword.

// ---------------------------------------------------------------- vector types
struct uint3 { unsigned int x, y, z; };
struct dim3 {
    unsigned int x, y, z;
    constexpr dim3(unsigned int x_ = 1, unsigned int y_ = 1, unsigned int z_ = 1) : x(x_), y(y_), z(z_) {}
    constexpr dim3(uint3 v) : x(v.x), y(v.y), z(v.z) {}
};
struct __attribute__((aligned(8))) float2 { float x, y; };
struct float3 { float x, y, z; };
struct __attribute__((aligned(16))) float4 { float x, y, z, w; };
struct __attribute__((aligned(8))) int2 { int x, y; };
struct int3 { int x, y, z; };
struct __attribute__((aligned(16))) int4 { int x, y, z, w; };
struct __attribute__((aligned(8))) uint2 { unsigned int x, y; };
struct __attribute__((aligned(16))) uint4 { unsigned int x, y, z, w; };
struct __attribute__((aligned(16))) double2 { double x, y; };
inline float2 make_float2(float x, float y) { return {x, y}; }
inline float3 make_float3(float x, float y, float z) { return {x, y, z}; }
inline float4 make_float4(float x, float y, float z, float w) { return {x, y, z, w}; }
inline int2 make_int2(int x, int y) { return {x, y}; }
inline int4 make_int4(int x, int y, int z, int w) { return {x, y, z, w}; }
inline uint3 make_uint3(unsigned x, unsigned y, unsigned z) { return {x, y, z}; }
inline int3 make_int3(int x, int y, int z) { return {x, y, z}; }
inline uint2 make_uint2(unsigned x, unsigned y) { return {x, y}; }
inline uint4 make_uint4(unsigned x, unsigned y, unsigned z, unsigned w) { return {x, y, z, w}; }
inline double2 make_double2(double x, double y) { return {x, y}; }
static constexpr int warpSize = 32;

// ---------------------------------------------------------------- math
inline float __expf(float x) { return expf(x); }
inline float __logf(float x) { return logf(x); }
inline float __log2f(float x) { return log2f(x); }
inline float __sinf(float x) { return sinf(x); }
inline float __cosf(float x) { return cosf(x); }
inline float __tanhf(float x) { return tanhf(x); }
inline float __powf(float x, float y) { return powf(x, y); }
inline float __fdividef(float x, float y) { return x / y; }
inline float rsqrtf(float x) { return 1.0f / sqrtf(x); }
inline double rsqrt(double x) { return 1.0 / sqrt(x); }
inline float __frsqrt_rn(float x) { return 1.0f / sqrtf(x); }
inline float __fsqrt_rn(float x) { return sqrtf(x); }
inline float __frcp_rn(float x) { return 1.0f / x; }
inline float __saturatef(float x) { return fminf(fmaxf(x, 0.0f), 1.0f); }
inline float __fmaf_rn(float a, float b, float c) { return fmaf(a, b, c); }
inline float __fadd_rn(float a, float b) { return a + b; }
inline float __fsub_rn(float a, float b) { return a - b; }
inline float __fmul_rn(float a, float b) { return a * b; }
inline int __float2int_rn(float x) { return (int)nearbyintf(x); }
inline int __float2int_rz(float x) { return (int)x; }
inline int __float_as_int(float x) { int r; std::memcpy(&r, &x, 4); return r; }
inline unsigned int __float_as_uint(float x) { unsigned r; std::memcpy(&r, &x, 4); return r; }
inline float __int_as_float(int x) { float r; std::memcpy(&r, &x, 4); return r; }
inline float __uint_as_float(unsigned x) { float r; std::memcpy(&r, &x, 4); return r; }
inline long long __double_as_longlong(double x) { long long r; std::memcpy(&r, &x, 8); return r; }
inline double __longlong_as_double(long long x) { double r; std::memcpy(&r, &x, 8); return r; }
inline int __popc(unsigned x) { return __builtin_popcount(x); }
inline int __popcll(unsigned long long x) { return __builtin_popcountll(x); }
inline int __clz(int x) { return x == 0 ? 32 : __builtin_clz((unsigned)x); }
inline int __ffs(int x) { return __builtin_ffs(x); }
// A checked shared-memory element (sanitizer mode) stands for its value type.
namespace xt { template <class T> struct unproxy { using type = T; }; }
template <class T> using xt_value_t = typename xt::unproxy<T>::type;
// CUDA's min/max accept mixed argument types (int and unsigned, float and int, ...).
template <class A, class B> inline std::common_type_t<xt_value_t<A>, xt_value_t<B>> min(A a, B b) {
    using C = std::common_type_t<xt_value_t<A>, xt_value_t<B>>; return (C)b < (C)a ? (C)b : (C)a;
}
template <class A, class B> inline std::common_type_t<xt_value_t<A>, xt_value_t<B>> max(A a, B b) {
    using C = std::common_type_t<xt_value_t<A>, xt_value_t<B>>; return (C)a < (C)b ? (C)b : (C)a;
}
// Loads and stores with a cache hint (read-only, streaming, ...): plain accesses here.
template <class T> inline T __ldg(const T* p) { return *p; }
template <class T> inline T __ldcg(const T* p) { return *p; }
template <class T> inline T __ldca(const T* p) { return *p; }
template <class T> inline T __ldcs(const T* p) { return *p; }
template <class T> inline T __ldlu(const T* p) { return *p; }
template <class T> inline T __ldcv(const T* p) { return *p; }
template <class T> inline void __stwb(T* p, std::type_identity_t<T> v) { *p = v; }
template <class T> inline void __stcg(T* p, std::type_identity_t<T> v) { *p = v; }
template <class T> inline void __stcs(T* p, std::type_identity_t<T> v) { *p = v; }
template <class T> inline void __stwt(T* p, std::type_identity_t<T> v) { *p = v; }

// ---------------------------------------------------------------- atomics
// Only the overloads nvcc accepts. Fibers of one block share an OS thread, but blocks run
// in parallel, so these are real atomics.
#define XT_ATOMIC_INT(T)                                                                        \
    inline T atomicAdd(T* a, T v) { return __atomic_fetch_add(a, v, __ATOMIC_RELAXED); }        \
    inline T atomicExch(T* a, T v) { return __atomic_exchange_n(a, v, __ATOMIC_RELAXED); }      \
    inline T atomicAnd(T* a, T v) { return __atomic_fetch_and(a, v, __ATOMIC_RELAXED); }        \
    inline T atomicOr(T* a, T v) { return __atomic_fetch_or(a, v, __ATOMIC_RELAXED); }          \
    inline T atomicXor(T* a, T v) { return __atomic_fetch_xor(a, v, __ATOMIC_RELAXED); }        \
    inline T atomicCAS(T* a, T expected, T desired) {                                           \
        __atomic_compare_exchange_n(a, &expected, desired, false, __ATOMIC_RELAXED, __ATOMIC_RELAXED); \
        return expected;                                                                        \
    }                                                                                           \
    inline T atomicMax(T* a, T v) {                                                             \
        T old = __atomic_load_n(a, __ATOMIC_RELAXED);                                           \
        while (old < v && !__atomic_compare_exchange_n(a, &old, v, true, __ATOMIC_RELAXED, __ATOMIC_RELAXED)) {} \
        return old;                                                                             \
    }                                                                                           \
    inline T atomicMin(T* a, T v) {                                                             \
        T old = __atomic_load_n(a, __ATOMIC_RELAXED);                                           \
        while (v < old && !__atomic_compare_exchange_n(a, &old, v, true, __ATOMIC_RELAXED, __ATOMIC_RELAXED)) {} \
        return old;                                                                             \
    }
XT_ATOMIC_INT(int)
XT_ATOMIC_INT(unsigned int)
XT_ATOMIC_INT(unsigned long long)
#undef XT_ATOMIC_INT
#define XT_ATOMIC_MINMAX(T)                                                                     \
    inline T atomicMax(T* a, T v) {                                                             \
        T old = __atomic_load_n(a, __ATOMIC_RELAXED);                                           \
        while (old < v && !__atomic_compare_exchange_n(a, &old, v, true, __ATOMIC_RELAXED, __ATOMIC_RELAXED)) {} \
        return old;                                                                             \
    }                                                                                           \
    inline T atomicMin(T* a, T v) {                                                             \
        T old = __atomic_load_n(a, __ATOMIC_RELAXED);                                           \
        while (v < old && !__atomic_compare_exchange_n(a, &old, v, true, __ATOMIC_RELAXED, __ATOMIC_RELAXED)) {} \
        return old;                                                                             \
    }
XT_ATOMIC_MINMAX(long long)
#undef XT_ATOMIC_MINMAX
inline unsigned short atomicCAS(unsigned short* a, unsigned short expected, unsigned short desired) {
    __atomic_compare_exchange_n(a, &expected, desired, false, __ATOMIC_RELAXED, __ATOMIC_RELAXED);
    return expected;
}
// atomicInc: old >= limit ? 0 : old + 1; atomicDec: old == 0 || old > limit ? limit : old - 1.
inline unsigned atomicInc(unsigned* a, unsigned limit) {
    unsigned old = __atomic_load_n(a, __ATOMIC_RELAXED);
    while (!__atomic_compare_exchange_n(a, &old, old >= limit ? 0u : old + 1u, true, __ATOMIC_RELAXED, __ATOMIC_RELAXED)) {}
    return old;
}
inline unsigned atomicDec(unsigned* a, unsigned limit) {
    unsigned old = __atomic_load_n(a, __ATOMIC_RELAXED);
    while (!__atomic_compare_exchange_n(a, &old, (old == 0u || old > limit) ? limit : old - 1u, true, __ATOMIC_RELAXED,
                                        __ATOMIC_RELAXED)) {}
    return old;
}
inline int atomicSub(int* a, int v) { return __atomic_fetch_sub(a, v, __ATOMIC_RELAXED); }
inline unsigned atomicSub(unsigned* a, unsigned v) { return __atomic_fetch_sub(a, v, __ATOMIC_RELAXED); }
// Floating-point atomics: compare-and-swap on the bits.
template <class F, class I> inline F xt_atomic_float_add(F* a, F v) {
    I* p = reinterpret_cast<I*>(a);
    I old = __atomic_load_n(p, __ATOMIC_RELAXED), next;
    F f;
    do {
        std::memcpy(&f, &old, sizeof(F));
        F sum = f + v;
        std::memcpy(&next, &sum, sizeof(F));
    } while (!__atomic_compare_exchange_n(p, &old, next, true, __ATOMIC_RELAXED, __ATOMIC_RELAXED));
    return f;
}
inline float atomicAdd(float* a, float v) { return xt_atomic_float_add<float, uint32_t>(a, v); }
inline double atomicAdd(double* a, double v) { return xt_atomic_float_add<double, uint64_t>(a, v); }
inline float atomicExch(float* a, float v) {
    return __uint_as_float(__atomic_exchange_n(reinterpret_cast<uint32_t*>(a), __float_as_uint(v), __ATOMIC_RELAXED));
}
inline void __threadfence() { __atomic_thread_fence(__ATOMIC_SEQ_CST); }
inline void __threadfence_block() { __atomic_signal_fence(__ATOMIC_SEQ_CST); }

// ---------------------------------------------------------------- bfloat16
namespace xt {
// float -> bf16, round to nearest even; NaN stays NaN (CUDA returns the canonical 0x7FFF).
inline unsigned short float_to_bf16_bits(float f) {
    uint32_t u; std::memcpy(&u, &f, 4);
    if ((u & 0x7fffffffu) > 0x7f800000u) return 0x7fff;
    u += 0x7fffu + ((u >> 16) & 1u);
    return (unsigned short)(u >> 16);
}
inline float bf16_bits_to_float(unsigned short b) {
    uint32_t u = (uint32_t)b << 16; float f; std::memcpy(&f, &u, 4); return f;
}
}  // namespace xt

struct __nv_bfloat16 {
    unsigned short __x;
    __nv_bfloat16() = default;
    __nv_bfloat16(float f) : __x(xt::float_to_bf16_bits(f)) {}
    __nv_bfloat16(double d) : __x(xt::float_to_bf16_bits((float)d)) {}
    __nv_bfloat16(int i) : __x(xt::float_to_bf16_bits((float)i)) {}
    operator float() const { return xt::bf16_bits_to_float(__x); }
};
typedef __nv_bfloat16 nv_bfloat16;
inline __nv_bfloat16 __float2bfloat16(float f) { __nv_bfloat16 r; r.__x = xt::float_to_bf16_bits(f); return r; }
inline __nv_bfloat16 __float2bfloat16_rn(float f) { return __float2bfloat16(f); }
inline float __bfloat162float(__nv_bfloat16 b) { return xt::bf16_bits_to_float(b.__x); }
inline unsigned short __bfloat16_as_ushort(__nv_bfloat16 b) { return b.__x; }
inline __nv_bfloat16 __ushort_as_bfloat16(unsigned short x) { __nv_bfloat16 r; r.__x = x; return r; }
// Arithmetic on __nv_bfloat16 (and __nv_bfloat162, __half, half2): xtrain_half.h.


// ---------------------------------------------------------------- the runtime interface
// Implemented in xtrain_emulator_runtime.h (one shared library for all kernels).
enum xt_op : int { XT_SYNCWARP = 1, XT_SHFL, XT_SHFL_UP, XT_SHFL_DOWN, XT_SHFL_XOR, XT_BALLOT, XT_ANY, XT_ALL, XT_ACTIVE,
                   XT_COLLECTIVE };
// A warp-collective instruction (xtrain_mma.h): each lane's warp-op value points at a struct that
// starts with this header; the runtime calls `run` once with the 32 lanes' pointers, lane order.
struct xt_collective_t { int (*run)(void* const* lanes, char* err, unsigned long long errlen); const char* name; };
struct xt_tls_t { uint3 tid, bid, bdim, gdim; };
struct xt_launch_t {
    void (*invoke)(void (*)(), void**);  // calls fn with the unpacked args
    void (*fn)();
    void** args;
    unsigned grid[3], block[3];
    unsigned long long shmem;
    int mode, workers, fast;
};
struct xt_site_t { unsigned long long offset, size; int id; };  // one static __shared__ declaration
// Sanitizer mode: a __shared__ declaration's name, element size and extents (ext[0] < 0: the
// dynamic array, whose extent is the launch's shared_mem).
struct xt_sinfo { const char* name; unsigned elem; int nd; long long ext[4]; };
extern "C" {
extern __thread xt_tls_t xt_tls;
void xt_syncthreads(int line);
unsigned long long xt_warp_op(int line, int op, unsigned long long value, int arg, int width);
char* xt_shared_site(const xt_site_t* site);
char* xt_dynamic_shared();
[[noreturn]] void xt_trap(int line);
long long xt_clock64();
int xt_run(const xt_launch_t* launch, char* err, unsigned long long errlen);
}

#define threadIdx (static_cast<const uint3&>(xt_tls.tid))
#define blockIdx (static_cast<const uint3&>(xt_tls.bid))
#define blockDim (static_cast<const uint3&>(xt_tls.bdim))
#define gridDim (static_cast<const uint3&>(xt_tls.gdim))
inline long long clock64() { return xt_clock64(); }
// __trap() stops the kernel with a KernelError naming the block, thread and line.
#define __trap() xt_trap(__LINE__)

// Macros, so that the scheduler can name the source line a thread waits at.
#define __syncthreads() xt_syncthreads(__LINE__)
#define __syncwarp(...) ((void)xt_warp_op(__LINE__, XT_SYNCWARP, 0, 0, 32))
#define __shfl_sync(mask, var, lane, ...) xt::shfl(__LINE__, XT_SHFL, (var), (lane), xt::width_or_32(__VA_ARGS__))
#define __shfl_up_sync(mask, var, delta, ...) xt::shfl(__LINE__, XT_SHFL_UP, (var), (delta), xt::width_or_32(__VA_ARGS__))
#define __shfl_down_sync(mask, var, delta, ...) xt::shfl(__LINE__, XT_SHFL_DOWN, (var), (delta), xt::width_or_32(__VA_ARGS__))
#define __shfl_xor_sync(mask, var, lanemask, ...) xt::shfl(__LINE__, XT_SHFL_XOR, (var), (lanemask), xt::width_or_32(__VA_ARGS__))
#define __ballot_sync(mask, pred) ((unsigned)xt_warp_op(__LINE__, XT_BALLOT, (pred) != 0, 0, 32))
#define __any_sync(mask, pred) ((int)xt_warp_op(__LINE__, XT_ANY, (pred) != 0, 0, 32))
#define __all_sync(mask, pred) ((int)xt_warp_op(__LINE__, XT_ALL, (pred) != 0, 0, 32))
#define __activemask() ((unsigned)xt_warp_op(__LINE__, XT_ACTIVE, 1, 0, 32))

namespace xt {
inline int width_or_32() { return 32; }
inline int width_or_32(int w) { return w; }

template <class P> inline xt_value_t<P> shfl(int line, int op, P given, int arg, int width) {
    using T = xt_value_t<P>;
    T var = given;
    static_assert(sizeof(T) <= 8 && std::is_trivially_copyable_v<T>, "warp shuffle of a type wider than 8 bytes");
    unsigned long long bits = 0;
    std::memcpy(&bits, &var, sizeof(T));
    bits = xt_warp_op(line, op, bits, arg, width);
    std::memcpy(&var, &bits, sizeof(T));
    return var;
}

// Static __shared__ declarations: an offset in the block's arena, reserved once per declaration
// (the rewritten source keeps the site in a function-local static).
static unsigned long long site_used = 0;
static int site_count = 0;
inline xt_site_t new_site(unsigned long long size, unsigned long long align) {
    static int lock = 0;
    while (__atomic_exchange_n(&lock, 1, __ATOMIC_ACQUIRE)) {}
    if (align < 16) align = 16;
    xt_site_t s{(site_used + align - 1) / align * align, size, site_count++};
    site_used = s.offset + size;
    __atomic_store_n(&lock, 0, __ATOMIC_RELEASE);
    return s;
}

template <class... A, size_t... I>
inline void call_with(void (*f)(A...), void** args, std::index_sequence<I...>) {
    f(*static_cast<std::remove_cv_t<A>*>(args[I])...);
}
template <class... A> void invoke_kernel(void (*fn)(), void** args) {
    call_with(reinterpret_cast<void (*)(A...)>(fn), args, std::index_sequence_for<A...>{});
}

// Launch f the way cudaLaunchKernel does: args[i] points to the value of parameter i.
template <class... A>
int launch(void (*f)(A...), const unsigned* grid, const unsigned* block, unsigned long long shmem, void** args,
           int mode, int workers, int fast, char* err, unsigned long long errlen) {
    xt_launch_t L{&invoke_kernel<A...>, reinterpret_cast<void (*)()>(f), args,
                  {grid[0], grid[1], grid[2]}, {block[0], block[1], block[2]}, shmem, mode, workers, fast};
    return xt_run(&L, err, errlen);
}

// Parameter types as codes for Python: f4 float, i4 int, u8 unsigned long long, bf16,
// *f4 float*, c*f4 const float*, *v void*, ?N an N-byte struct.
template <class T> inline void type_code(char* out) {
    if constexpr (std::is_pointer_v<T>) {
        using P = std::remove_pointer_t<T>;
        std::strcat(out, std::is_const_v<P> ? "c*" : "*");
        if constexpr (std::is_void_v<std::remove_cv_t<P>>) std::strcat(out, "v");
        else type_code<std::remove_cv_t<P>>(out);
    } else {
        char code[16];
        if constexpr (std::is_same_v<T, __nv_bfloat16>) std::snprintf(code, sizeof code, "bf16");
        else if constexpr (std::is_same_v<T, bool>) std::snprintf(code, sizeof code, "b1");
        else if constexpr (std::is_floating_point_v<T>) std::snprintf(code, sizeof code, "f%zu", sizeof(T));
        else if constexpr (std::is_integral_v<T>) std::snprintf(code, sizeof code, "%c%zu", std::is_signed_v<T> ? 'i' : 'u', sizeof(T));
        else std::snprintf(code, sizeof code, "?%zu", sizeof(T));
        std::strcat(out, code);
    }
}
template <class... A> const char* signature(void (*)(A...)) {
    static char buf[1024];
    if (!buf[0]) {
        int k = 0;
        ((std::strcat(buf, k++ ? "," : ""), type_code<A>(buf)), ...);
    }
    return buf;
}
}  // namespace xt

#include "xtrain_half.h"
#include "xtrain_mma.h"

#ifdef XT_SANITIZE
#include "xtrain_sanitizer.h"
#endif

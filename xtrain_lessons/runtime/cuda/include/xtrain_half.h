// xtrain_half.h — __half / half2 (cuda_fp16.h) and __nv_bfloat162 (cuda_bf16.h) for the emulator.
//
// Storage is the 16 bits, as on a GPU. Arithmetic is done in float and rounded once to the
// 16-bit type: float has 24 bits of precision, at least 2p + 2 for both half (p = 11) and
// bfloat16 (p = 8), so rounding twice (to float, then to 16 bits) gives the correctly rounded
// result of +, -, *, / — what the GPU's half instructions compute. Conversions from float
// round to nearest even, in integer arithmetic (g++ before 12 has no _Float16 on x86-64).
#pragma once

namespace xt {
inline unsigned short float_to_half_bits(float f) {
    uint32_t x;
    std::memcpy(&x, &f, 4);
    const uint32_t sign = (x >> 16) & 0x8000u, a = x & 0x7fffffffu;
    if (a > 0x7f800000u) return 0x7fff;                  // NaN: CUDA's canonical NaN
    if (a >= 0x477ff000u) return (unsigned short)(sign | 0x7c00u);  // >= 65520 rounds to infinity
    if (a < 0x38800000u) {                               // below 2^-14: a subnormal half
        float v;
        std::memcpy(&v, &a, 4);
        return (unsigned short)(sign | (uint32_t)nearbyintf(v * 16777216.0f));  // units of 2^-24, exact scaling
    }
    uint32_t h = ((((a >> 23) - 112u) << 10) | ((a & 0x7fffffu) >> 13));   // rebias 127 -> 15
    const uint32_t rest = a & 0x1fffu;
    if (rest > 0x1000u || (rest == 0x1000u && (h & 1u))) h++;   // to nearest even; a carry is right
    return (unsigned short)(sign | h);
}
inline float half_bits_to_float(unsigned short h) {
    const uint32_t sign = (uint32_t)(h & 0x8000u) << 16, e = (h >> 10) & 0x1fu, m = h & 0x3ffu;
    if (e == 0) { float v = (float)m * 5.9604644775390625e-8f; return sign ? -v : v; }  // m * 2^-24
    uint32_t x = sign | (e == 31 ? 0x7f800000u | (m << 13) : ((e + 112u) << 23) | (m << 13));
    float f;
    std::memcpy(&f, &x, 4);
    return f;
}
}  // namespace xt

struct __half {
    unsigned short __x;
    __half() = default;
    __half(float f) : __x(xt::float_to_half_bits(f)) {}
    __half(double d) : __x(xt::float_to_half_bits((float)d)) {}
    __half(int i) : __x(xt::float_to_half_bits((float)i)) {}
    operator float() const { return xt::half_bits_to_float(__x); }
};
typedef __half half;
struct __attribute__((aligned(4))) __half2 { __half x, y; };
typedef __half2 half2;

inline __half __float2half(float f) { return __half(f); }
inline __half __float2half_rn(float f) { return __half(f); }
inline __half __double2half(double d) { return __half(d); }
inline float __half2float(__half h) { return (float)h; }
inline __half __int2half_rn(int i) { return __half((float)i); }
inline int __half2int_rz(__half h) { return (int)(float)h; }
inline int __half2int_rn(__half h) { return (int)nearbyintf((float)h); }
inline unsigned short __half_as_ushort(__half h) { return h.__x; }
inline __half __ushort_as_half(unsigned short x) { __half h; h.__x = x; return h; }
inline short __half_as_short(__half h) { return (short)h.__x; }
inline __half __short_as_half(short x) { __half h; h.__x = (unsigned short)x; return h; }

inline __nv_bfloat16 __double2bfloat16(double d) { return __float2bfloat16((float)d); }
inline __nv_bfloat16 __int2bfloat16_rn(int i) { return __float2bfloat16((float)i); }
struct __attribute__((aligned(4))) __nv_bfloat162 { __nv_bfloat16 x, y; };
typedef __nv_bfloat162 nv_bfloat162;

// One set of operations per 16-bit type H (and its pair H2).
#define XT_HALF_OPS(H, H2, FROM)                                                                      \
    inline H operator+(H a, H b) { return FROM((float)a + (float)b); }                                \
    inline H operator-(H a, H b) { return FROM((float)a - (float)b); }                                \
    inline H operator*(H a, H b) { return FROM((float)a * (float)b); }                                \
    inline H operator/(H a, H b) { return FROM((float)a / (float)b); }                                \
    inline H operator-(H a) { H r = a; r.__x ^= 0x8000; return r; }                                   \
    inline H& operator+=(H& a, H b) { return a = a + b; }                                             \
    inline H& operator-=(H& a, H b) { return a = a - b; }                                             \
    inline H& operator*=(H& a, H b) { return a = a * b; }                                             \
    inline H& operator/=(H& a, H b) { return a = a / b; }                                             \
    inline bool operator==(H a, H b) { return (float)a == (float)b; }                                 \
    inline bool operator!=(H a, H b) { return (float)a != (float)b; }                                 \
    inline bool operator<(H a, H b) { return (float)a < (float)b; }                                   \
    inline bool operator<=(H a, H b) { return (float)a <= (float)b; }                                 \
    inline bool operator>(H a, H b) { return (float)a > (float)b; }                                   \
    inline bool operator>=(H a, H b) { return (float)a >= (float)b; }                                 \
    inline H __hadd(H a, H b) { return a + b; }                                                       \
    inline H __hsub(H a, H b) { return a - b; }                                                       \
    inline H __hmul(H a, H b) { return a * b; }                                                       \
    inline H __hdiv(H a, H b) { return a / b; }                                                       \
    inline H __hneg(H a) { return -a; }                                                               \
    inline H __habs(H a) { H r = a; r.__x &= 0x7fff; return r; }                                      \
    inline H __hfma(H a, H b, H c) { return FROM((float)((double)(float)a * (float)b + (float)c)); } \
    inline H __hmax(H a, H b) { return (float)a < (float)b ? b : a; }                                 \
    inline H __hmin(H a, H b) { return (float)b < (float)a ? b : a; }                                 \
    inline bool __heq(H a, H b) { return a == b; }                                                    \
    inline bool __hne(H a, H b) { return a != b; }                                                    \
    inline bool __hlt(H a, H b) { return a < b; }                                                     \
    inline bool __hle(H a, H b) { return a <= b; }                                                    \
    inline bool __hgt(H a, H b) { return a > b; }                                                     \
    inline bool __hge(H a, H b) { return a >= b; }                                                    \
    inline bool __hisnan(H a) { return (float)a != (float)a; }                                        \
    inline H2 operator+(H2 a, H2 b) { return {a.x + b.x, a.y + b.y}; }                                \
    inline H2 operator-(H2 a, H2 b) { return {a.x - b.x, a.y - b.y}; }                                \
    inline H2 operator*(H2 a, H2 b) { return {a.x * b.x, a.y * b.y}; }                                \
    inline H2 operator/(H2 a, H2 b) { return {a.x / b.x, a.y / b.y}; }                                \
    inline H2& operator+=(H2& a, H2 b) { return a = a + b; }                                          \
    inline H2& operator*=(H2& a, H2 b) { return a = a * b; }                                          \
    inline H2 __hadd2(H2 a, H2 b) { return a + b; }                                                   \
    inline H2 __hsub2(H2 a, H2 b) { return a - b; }                                                   \
    inline H2 __hmul2(H2 a, H2 b) { return a * b; }                                                   \
    inline H2 __h2div(H2 a, H2 b) { return a / b; }                                                   \
    inline H2 __hfma2(H2 a, H2 b, H2 c) { return {__hfma(a.x, b.x, c.x), __hfma(a.y, b.y, c.y)}; }    \
    inline H2 __hneg2(H2 a) { return {-a.x, -a.y}; }                                                  \
    inline H2 __hmax2(H2 a, H2 b) { return {__hmax(a.x, b.x), __hmax(a.y, b.y)}; }                    \
    inline H2 __hmin2(H2 a, H2 b) { return {__hmin(a.x, b.x), __hmin(a.y, b.y)}; }                    \
    inline float __low2float(H2 a) { return (float)a.x; }                                             \
    inline float __high2float(H2 a) { return (float)a.y; }                                            \
    inline float2 xt_pair_to_float2(H2 a) { return {(float)a.x, (float)a.y}; }

XT_HALF_OPS(__half, __half2, __float2half)
XT_HALF_OPS(__nv_bfloat16, __nv_bfloat162, __float2bfloat16)
#undef XT_HALF_OPS

inline __half2 make_half2(__half x, __half y) { return {x, y}; }
inline __half2 __halves2half2(__half x, __half y) { return {x, y}; }
inline __half2 __half2half2(__half x) { return {x, x}; }
inline __half2 __floats2half2_rn(float x, float y) { return {__half(x), __half(y)}; }
inline __half2 __float2half2_rn(float x) { return {__half(x), __half(x)}; }
inline __half2 __float22half2_rn(float2 f) { return {__half(f.x), __half(f.y)}; }
inline float2 __half22float2(__half2 h) { return xt_pair_to_float2(h); }
inline __half __low2half(__half2 h) { return h.x; }
inline __half __high2half(__half2 h) { return h.y; }
inline __half2 __lows2half2(__half2 a, __half2 b) { return {a.x, b.x}; }
inline __half2 __highs2half2(__half2 a, __half2 b) { return {a.y, b.y}; }

inline __nv_bfloat162 make_bfloat162(__nv_bfloat16 x, __nv_bfloat16 y) { return {x, y}; }
inline __nv_bfloat162 __halves2bfloat162(__nv_bfloat16 x, __nv_bfloat16 y) { return {x, y}; }
inline __nv_bfloat162 __bfloat162bfloat162(__nv_bfloat16 x) { return {x, x}; }
inline __nv_bfloat162 __floats2bfloat162_rn(float x, float y) { return {__float2bfloat16(x), __float2bfloat16(y)}; }
inline __nv_bfloat162 __float2bfloat162_rn(float x) { return {__float2bfloat16(x), __float2bfloat16(x)}; }
inline __nv_bfloat162 __float22bfloat162_rn(float2 f) { return {__float2bfloat16(f.x), __float2bfloat16(f.y)}; }
inline float2 __bfloat1622float2(__nv_bfloat162 h) { return xt_pair_to_float2(h); }
inline __nv_bfloat16 __low2bfloat16(__nv_bfloat162 h) { return h.x; }
inline __nv_bfloat16 __high2bfloat16(__nv_bfloat162 h) { return h.y; }

// Atomic adds on 16-bit floats and their pairs (sm_60+ for __half2, sm_70+ __half, sm_80+ the
// bfloat16 ones, as on a GPU): a compare-and-swap loop on the bits; the pair is swapped as one
// 32-bit word (a GPU only promises each half to be atomic: stronger here, never weaker).
template <class H, class Bits, class Add> inline H xt_atomic_bits_add(H* a, Add add) {
    static_assert(sizeof(H) == sizeof(Bits), "xt_atomic_bits_add: size mismatch");
    Bits* p = reinterpret_cast<Bits*>(a);
    Bits old = __atomic_load_n(p, __ATOMIC_RELAXED), next;
    H cur;
    do {
        std::memcpy(&cur, &old, sizeof(H));
        H sum = add(cur);
        std::memcpy(&next, &sum, sizeof(H));
    } while (!__atomic_compare_exchange_n(p, &old, next, true, __ATOMIC_RELAXED, __ATOMIC_RELAXED));
    return cur;
}
inline __nv_bfloat16 atomicAdd(__nv_bfloat16* a, __nv_bfloat16 v) {
    return xt_atomic_bits_add<__nv_bfloat16, unsigned short>(a, [v](__nv_bfloat16 x) { return x + v; });
}
inline __nv_bfloat162 atomicAdd(__nv_bfloat162* a, __nv_bfloat162 v) {
    return xt_atomic_bits_add<__nv_bfloat162, uint32_t>(a, [v](__nv_bfloat162 x) { return x + v; });
}
inline __half atomicAdd(__half* a, __half v) {
    return xt_atomic_bits_add<__half, unsigned short>(a, [v](__half x) { return x + v; });
}
inline __half2 atomicAdd(__half2* a, __half2 v) {
    return xt_atomic_bits_add<__half2, uint32_t>(a, [v](__half2 x) { return x + v; });
}

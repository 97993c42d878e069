// xtrain_sanitizer.h — checked views of __shared__ memory, for the emulator's sanitizer mode.
//
// Compiled in only with -DXT_SANITIZE (Kernel(..., sanitize=True)). The emulator then rewrites
// `__shared__ float tile[16][16];` into an `xt::sview<float[16][16]>` and `extern __shared__
// float s[];` into an `xt::sdyn<float>`. Indexing checks the bounds; an element of arithmetic
// type comes back as an `xt::sref`, which tells the runtime whether it is read (converted to
// its value) or written (assigned), so that the runtime can report reads of memory never
// written and two threads touching one address between the same two barriers.
// Global memory needs none of this: its out-of-bounds accesses fault on guard pages.
// Memory reached through a plain pointer (`float* p = tile[0];`, `&s[i]`) is not checked.
#pragma once

extern "C" {
void xt_san_shared(const void* addr, unsigned size, int write, const void* base, const xt_sinfo* info);
void xt_san_shared_oob(const void* base, const xt_sinfo* info, const void* sub, int depth, long long i);
void xt_san_shared_escape(const void* addr, unsigned long long bytes);
unsigned long long xt_dynamic_shared_bytes();
}

namespace xt {
// Where an element lives: the declaration (info) and the start of its variable (base). Views
// carry three pointers; the indices for a report are recomputed from the address.
template <class A> constexpr xt_sinfo sinfo(const char* name) {
    xt_sinfo s{name, (unsigned)sizeof(std::remove_all_extents_t<A>), (int)std::rank_v<A>, {0, 0, 0, 0}};
    if constexpr (std::rank_v<A> > 0) s.ext[0] = std::extent_v<A, 0>;
    if constexpr (std::rank_v<A> > 1) s.ext[1] = std::extent_v<A, 1>;
    if constexpr (std::rank_v<A> > 2) s.ext[2] = std::extent_v<A, 2>;
    if constexpr (std::rank_v<A> > 3) s.ext[3] = std::extent_v<A, 3>;
    return s;
}

template <class T> struct sref {
    using V = std::remove_cv_t<T>;
    T* p;
    const void* base;
    const xt_sinfo* info;
    void touch(int write) const { xt_san_shared((const void*)p, sizeof(T), write, base, info); }
    operator V() const { touch(0); return *p; }
    sref& operator=(V v) { touch(1); *p = v; return *this; }
    sref& operator=(const sref& o) { return *this = (V)o; }
    T* operator&() const { xt_san_shared_escape((const void*)p, sizeof(T)); return p; }
    template <class U> sref& operator+=(U u) { V v = *this; v += u; return *this = v; }
    template <class U> sref& operator-=(U u) { V v = *this; v -= u; return *this = v; }
    template <class U> sref& operator*=(U u) { V v = *this; v *= u; return *this = v; }
    template <class U> sref& operator/=(U u) { V v = *this; v /= u; return *this = v; }
    template <class U> sref& operator%=(U u) { V v = *this; v %= u; return *this = v; }
    template <class U> sref& operator&=(U u) { V v = *this; v &= u; return *this = v; }
    template <class U> sref& operator|=(U u) { V v = *this; v |= u; return *this = v; }
    template <class U> sref& operator^=(U u) { V v = *this; v ^= u; return *this = v; }
    template <class U> sref& operator<<=(U u) { V v = *this; v <<= u; return *this = v; }
    template <class U> sref& operator>>=(U u) { V v = *this; v >>= u; return *this = v; }
    sref& operator++() { return *this += 1; }
    sref& operator--() { return *this -= 1; }
    V operator++(int) { V v = *this; *this = v + 1; return v; }
    V operator--(int) { V v = *this; *this = v - 1; return v; }
};

// An element: checked proxy for numbers, a plain reference for structs (bounds checked only).
template <class T> inline decltype(auto) selem(T* p, const void* base, const xt_sinfo* info) {
    if constexpr (std::is_arithmetic_v<std::remove_cv_t<T>>) return sref<T>{p, base, info};
    else return (*p);
}

// A static __shared__ array or sub-array: A is its type, e.g. float[16][16] (depth 0) or
// float[16] (depth 1, a row of it).
template <class A> struct sview {
    using Sub = std::remove_extent_t<A>;
    static constexpr long long N = std::extent_v<A>;
    Sub* p;
    const void* base;
    const xt_sinfo* info;
    template <class I> decltype(auto) operator[](I i) const {
        if ((long long)i < 0 || (long long)i >= N) xt_san_shared_oob(base, info, p, info->nd - (int)std::rank_v<A>, (long long)i);
        if constexpr (std::is_array_v<Sub>) return sview<Sub>{p[i], base, info};
        else return selem(&p[i], base, info);
    }
    operator Sub*() const { xt_san_shared_escape((const void*)p, sizeof(A)); return p; }
};

// extern __shared__ T name[]: its extent is the launch's shared_mem bytes.
template <class T> struct sdyn {
    T* p;
    const xt_sinfo* info;
    template <class I> decltype(auto) operator[](I i) const {
        if ((long long)i < 0 || (long long)i >= (long long)(xt_dynamic_shared_bytes() / sizeof(T)))
            xt_san_shared_oob(p, info, p, 0, (long long)i);
        return selem(&p[i], p, info);
    }
    operator T*() const { xt_san_shared_escape((const void*)p, xt_dynamic_shared_bytes()); return p; }
};

// A __shared__ scalar: `__shared__ float total;` becomes a named sref.
template <class T> inline decltype(auto) sscalar(T* p, const xt_sinfo* info) {
    if constexpr (std::is_arithmetic_v<std::remove_cv_t<T>>) return sref<T>{p, p, info};
    else return (*p);
}

template <class T> struct unproxy<sref<T>> { using type = std::remove_cv_t<T>; };
}  // namespace xt

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
void xt_san_shared(const void* addr, unsigned size, int write, const char* name, const long long* idx, int nidx);
void xt_san_shared_oob(const char* name, const long long* idx, int nidx, long long extent);
void xt_san_shared_escape(const void* addr, unsigned long long bytes);
unsigned long long xt_dynamic_shared_bytes();
}

namespace xt {
struct sidx {
    long long v[4] = {0, 0, 0, 0};
    int n = 0;
    sidx with(long long i) const { sidx r = *this; if (r.n < 4) r.v[r.n++] = i; return r; }
};

template <class T> struct sref {
    using V = std::remove_cv_t<T>;
    T* p;
    const char* name;
    sidx ix;
    void touch(int write) const { xt_san_shared((const void*)p, sizeof(T), write, name, ix.v, ix.n); }
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
template <class T> inline decltype(auto) selem(T* p, const char* name, const sidx& ix) {
    if constexpr (std::is_arithmetic_v<std::remove_cv_t<T>>) return sref<T>{p, name, ix};
    else return (*p);
}

template <class I> inline void scheck(I i, long long extent, const char* name, const sidx& ix) {
    if ((long long)i < 0 || (long long)i >= extent) {
        sidx bad = ix.with((long long)i);
        xt_san_shared_oob(name, bad.v, bad.n, extent);
    }
}

// A static __shared__ array (or sub-array): A is the array type, e.g. float[16][16].
template <class A> struct sview {
    using Sub = std::remove_extent_t<A>;
    static constexpr long long N = std::extent_v<A>;
    Sub* p;
    const char* name;
    sidx ix;
    template <class I> decltype(auto) operator[](I i) const {
        scheck(i, N, name, ix);
        if constexpr (std::is_array_v<Sub>) return sview<Sub>{p[i], name, ix.with((long long)i)};
        else return selem(&p[i], name, ix.with((long long)i));
    }
    operator Sub*() const { xt_san_shared_escape((const void*)p, sizeof(A)); return p; }
};

// extern __shared__ T name[]: its extent is the launch's shared_mem bytes.
template <class T> struct sdyn {
    T* p;
    const char* name;
    template <class I> decltype(auto) operator[](I i) const {
        scheck(i, (long long)(xt_dynamic_shared_bytes() / sizeof(T)), name, sidx{});
        return selem(&p[i], name, sidx{}.with((long long)i));
    }
    operator T*() const { xt_san_shared_escape((const void*)p, xt_dynamic_shared_bytes()); return p; }
};

// A __shared__ scalar: `__shared__ float total;` becomes a named sref.
template <class T> inline decltype(auto) sscalar(T* p, const char* name) {
    if constexpr (std::is_arithmetic_v<std::remove_cv_t<T>>) return sref<T>{p, name, sidx{}};
    else return (*p);
}

template <class T> struct unproxy<sref<T>> { using type = std::remove_cv_t<T>; };
}  // namespace xt

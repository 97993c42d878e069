// cooperative_groups.h for the xtrain CPU emulator: the thread block and its warp-sized tiles.
//
// thread_block: sync, thread_rank, size / num_threads, group_index, thread_index, dim_threads.
// thread_block_tile<N> (N a power of 2 up to 32, from tiled_partition<N>(block)): sync, the
// shuffles (shfl, shfl_up, shfl_down, shfl_xor), any, all, ballot, thread_rank,
// meta_group_rank, meta_group_size. reduce(tile, value, op) with plus, less, greater, bit_and,
// bit_or, bit_xor (cooperative_groups/reduce.h). Every call reaches the emulator's barrier or
// warp operation with the line it was called from (__builtin_LINE), so its error reports name
// the user's line.
#pragma once
#include "xtrain_cuda_compat.h"

namespace cooperative_groups {

class thread_block {
  public:
    void sync(int line = __builtin_LINE()) const { xt_syncthreads(line); }
    unsigned thread_rank() const { return threadIdx.x + blockDim.x * (threadIdx.y + blockDim.y * threadIdx.z); }
    unsigned size() const { return blockDim.x * blockDim.y * blockDim.z; }
    unsigned num_threads() const { return size(); }
    dim3 group_index() const { return dim3(blockIdx.x, blockIdx.y, blockIdx.z); }
    dim3 thread_index() const { return dim3(threadIdx.x, threadIdx.y, threadIdx.z); }
    dim3 dim_threads() const { return dim3(blockDim.x, blockDim.y, blockDim.z); }
    dim3 group_dim() const { return dim_threads(); }
};
inline thread_block this_thread_block() { return thread_block(); }
inline void sync(const thread_block& b, int line = __builtin_LINE()) { b.sync(line); }

template <unsigned N> class thread_block_tile {
    static_assert(N >= 1 && N <= 32 && (N & (N - 1)) == 0, "tiled_partition<N>: N must be a power of 2 up to 32");
    static unsigned block_rank() { return this_thread_block().thread_rank(); }
    // this tile's lanes within the warp's ballot
    static unsigned tile_bits(unsigned long long ballot) {
        unsigned shift = (block_rank() % 32) / N * N;
        return (unsigned)(ballot >> shift) & (N == 32 ? 0xffffffffu : ((1u << N) - 1u));
    }

  public:
    void sync(int line = __builtin_LINE()) const { xt_warp_op(line, XT_SYNCWARP, 0, 0, 32); }
    unsigned thread_rank() const { return block_rank() % N; }
    static constexpr unsigned size() { return N; }
    static constexpr unsigned num_threads() { return N; }
    unsigned meta_group_rank() const { return block_rank() / N; }
    unsigned meta_group_size() const { return (this_thread_block().size() + N - 1) / N; }
    template <class T> T shfl(T v, int src, int line = __builtin_LINE()) const {
        return xt::shfl(line, XT_SHFL, v, src, N);
    }
    template <class T> T shfl_up(T v, unsigned d, int line = __builtin_LINE()) const {
        return xt::shfl(line, XT_SHFL_UP, v, d, N);
    }
    template <class T> T shfl_down(T v, unsigned d, int line = __builtin_LINE()) const {
        return xt::shfl(line, XT_SHFL_DOWN, v, d, N);
    }
    template <class T> T shfl_xor(T v, unsigned m, int line = __builtin_LINE()) const {
        return xt::shfl(line, XT_SHFL_XOR, v, m, N);
    }
    unsigned ballot(int pred, int line = __builtin_LINE()) const {
        return tile_bits(xt_warp_op(line, XT_BALLOT, pred != 0, 0, 32));
    }
    bool any(int pred, int line = __builtin_LINE()) const { return ballot(pred, line) != 0; }
    bool all(int pred, int line = __builtin_LINE()) const {
        return ballot(pred, line) == (N == 32 ? 0xffffffffu : ((1u << N) - 1u));
    }
};
template <unsigned N> using thread_block_tile_t = thread_block_tile<N>;

template <unsigned N, class Parent> inline thread_block_tile<N> tiled_partition(const Parent&) { return {}; }

template <class T> struct plus { T operator()(T a, T b) const { return a + b; } };
template <class T> struct less { T operator()(T a, T b) const { return b < a ? b : a; } };
template <class T> struct greater { T operator()(T a, T b) const { return a < b ? b : a; } };
template <class T> struct bit_and { T operator()(T a, T b) const { return a & b; } };
template <class T> struct bit_or { T operator()(T a, T b) const { return a | b; } };
template <class T> struct bit_xor { T operator()(T a, T b) const { return a ^ b; } };

// Every lane of the tile gets the reduction of the tile's values (a butterfly of shfl_xor).
template <unsigned N, class T, class Op>
inline T reduce(const thread_block_tile<N>& tile, T value, Op op, int line = __builtin_LINE()) {
    for (unsigned offset = N / 2; offset > 0; offset /= 2) value = op(value, tile.shfl_xor(value, offset, line));
    return value;
}

}  // namespace cooperative_groups

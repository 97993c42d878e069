// embedding.cu — token embedding lookup (a gather) and its backward (a scatter-add).
//
// Forward: out[t, k] = weight[ids[t], k] for t < n_tokens, k < dim. One thread per output
// element, so consecutive threads copy consecutive floats of one row: coalesced.
// An id outside [0, vocab) writes NaN instead of reading out of bounds (the launcher refuses
// such ids before launching; this is the last line of defence).
//
// Backward: dweight[ids[t], k] += dout[t, k]. When a token occurs twice, two threads add into
// the same element, so the addition must be atomic (atomicAdd). Float atomics complete in any
// order, so the sums may differ from a sequential sum in the last bits from run to run.
// dweight must be zeroed before the launch.
//
// embedding_bwd<T> (the GPU engine's, phase T07b): the same scatter-add with int64 ids (as the
// data loader makes them, checked by the caller — this kernel only skips an id outside
// [0, vocab)), a gradient g of storage type T (float, __nv_bfloat16, __half: loaded into float)
// and a float32 gw; a grid-stride loop, so any grid covers the n_tokens * dim elements.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

extern "C" __global__ void embedding_forward(const int* __restrict__ ids, const float* __restrict__ weight,
                                             float* __restrict__ out, int n_tokens, int vocab, int dim) {
    long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= (long long)n_tokens * dim) return;
    int t = (int)(i / dim), k = (int)(i % dim);
    int id = ids[t];
    if (id < 0 || id >= vocab) {
        out[i] = __int_as_float(0x7fc00000);  // NaN
        return;
    }
    out[i] = weight[(long long)id * dim + k];
}

extern "C" __global__ void embedding_backward(const int* __restrict__ ids, const float* __restrict__ dout,
                                              float* __restrict__ dweight, int n_tokens, int vocab, int dim) {
    long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= (long long)n_tokens * dim) return;
    int t = (int)(i / dim), k = (int)(i % dim);
    int id = ids[t];
    if (id < 0 || id >= vocab) return;
    atomicAdd(&dweight[(long long)id * dim + k], dout[i]);
}

__device__ __forceinline__ float to_float(float v) { return v; }
__device__ __forceinline__ float to_float(__nv_bfloat16 v) { return __bfloat162float(v); }
__device__ __forceinline__ float to_float(__half v) { return __half2float(v); }

// The engine's backward, deterministic: `order` lists the positions sorted by (token id, position),
// so each token's positions form one run. The block at the first position of a run adds the run's
// gradient rows in position order (np.add.at's order, the CPU's) and writes the token's row once:
// no atomics, the same bits on every run. Blocks take sorted positions in a grid-stride loop;
// the other blocks of a run return at once. Rows of tokens that do not occur stay as the caller
// zeroed them.
template <typename T>
__global__ void embedding_bwd(const long long* __restrict__ ids, const long long* __restrict__ order,
                              const T* __restrict__ g, float* __restrict__ gw, long long n_tokens, int vocab,
                              int dim) {
    for (long long i = blockIdx.x; i < n_tokens; i += gridDim.x) {
        const long long id = ids[order[i]];
        if ((i > 0 && ids[order[i - 1]] == id) || id < 0 || id >= vocab) continue;
        for (int k = threadIdx.x; k < dim; k += blockDim.x) {
            float acc = 0.0f;
            for (long long j = i; j < n_tokens && ids[order[j]] == id; ++j) acc += to_float(g[order[j] * dim + k]);
            gw[id * dim + k] = acc;
        }
    }
}

// The instantiations the launcher uses (explicit, so a plain nvcc/NVRTC compile emits them).
template __global__ void embedding_bwd<float>(const long long*, const long long*, const float*, float*, long long,
                                              int, int);
template __global__ void embedding_bwd<__nv_bfloat16>(const long long*, const long long*, const __nv_bfloat16*, float*,
                                                      long long, int, int);
template __global__ void embedding_bwd<__half>(const long long*, const long long*, const __half*, float*, long long,
                                               int, int);

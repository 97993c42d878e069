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

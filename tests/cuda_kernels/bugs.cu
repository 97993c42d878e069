// Kernels with synchronisation bugs: on a GPU they hang or corrupt results; the emulator
// must raise an error for each instead of hanging.

// Only threads 0-15 reach the first barrier; 16-31 go on to the second one.
extern "C" __global__ void barrier_in_branch(const float* __restrict__ x, float* __restrict__ y) {
    __shared__ float s[32];
    s[threadIdx.x] = x[threadIdx.x];
    if (threadIdx.x < 16) {
        __syncthreads();
    }
    float v = s[31 - threadIdx.x];
    __syncthreads();
    y[threadIdx.x] = v;
}

// Half a warp waits in a shuffle while the other half waits at __syncthreads: no barrier can
// ever complete.
extern "C" __global__ void shuffle_in_branch(float* x) {
    float v = x[threadIdx.x];
    if (threadIdx.x < 16) v = __shfl_down_sync(0xffffffffu, v, 1);
    __syncthreads();
    x[threadIdx.x] = v;
}

// Uses 64 KB of static shared memory, more than CUDA's 48 KB.
extern "C" __global__ void too_much_shared(float* x) {
    __shared__ float big[16384];
    big[threadIdx.x] = x[threadIdx.x];
    __syncthreads();
    x[threadIdx.x] = big[threadIdx.x];
}

// Shared-memory kernels: reverse each block's chunk through dynamic shared memory, and a block
// sum by tree reduction — once correct, once with the barrier inside the loop forgotten.
extern "C" __global__ void reverse_blocks(const float* __restrict__ x, float* __restrict__ y, int n) {
    extern __shared__ float buf[];  // blockDim.x floats, sized by the launch's shared_mem
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    buf[threadIdx.x] = i < n ? x[i] : 0.0f;
    __syncthreads();
    int j = blockIdx.x * blockDim.x + (blockDim.x - 1 - threadIdx.x);
    if (j < n) y[j] = buf[threadIdx.x];
}

extern "C" __global__ void block_sum(const float* __restrict__ x, float* __restrict__ out, int n) {
    __shared__ float s[256];
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    s[threadIdx.x] = i < n ? x[i] : 0.0f;
    __syncthreads();
    for (int stride = blockDim.x / 2; stride > 0; stride >>= 1) {
        if (threadIdx.x < stride) s[threadIdx.x] += s[threadIdx.x + stride];
        __syncthreads();
    }
    if (threadIdx.x == 0) out[blockIdx.x] = s[0];
}

// BUG on purpose: no barrier between the store and the reduction steps.
extern "C" __global__ void block_sum_missing_sync(const float* __restrict__ x, float* __restrict__ out, int n) {
    __shared__ float s[256];
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    s[threadIdx.x] = i < n ? x[i] : 0.0f;
    for (int stride = blockDim.x / 2; stride > 0; stride >>= 1) {
        if (threadIdx.x < stride) s[threadIdx.x] += s[threadIdx.x + stride];
    }
    if (threadIdx.x == 0) out[blockIdx.x] = s[0];
}

// Threads past the end return before the barrier; the others must not wait for them.
extern "C" __global__ void pair_sum_early_return(const float* __restrict__ x, float* __restrict__ y, int n) {
    __shared__ float s[128];
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    s[threadIdx.x] = x[i];
    __syncthreads();
    int j = threadIdx.x ^ 1;
    bool has_pair = blockIdx.x * blockDim.x + j < n;
    y[i] = s[threadIdx.x] + (has_pair ? s[j] : 0.0f);
}

// Reads shared memory nobody wrote: the emulator fills it with NaN (0xFF bytes).
extern "C" __global__ void read_uninitialized(float* out) {
    __shared__ float s[64];
    extern __shared__ int dyn[];
    out[threadIdx.x] = s[threadIdx.x];
    out[64 + threadIdx.x] = (float)dyn[threadIdx.x];
}

// Scatters with atomics: a histogram (int), a scatter-add (float, like an embedding's
// backward), a global maximum (unsigned) and a lock-free counter with atomicCAS.
extern "C" __global__ void histogram(const int* __restrict__ values, int* __restrict__ counts, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) atomicAdd(&counts[values[i]], 1);
}

extern "C" __global__ void scatter_add(const int* __restrict__ index, const float* __restrict__ src,
                                       float* __restrict__ out, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) atomicAdd(&out[index[i]], src[i]);
}

extern "C" __global__ void global_max(const unsigned int* __restrict__ values, unsigned int* result, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) atomicMax(result, values[i]);
}

extern "C" __global__ void cas_count(unsigned long long* counter, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    unsigned long long old = *counter, seen;
    do {
        seen = old;
        old = atomicCAS(counter, seen, seen + 1ull);
    } while (old != seen);
}

extern "C" __global__ void double_sum(const double* __restrict__ x, double* total, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) atomicAdd(total, x[i]);
}

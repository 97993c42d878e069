// vector_add.cu — the first CUDA kernel of the course: c[i] = a[i] + b[i].
//
// One thread per element. The grid has ceil(n / blockDim.x) blocks, so the last block may be
// partial: its threads past the end must not touch memory, hence the bounds check.
extern "C" __global__ void vector_add(const float* __restrict__ a, const float* __restrict__ b,
                                      float* __restrict__ c, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) {
        c[i] = a[i] + b[i];
    }
}

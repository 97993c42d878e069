// Writes each thread's global coordinates, to check 3-D grids and blocks: thread (x, y, z)
// of the whole launch stores its linear block number and its linear thread number.
extern "C" __global__ void write_coords(int* __restrict__ out, int width, int height) {
    int x = blockIdx.x * blockDim.x + threadIdx.x;
    int y = blockIdx.y * blockDim.y + threadIdx.y;
    int z = blockIdx.z * blockDim.z + threadIdx.z;
    int i = (z * height + y) * width + x;
    out[2 * i] = (blockIdx.z * gridDim.y + blockIdx.y) * gridDim.x + blockIdx.x;
    out[2 * i + 1] = (threadIdx.z * blockDim.y + threadIdx.y) * blockDim.x + threadIdx.x;
}

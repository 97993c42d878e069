// transpose.cu — out (cols x rows) = in (rows x cols)ᵀ, float32, row-major.
//
// transpose_naive: one thread per element. Consecutive threads of a warp (consecutive
// threadIdx.x) read consecutive addresses of `in` — coalesced — but write addresses `rows`
// floats apart: each of the 32 writes of a warp lands in its own 128-byte memory segment.
//
// transpose_tiled: a block moves a 32x32 tile through shared memory. It reads the tile row by
// row (coalesced), waits at __syncthreads(), then writes the transposed tile row by row
// (coalesced too): the transposition happens in shared memory, where strided access is cheap.
// The tile has 33 columns, not 32: shared memory has 32 banks of 4 bytes, and reading a column
// of a 32-wide tile would send all 32 threads of a warp to the same bank (a 32-way conflict).
// With the +1 padding, element [r][c] sits in bank (33 r + c) % 32 = (r + c) % 32: a column
// spans all 32 banks. Launch with blockDim = (32, R) for R dividing 32 (each thread copies
// 32 / R elements) and a grid of (ceil(cols / 32), ceil(rows / 32)) blocks.
#define TILE 32

extern "C" __global__ void transpose_naive(const float* __restrict__ in, float* __restrict__ out,
                                           int rows, int cols) {
    int c = blockIdx.x * blockDim.x + threadIdx.x;  // column of `in`
    int r = blockIdx.y * blockDim.y + threadIdx.y;  // row of `in`
    if (r < rows && c < cols) {
        out[(long long)c * rows + r] = in[(long long)r * cols + c];
    }
}

extern "C" __global__ void transpose_tiled(const float* __restrict__ in, float* __restrict__ out,
                                           int rows, int cols) {
    __shared__ float tile[TILE][TILE + 1];  // +1: no bank conflicts when reading a column
    int c = blockIdx.x * TILE + threadIdx.x;      // column of `in` this thread reads
    for (int j = threadIdx.y; j < TILE; j += blockDim.y) {
        int r = blockIdx.y * TILE + j;            // row of `in`
        if (r < rows && c < cols) tile[j][threadIdx.x] = in[(long long)r * cols + c];
    }
    __syncthreads();
    int oc = blockIdx.y * TILE + threadIdx.x;     // column of `out` = row of `in`
    for (int j = threadIdx.y; j < TILE; j += blockDim.y) {
        int orow = blockIdx.x * TILE + j;         // row of `out` = column of `in`
        if (orow < cols && oc < rows) out[(long long)orow * rows + oc] = tile[threadIdx.x][j];
    }
}

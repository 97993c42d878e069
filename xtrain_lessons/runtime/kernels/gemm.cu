// gemm.cu — C[M,N] = op(A)[M,K] · op(B)[K,N] in float32, three versions (T03).
//
// Every kernel reads its operands through strides, the idea of T02's views: element (i, k) of
// op(A) is A[i * sam + k * sak] and element (k, j) of op(B) is B[k * sbk + j * sbn]. For a
// row-major A[M,K], (sam, sak) = (K, 1); for op(A) = Aᵀ with A stored [K,M], (sam, sak) = (1, M).
// So the backward GEMMs dA = dC·Bᵀ and dB = Aᵀ·dC need no transposed copy. C is row-major [M,N].
//
//   v1 gemm_naive    one thread per output element; every operand read comes from global memory.
//   v2 gemm_tiled    a TILE×TILE block stages a TILE×TILE tile of op(A) and of op(B) in shared
//                    memory per step of the K loop: each value loaded once is used TILE times.
//   v3 gemm_regtile  a block computes a BM×BN tile of C, each thread a TM×TN sub-block held in
//                    registers; per k a thread reads TM + TN values from shared memory and does
//                    TM·TN multiply-adds with them (v2: 2 reads per multiply-add).
//
// Sizes need not be multiples of any tile: out-of-range loads read as 0, out-of-range outputs
// are not written. Tile sizes are compile-time constants; change them with -DTILE=32 etc.
// (xtrain_lessons.kernels.gemm passes them as compiler options). The launcher is gemm.py.

#ifndef TILE
#define TILE 16  // v2: block (TILE, TILE), shared memory 2 · TILE² floats
#endif
#ifndef BM
#define BM 64  // v3: rows of C per block
#endif
#ifndef BN
#define BN 64  // v3: columns of C per block
#endif
#ifndef BK
#define BK 8  // v3: depth of one shared-memory stage
#endif
#ifndef TM
#define TM 4  // v3: rows of C per thread
#endif
#ifndef TN
#define TN 4  // v3: columns of C per thread; block (BN / TN, BM / TM)
#endif

// v1: thread (x, y) of the grid computes C[y, x]. Any block shape works.
extern "C" __global__ void gemm_naive(const float* __restrict__ A, const float* __restrict__ B,
                                      float* __restrict__ C, int M, int N, int K,
                                      int sam, int sak, int sbk, int sbn) {
    int row = blockIdx.y * blockDim.y + threadIdx.y;
    int col = blockIdx.x * blockDim.x + threadIdx.x;
    if (row < M && col < N) {
        float acc = 0.0f;
        for (int k = 0; k < K; k++) acc += A[row * sam + k * sak] * B[k * sbk + col * sbn];
        C[row * N + col] = acc;
    }
}

// v2: block (TILE, TILE) computes the TILE×TILE tile of C at (blockIdx.y, blockIdx.x).
extern "C" __global__ void gemm_tiled(const float* __restrict__ A, const float* __restrict__ B,
                                      float* __restrict__ C, int M, int N, int K,
                                      int sam, int sak, int sbk, int sbn) {
    __shared__ float As[TILE][TILE];  // As[ty][k] = op(A)[row, k0 + k]
    __shared__ float Bs[TILE][TILE];  // Bs[k][tx] = op(B)[k0 + k, col]
    int tx = threadIdx.x, ty = threadIdx.y;
    int row = blockIdx.y * TILE + ty;
    int col = blockIdx.x * TILE + tx;
    float acc = 0.0f;
    for (int k0 = 0; k0 < K; k0 += TILE) {
        int ka = k0 + tx, kb = k0 + ty;  // each thread loads one element of each tile
        As[ty][tx] = (row < M && ka < K) ? A[row * sam + ka * sak] : 0.0f;
        Bs[ty][tx] = (kb < K && col < N) ? B[kb * sbk + col * sbn] : 0.0f;
        __syncthreads();  // 1: the tiles are complete before anyone reads them
        for (int k = 0; k < TILE; k++) acc += As[ty][k] * Bs[k][tx];
        __syncthreads();  // 2: everyone is done reading before the next step overwrites them
    }
    if (row < M && col < N) C[row * N + col] = acc;
}

// v3: block (BN / TN, BM / TM) computes the BM×BN tile of C at (blockIdx.y, blockIdx.x);
// thread (tx, ty) owns the TM×TN outputs at rows ty·TM + i, columns tx·TN + j of the tile.
extern "C" __global__ void gemm_regtile(const float* __restrict__ A, const float* __restrict__ B,
                                        float* __restrict__ C, int M, int N, int K,
                                        int sam, int sak, int sbk, int sbn) {
    __shared__ float As[BK][BM];  // As[k][i] = op(A)[m0 + i, k0 + k] (stored k-major: a column of A)
    __shared__ float Bs[BK][BN];  // Bs[k][j] = op(B)[k0 + k, n0 + j]
    const int tx = threadIdx.x, ty = threadIdx.y;
    const int nthreads = blockDim.x * blockDim.y, tid = ty * blockDim.x + tx;
    const int m0 = blockIdx.y * BM, n0 = blockIdx.x * BN;
    float acc[TM][TN];
    for (int i = 0; i < TM; i++)
        for (int j = 0; j < TN; j++) acc[i][j] = 0.0f;
    float a_reg[TM], b_reg[TN];

    for (int k0 = 0; k0 < K; k0 += BK) {
        // the block's threads load both tiles cooperatively, a few elements each
        for (int e = tid; e < BM * BK; e += nthreads) {
            int i = e / BK, k = e % BK, r = m0 + i, kk = k0 + k;
            As[k][i] = (r < M && kk < K) ? A[r * sam + kk * sak] : 0.0f;
        }
        for (int e = tid; e < BK * BN; e += nthreads) {
            int k = e / BN, j = e % BN, kk = k0 + k, c = n0 + j;
            Bs[k][j] = (kk < K && c < N) ? B[kk * sbk + c * sbn] : 0.0f;
        }
        __syncthreads();
        for (int k = 0; k < BK; k++) {
            for (int i = 0; i < TM; i++) a_reg[i] = As[k][ty * TM + i];  // TM + TN shared reads ...
            for (int j = 0; j < TN; j++) b_reg[j] = Bs[k][tx * TN + j];
            for (int i = 0; i < TM; i++)                                  // ... TM · TN multiply-adds
                for (int j = 0; j < TN; j++) acc[i][j] += a_reg[i] * b_reg[j];
        }
        __syncthreads();
    }
    for (int i = 0; i < TM; i++) {
        int r = m0 + ty * TM + i;
        for (int j = 0; j < TN; j++) {
            int c = n0 + tx * TN + j;
            if (r < M && c < N) C[r * N + c] = acc[i][j];
        }
    }
}

// elementwise.cu — a binary elementwise op with NumPy broadcasting: out = op(a, b).
//
// One thread per output element. The thread turns its flat output index into a multi-index
// (row-major, last axis fastest) and, from it, the offset of its element in each input through
// that input's strides — in elements, with stride 0 on every axis the input is broadcast along.
// The shapes and strides travel in one small int array, `meta` = [out_shape | a_strides | b_strides]
// (3 * ndim ints), so one kernel serves every rank and every broadcasting pattern.
//
// op: 0 add, 1 subtract, 2 multiply, 3 divide, 4 maximum, 5 minimum.
extern "C" __global__ void binary_broadcast(const float* __restrict__ a, const float* __restrict__ b,
                                            float* __restrict__ out, const int* __restrict__ meta,
                                            int ndim, int n, int op) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    const int* shape = meta;
    const int* a_strides = meta + ndim;
    const int* b_strides = meta + 2 * ndim;
    int rem = i, oa = 0, ob = 0;
    for (int d = ndim - 1; d >= 0; --d) {  // peel the index of axis d off the flat index
        int idx = rem % shape[d];
        rem /= shape[d];
        oa += idx * a_strides[d];
        ob += idx * b_strides[d];
    }
    float x = a[oa], y = b[ob];
    float r;
    switch (op) {
        case 0: r = x + y; break;
        case 1: r = x - y; break;
        case 2: r = x * y; break;
        case 3: r = x / y; break;
        case 4: r = fmaxf(x, y); break;
        default: r = fminf(x, y); break;
    }
    out[i] = r;
}

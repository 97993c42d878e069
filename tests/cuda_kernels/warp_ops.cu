// Every warp operation, written to out[op * n + thread] so the test can compare each one.
extern "C" __global__ void warp_ops(const int* __restrict__ x, int* __restrict__ out, int n) {
    int t = threadIdx.x;
    int v = x[t];
    out[0 * n + t] = __shfl_sync(0xffffffffu, v, 3);             // lane 3 of the warp
    out[1 * n + t] = __shfl_sync(0xffffffffu, v, t + 1, 8);      // rotate within groups of 8
    out[2 * n + t] = __shfl_up_sync(0xffffffffu, v, 2);
    out[3 * n + t] = __shfl_down_sync(0xffffffffu, v, 5, 16);
    out[4 * n + t] = __shfl_xor_sync(0xffffffffu, v, 1);
    out[5 * n + t] = (int)__ballot_sync(0xffffffffu, v > 0);
    out[6 * n + t] = __any_sync(0xffffffffu, v > 50);
    out[7 * n + t] = __all_sync(0xffffffffu, v >= 0);
    __syncwarp();
}

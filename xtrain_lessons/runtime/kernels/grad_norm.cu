// grad_norm.cu — the global gradient norm, clipping and the fp16 overflow check of the GPU
// engine (phase T07b), without a host synchronisation: the result stays on the device, where
// adamw.cu's adamw_step_scaled reads it.
//
// grad_norm_partials: partials[b] = sum of g[i]^2 (in double) over the elements block b takes
//   in a grid-stride loop over the flat float32 gradient buffer. The grid is FIXED by the
//   launcher (NORM_GRID x NORM_BLOCK = 256 x 256), so which element goes into which partial,
//   and the order of every sum, never changes: the same bits on every run, any GPU.
// grad_norm_finish (one block): sum of the partials (double, fixed order), then
//   norm = sqrt(sum) * inv_scale          (inv_scale = 1 / loss_scale for fp16, else 1)
//   coef = max_norm / (norm + eps) if max_norm > 0, the norm is finite and that is < 1, else 1
//   out[0] = norm (float32: inf or NaN when a gradient is not finite)
//   out[1] = coef * inv_scale  (what the optimizer multiplies the raw gradients by: unscale and
//            clip in one factor)
//   out[2] = 1 if norm is not finite (found_inf: the fp16 step is skipped), else 0
// The rule of training/optim.py's clip_grad_norm (torch's clip_grad_norm_).
//
// Launch shape: partials (256 blocks, 256 threads), finish (1 block, 256 threads); the sums go
// through warp shuffles of doubles, then one double per warp in shared memory.

// The sum of v over the block in every thread (a fixed order; every thread must call it).
__device__ double block_sum_double(double v) {
    __shared__ double buf[32];
    const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    __syncthreads();
    if (lane == 0) buf[warp] = v;
    __syncthreads();
    v = lane < (int)(blockDim.x / 32) ? buf[lane] : 0.0;
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

extern "C" __global__ void grad_norm_partials(const float* __restrict__ g, long long n, double* __restrict__ partials) {
    double acc = 0.0;
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (long long)gridDim.x * blockDim.x) {
        double v = (double)g[i];
        acc += v * v;
    }
    acc = block_sum_double(acc);
    if (threadIdx.x == 0) partials[blockIdx.x] = acc;
}

// Thread 0 of the finishing block: out[0..2] from the sum of squares (see the header).
__device__ void write_norm_and_factor(double sum_sq, float* out, double max_norm, double eps, double inv_scale) {
    const double norm = sqrt(sum_sq) * inv_scale;
    const float norm32 = (float)norm;
    const bool finite = isfinite(norm32);
    double coef = 1.0;
    if (max_norm > 0.0 && finite) {
        double c = max_norm / (norm + eps);
        if (c < 1.0) coef = c;
    }
    out[0] = norm32;
    out[1] = (float)(coef * inv_scale);
    out[2] = finite ? 0.0f : 1.0f;
}

extern "C" __global__ void grad_norm_finish(const double* __restrict__ partials, int n_partials,
                                            float* __restrict__ out, double max_norm, double eps,
                                            double inv_scale) {
    double acc = 0.0;
    for (int i = threadIdx.x; i < n_partials; i += blockDim.x) acc += partials[i];
    acc = block_sum_double(acc);
    if (threadIdx.x == 0) write_norm_and_factor(acc, out, max_norm, eps, inv_scale);
}

// The same with the fp16 loss scale read on the device (grad_scaler.cu's state[0]): inv_scale =
// 1 / scale computed in double and rounded to float32, as torch.amp.GradScaler does.
extern "C" __global__ void grad_norm_finish_scaled(const double* __restrict__ partials, int n_partials,
                                                   float* __restrict__ out, double max_norm, double eps,
                                                   const float* __restrict__ scale_state) {
    double acc = 0.0;
    for (int i = threadIdx.x; i < n_partials; i += blockDim.x) acc += partials[i];
    acc = block_sum_double(acc);
    if (threadIdx.x == 0) {
        const float inv_scale = (float)(1.0 / (double)scale_state[0]);
        write_norm_and_factor(acc, out, max_norm, eps, (double)inv_scale);
    }
}

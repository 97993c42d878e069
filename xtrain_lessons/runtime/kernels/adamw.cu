// adamw.cu — a fused AdamW update over ONE flat float32 buffer of all parameters (phase T07b).
//
// The per-parameter optimizer (optim.AdamW) runs ~10 array ops per parameter tensor: on a GPU
// that is ~10 kernel launches x (number of tensors) per step, each reading and writing whole
// arrays. Here the parameters, gradients and both moments live in flat buffers and one launch
// does everything, each element read once and written once.
//
// Elements [0, n_decay) get the decoupled weight decay (the 2-D weights, laid out first),
// elements [n_decay, n) none (norm gains). The scalars are precomputed on the host in float32,
// in the same order of operations as optim.AdamW:
//   decay = 1 - lr*wd, one_minus_b1 = 1 - b1, b2, one_minus_b2 = 1 - b2,
//   bc2_sqrt = sqrt(1 - b2^t), eps, neg_step = -lr / (1 - b1^t)
// Grid-stride loop: any grid size covers all n elements.
extern "C" __global__ void adamw_step(float* __restrict__ p, const float* __restrict__ g,
                                      float* __restrict__ m, float* __restrict__ v,
                                      float decay, float one_minus_b1, float b2, float one_minus_b2,
                                      float bc2_sqrt, float eps, float neg_step, int n, int n_decay) {
    int stride = gridDim.x * blockDim.x;
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) {
        float theta = p[i];
        if (i < n_decay) theta = theta * decay;
        float gi = g[i];
        float mi = m[i];
        mi = mi + one_minus_b1 * (gi - mi);
        float vi = v[i] * b2 + one_minus_b2 * (gi * gi);
        float denom = sqrtf(vi) / bc2_sqrt + eps;
        p[i] = theta + neg_step * (mi / denom);
        m[i] = mi;
        v[i] = vi;
    }
}

// adamw_step_scaled (the GPU engine's step, after grad_norm.cu): adamw_step's update, but
//   (a) every gradient is first multiplied by factors[1] (unscale and clip in one factor:
//       grad_norm_finish's out[1]), read from device memory — no host synchronisation;
//   (b) when factors[2] != 0 (found_inf: a gradient overflowed under fp16 loss scaling) the
//       kernel returns without touching p, m or v: the skipped step.
// Everything else as adamw_step (same scalars, same order of operations, grid-stride loop).
extern "C" __global__ void adamw_step_scaled(float* __restrict__ p, const float* __restrict__ g,
                                             float* __restrict__ m, float* __restrict__ v,
                                             const float* __restrict__ factors,
                                             float decay, float one_minus_b1, float b2, float one_minus_b2,
                                             float bc2_sqrt, float eps, float neg_step, int n, int n_decay) {
    if (factors[2] != 0.0f) return;
    const float f = factors[1];
    int stride = gridDim.x * blockDim.x;
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) {
        float theta = p[i];
        if (i < n_decay) theta = theta * decay;
        float gi = g[i] * f;
        float mi = m[i];
        mi = mi + one_minus_b1 * (gi - mi);
        float vi = v[i] * b2 + one_minus_b2 * (gi * gi);
        float denom = sqrtf(vi) / bc2_sqrt + eps;
        p[i] = theta + neg_step * (mi / denom);
        m[i] = mi;
        v[i] = vi;
    }
}

// adamw_step_graphed — adamw_step_scaled with the three scalars that change every step read from
// device memory: step_scalars = {decay, bc2_sqrt, neg_step} (lr follows a schedule, the bias
// corrections follow the step count). A CUDA graph stores a kernel's arguments by value when it
// is captured, so a captured step replays with the scalars of its capture; read from memory, they
// are whatever the host copied there before each replay (training/loop/cuda_graph.py). Same order of
// operations as adamw_step_scaled: the same bits from the same scalars.
extern "C" __global__ void adamw_step_graphed(float* __restrict__ p, const float* __restrict__ g,
                                              float* __restrict__ m, float* __restrict__ v,
                                              const float* __restrict__ factors,
                                              const float* __restrict__ step_scalars,
                                              float one_minus_b1, float b2, float one_minus_b2, float eps,
                                              int n, int n_decay) {
    if (factors[2] != 0.0f) return;
    const float f = factors[1];
    const float decay = step_scalars[0], bc2_sqrt = step_scalars[1], neg_step = step_scalars[2];
    int stride = gridDim.x * blockDim.x;
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) {
        float theta = p[i];
        if (i < n_decay) theta = theta * decay;
        float gi = g[i] * f;
        float mi = m[i];
        mi = mi + one_minus_b1 * (gi - mi);
        float vi = v[i] * b2 + one_minus_b2 * (gi * gi);
        float denom = sqrtf(vi) / bc2_sqrt + eps;
        p[i] = theta + neg_step * (mi / denom);
        m[i] = mi;
        v[i] = vi;
    }
}

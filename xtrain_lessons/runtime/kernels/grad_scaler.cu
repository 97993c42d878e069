// grad_scaler.cu — fp16's dynamic loss scale updated on the device (phase T12b, the GPU engine):
// torch.amp.GradScaler's rule without reading anything on the host, so an fp16 step needs no
// host synchronisation.
//
// state (float32, 3): [scale, growth tracker (clean steps since the last change), skipped steps]
// found: grad_norm.cu's out[2] (1 when a gradient was inf/NaN this step, else 0)
//   found:  scale *= backoff, tracker = 0, skipped += 1
//   clean:  tracker += 1; at `interval` clean steps: scale *= growth if the result is finite
//           (float32), tracker = 0
//   dynamic == 0 (a fixed scale): only `skipped` counts.
// The products are float32, as torch computes them on its float32 scale tensor. Integers up to
// 2^24 are exact in float32: the tracker never gets near that (interval 2000 by default).
// Launch: one block of one thread (it is one number).
extern "C" __global__ void update_scale(float* __restrict__ state, const float* __restrict__ found,
                                        float growth, float backoff, int interval, int dynamic) {
    if (blockIdx.x != 0 || threadIdx.x != 0) return;
    const bool inf = found[2] != 0.0f;
    if (inf) state[2] = state[2] + 1.0f;
    if (!dynamic) return;
    if (inf) {
        state[0] = state[0] * backoff;
        state[1] = 0.0f;
        return;
    }
    state[1] = state[1] + 1.0f;
    if ((int)state[1] == interval) {
        const float grown = state[0] * growth;
        if (isfinite(grown)) state[0] = grown;
        state[1] = 0.0f;
    }
}

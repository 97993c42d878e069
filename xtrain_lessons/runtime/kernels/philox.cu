// philox.cu — Philox-4x32-10, the counter-based generator of xtrain_lessons/rng.py, in CUDA C.
//
// A pure function of (counter, key): thread t computes counter block t of stream
// (seed, offset) on its own — no state shared between threads, no state kept between launches.
// Layout (the same as rng.random_bits): element k of the stream is word k % 4 of
//     philox(counter = (k/4 low, k/4 high, offset low, offset high), key = (seed low, seed high)).
// Each thread writes the 4 words of its counter block (fewer in the last, partial block).
//
// mulhilo: the 64-bit product of two 32-bit values, split into high and low halves. Written
// with a 64-bit multiply (nvcc emits mul.wide.u32; __umulhi is the same high half), so the
// CPU emulator compiles the same source.

#define PHILOX_M0 0xD2511F53u
#define PHILOX_M1 0xCD9E8D57u
#define PHILOX_W0 0x9E3779B9u
#define PHILOX_W1 0xBB67AE85u

__device__ __forceinline__ void philox4x32_10(unsigned int c[4], unsigned int k0, unsigned int k1) {
    for (int r = 0; r < 10; ++r) {
        if (r > 0) {  // key schedule: a Weyl sequence, wrapping modulo 2^32
            k0 += PHILOX_W0;
            k1 += PHILOX_W1;
        }
        unsigned long long p0 = (unsigned long long)PHILOX_M0 * c[0];
        unsigned long long p1 = (unsigned long long)PHILOX_M1 * c[2];
        unsigned int hi0 = (unsigned int)(p0 >> 32), lo0 = (unsigned int)p0;
        unsigned int hi1 = (unsigned int)(p1 >> 32), lo1 = (unsigned int)p1;
        unsigned int c1 = c[1], c3 = c[3];
        c[0] = hi1 ^ c1 ^ k0;
        c[1] = lo1;
        c[2] = hi0 ^ c3 ^ k1;
        c[3] = lo0;
    }
}

// The 4 words of counter block `block` of stream (seed, offset).
__device__ __forceinline__ void philox_block(unsigned long long seed, unsigned long long offset,
                                             unsigned long long block, unsigned int c[4]) {
    c[0] = (unsigned int)block;
    c[1] = (unsigned int)(block >> 32);
    c[2] = (unsigned int)offset;
    c[3] = (unsigned int)(offset >> 32);
    philox4x32_10(c, (unsigned int)seed, (unsigned int)(seed >> 32));
}

// out[k] = word k of stream (seed, offset), k < n: the raw uint32 stream.
extern "C" __global__ void philox_bits(unsigned int* __restrict__ out, unsigned long long seed,
                                       unsigned long long offset, unsigned long long n) {
    unsigned long long block = (unsigned long long)blockIdx.x * blockDim.x + threadIdx.x;
    unsigned long long first = 4 * block;
    if (first >= n) return;
    unsigned int c[4];
    philox_block(seed, offset, block, c);
    for (int j = 0; j < 4; ++j) {
        if (first + j < n) out[first + j] = c[j];
    }
}

// out[k] = uniform in [0, 1) from word k: its top 24 bits times 2^-24 (exact in float32).
extern "C" __global__ void philox_uniform(float* __restrict__ out, unsigned long long seed,
                                          unsigned long long offset, unsigned long long n) {
    unsigned long long block = (unsigned long long)blockIdx.x * blockDim.x + threadIdx.x;
    unsigned long long first = 4 * block;
    if (first >= n) return;
    unsigned int c[4];
    philox_block(seed, offset, block, c);
    for (int j = 0; j < 4; ++j) {
        if (first + j < n) out[first + j] = (float)(c[j] >> 8) * 5.9604644775390625e-08f;  // 2^-24
    }
}

// The same uniforms, with the stream's (seed, offset) read from device memory: seed = key[0],
// offset = key[1] + add. A training step captured as a CUDA graph replays its launches with the
// arguments they had at the capture; the host rewrites `key` before each replay, so every replay
// draws fresh dropout masks (training/loop/cuda_graph.py). Bit for bit philox_uniform(key[0], key[1] + add).
extern "C" __global__ void philox_uniform_keyed(float* __restrict__ out, const unsigned long long* __restrict__ key,
                                                unsigned long long add, unsigned long long n) {
    unsigned long long block = (unsigned long long)blockIdx.x * blockDim.x + threadIdx.x;
    unsigned long long first = 4 * block;
    if (first >= n) return;
    unsigned int c[4];
    philox_block(key[0], key[1] + add, block, c);
    for (int j = 0; j < 4; ++j) {
        if (first + j < n) out[first + j] = (float)(c[j] >> 8) * 5.9604644775390625e-08f;  // 2^-24
    }
}

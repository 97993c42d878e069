// xtrain_mma.h — the tensor-core instruction mma.sync, for the xtrain CPU emulator.
//
// A kernel writes it as inline PTX, exactly as nvcc and NVRTC take it:
//
//   asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 "
//                "{%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%10,%11,%12,%13};"
//                : "=f"(d[0]), "=f"(d[1]), "=f"(d[2]), "=f"(d[3])
//                : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]),
//                  "f"(c[0]), "f"(c[1]), "f"(c[2]), "f"(c[3]));
//
// g++ cannot assemble PTX: the emulator (emulator.py, rewrite_asm) replaces the statement with a
// call of xt::mma_m16n8k16 below, operand for operand. One warp computes D = A B + C with
// A 16x16 (bf16 or f16), B 16x8 (same type), C and D 16x8 float32. Every lane holds a piece
// ("fragment") of each matrix in its registers, at the places the PTX ISA fixes ("Matrix
// Fragments for mma.m16n8k16 with floating point type"); with g = lane >> 2, t = lane & 3:
//
//   A  a_i, i = 0..7 (two per 32-bit register, a_0 in the low half of register 0):
//        row g + 8 * ((i >> 1) & 1),  col 2t + (i & 1) + 8 * (i >> 2)
//   B  b_i, i = 0..3 (two per register):  row 2t + (i & 1) + 8 * (i >> 1),  col g
//   C, D  c_i, i = 0..3 (one float each):  row g + 8 * (i >> 1),  col 2t + (i & 1)
//
// The instruction is warp-collective (.sync.aligned): all 32 lanes of the warp execute it
// together. Here every lane posts its operands and waits (a warp operation of the scheduler);
// when the 32 lanes have arrived the runtime calls mma_m16n8k16_run once, which gathers A, B, C
// from the 32 fragments, multiplies, and hands each lane its part of D. A lane that has exited,
// or a block whose size is not a multiple of 32, is an error naming the warp, not a hang.
// Rounding: the products of bf16/f16 values are exact in double and the sum of 16 of them and
// C is rounded once to float32; a tensor core may round the sum differently in the last bit.
// xt_mma_layout (the runtime) exports the table for Python: `emulator.mma_fragment_layout`.
#pragma once

namespace xt {
enum mma_type : int { MMA_BF16 = 0, MMA_F16 = 1 };

// (row, col) of element i of lane `lane`'s fragment, for each operand
inline void mma_a_rc(int lane, int i, int& r, int& c) {
    r = (lane >> 2) + 8 * ((i >> 1) & 1);
    c = 2 * (lane & 3) + (i & 1) + 8 * (i >> 2);
}
inline void mma_b_rc(int lane, int i, int& r, int& c) {
    r = 2 * (lane & 3) + (i & 1) + 8 * (i >> 1);
    c = lane >> 2;
}
inline void mma_c_rc(int lane, int i, int& r, int& c) {
    r = (lane >> 2) + 8 * (i >> 1);
    c = 2 * (lane & 3) + (i & 1);
}

// element `half` (0: low 16 bits) of a packed register, as float
inline float mma_elem(unsigned reg, int half, int type) {
    const unsigned short bits = (unsigned short)(half ? reg >> 16 : reg & 0xffffu);
    return type == MMA_BF16 ? bf16_bits_to_float(bits) : half_bits_to_float(bits);
}

struct mma_lane {  // what one lane posts: its registers in, its part of D out
    xt_collective_t head;
    int type;
    unsigned a[4], b[2];
    float c[4], out[4];
};

inline int mma_m16n8k16_run(void* const* lanes, char* err, unsigned long long errlen) {
    float A[16][16], B[16][8], C[16][8];
    const int type = static_cast<mma_lane*>(lanes[0])->type;
    for (int l = 0; l < 32; l++) {
        const mma_lane* L = static_cast<const mma_lane*>(lanes[l]);
        if (L->type != type) {
            std::snprintf(err, errlen, "lanes 0 and %d execute it with different operand types (bf16 / f16)", l);
            return 1;
        }
        int r, c;
        for (int i = 0; i < 8; i++) { mma_a_rc(l, i, r, c); A[r][c] = mma_elem(L->a[i >> 1], i & 1, type); }
        for (int i = 0; i < 4; i++) { mma_b_rc(l, i, r, c); B[r][c] = mma_elem(L->b[i >> 1], i & 1, type); }
        for (int i = 0; i < 4; i++) { mma_c_rc(l, i, r, c); C[r][c] = L->c[i]; }
    }
    for (int l = 0; l < 32; l++) {
        mma_lane* L = static_cast<mma_lane*>(lanes[l]);
        for (int i = 0; i < 4; i++) {
            int r, c;
            mma_c_rc(l, i, r, c);
            double s = C[r][c];
            for (int k = 0; k < 16; k++) s += (double)A[r][k] * (double)B[k][c];
            L->out[i] = (float)s;
        }
    }
    return 0;
}

// The call rewrite_asm puts where the asm statement was. D may be any assignable float
// (a sanitizer-checked shared element too): it is written after the warp has met.
template <class D0, class D1, class D2, class D3>
inline void mma_m16n8k16(int line, int type, D0&& d0, D1&& d1, D2&& d2, D3&& d3, unsigned a0, unsigned a1,
                         unsigned a2, unsigned a3, unsigned b0, unsigned b1, float c0, float c1, float c2,
                         float c3) {
    mma_lane L{{&mma_m16n8k16_run, "mma.sync.aligned.m16n8k16"}, type, {a0, a1, a2, a3}, {b0, b1},
               {c0, c1, c2, c3}, {0.0f, 0.0f, 0.0f, 0.0f}};
    xt_warp_op(line, XT_COLLECTIVE, (unsigned long long)(uintptr_t)&L, 0, 32);
    d0 = L.out[0];
    d1 = L.out[1];
    d2 = L.out[2];
    d3 = L.out[3];
}
}  // namespace xt

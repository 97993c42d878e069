"""GEMM by hand: the launcher for kernels/gemm.cu, its NumPy references, and the backward (T03).

    from xtrain_lessons.runtime.kernels.gemm import gemm, gemm_reference, gemm_backward
    c = gemm(a, b)                           # a (M, K) float32, b (K, N) float32 -> (M, N)
    c = gemm(a, b, version=3)                # 1 naive, 2 shared-memory tiled, 3 register-tiled
    c = gemm(a, b, trans_b=True)             # a @ b.T without copying b.T (b stored (N, K))
    da, db = gemm_backward(a, b, dc)         # dA = dC·Bᵀ, dB = Aᵀ·dC with the same kernels

NumPy arrays run on the CPU emulator, CuPy arrays on the GPU. Only float32 is accepted (a float64
array is refused rather than silently rounded). Tile shapes are compile-time constants of the
.cu file; `gemm(..., TILE=32)` or `gemm(..., version=3, BM=32, BN=32, TM=2, TN=2)` compiles
(once) a variant with other values — that is how the tests validate several configurations.

The engine trains with BLAS/cuBLAS (`xtrain_lessons.autograd.ops.matmul`): these kernels teach how a
GEMM is built and are checked against those libraries, they are not the engine's fast path.
"""

from __future__ import annotations

import numpy as np

from xtrain_lessons.runtime.cuda import load_kernel
from xtrain_lessons.runtime.device import array_module, kernel_backend, to_host

__all__ = ["gemm", "gemm_reference", "gemm_backward", "gemm_backward_reference", "gemm_tolerance",
           "launch_config", "VERSIONS", "DEFAULTS", "flops"]

VERSIONS = {1: "gemm_naive", 2: "gemm_tiled", 3: "gemm_regtile"}
# v1: the block shape is a launch parameter; v2, v3: compile-time tile sizes (-D options).
DEFAULTS = {
    1: {"BLOCK_X": 16, "BLOCK_Y": 16},
    2: {"TILE": 16},
    3: {"BM": 64, "BN": 64, "BK": 8, "TM": 4, "TN": 4},
}


def flops(m: int, n: int, k: int) -> int:
    """Floating-point operations of an (M, K)·(K, N) matmul: one multiply and one add per term."""
    return 2 * m * n * k


def _cdiv(a: int, b: int) -> int:
    return (a + b - 1) // b


def launch_config(version: int, m: int, n: int, **config):
    """(grid, block, compiler options) for `version` on an M×N output, with tile overrides."""
    if version not in VERSIONS:
        raise ValueError(f"gemm: version must be one of {sorted(VERSIONS)}, got {version!r}")
    unknown = set(config) - set(DEFAULTS[version])
    if unknown:
        raise ValueError(f"gemm: version {version} has no setting {sorted(unknown)}; "
                         f"it takes {sorted(DEFAULTS[version])}")
    cfg = {**DEFAULTS[version], **config}
    for key, value in cfg.items():
        if not isinstance(value, (int, np.integer)) or value < 1:
            raise ValueError(f"gemm: {key} must be a positive int, got {value!r}")
    if version == 1:
        bx, by = cfg["BLOCK_X"], cfg["BLOCK_Y"]
        return (_cdiv(n, bx), _cdiv(m, by)), (bx, by), ()
    if version == 2:
        t = cfg["TILE"]
        return (_cdiv(n, t), _cdiv(m, t)), (t, t), (f"-DTILE={t}",)
    if cfg["BM"] % cfg["TM"] or cfg["BN"] % cfg["TN"]:
        raise ValueError(f"gemm: BM must be a multiple of TM and BN of TN, got {cfg}")
    block = (cfg["BN"] // cfg["TN"], cfg["BM"] // cfg["TM"])
    grid = (_cdiv(n, cfg["BN"]), _cdiv(m, cfg["BM"]))
    return grid, block, tuple(f"-D{k}={v}" for k, v in sorted(cfg.items()))


def _operand(x, name: str, xp):
    if not hasattr(x, "ndim") or x.ndim != 2:
        raise ValueError(f"gemm: {name} must be a 2-D array, got shape {getattr(x, 'shape', type(x))}")
    if x.dtype != xp.float32:
        raise TypeError(f"gemm: {name} has dtype {x.dtype}; the kernels compute in float32 — "
                        f"pass {name}.astype(np.float32) if that is what you mean")
    return xp.ascontiguousarray(x)


def gemm(a, b, version: int = 2, trans_a: bool = False, trans_b: bool = False, **config):
    """C = op(a) · op(b) in float32 with kernel `version` (1, 2 or 3); op(x) = xᵀ when trans_x.

    a is (M, K), or (K, M) with trans_a; b is (K, N), or (N, K) with trans_b. Returns (M, N).
    `config` overrides the version's tile sizes (see DEFAULTS)."""
    xp = array_module(a)
    if array_module(b) is not xp:
        raise TypeError("gemm: a and b must both be NumPy arrays or both CuPy arrays")
    a, b = _operand(a, "a", xp), _operand(b, "b", xp)
    m, k = (a.shape[1], a.shape[0]) if trans_a else a.shape
    kb, n = (b.shape[1], b.shape[0]) if trans_b else b.shape
    if k != kb:
        raise ValueError(f"gemm: inner dimensions differ: op(a) is {m}x{k} and op(b) is {kb}x{n} "
                         f"(a {a.shape}, trans_a={trans_a}; b {b.shape}, trans_b={trans_b})")
    grid, block, options = launch_config(version, m, n, **config)
    c = xp.zeros((m, n), dtype=xp.float32)
    if m == 0 or n == 0:
        return c
    # strides in elements: op(a)[i, k] = a[i*sam + k*sak], op(b)[k, j] = b[k*sbk + j*sbn]
    sam, sak = (1, m) if trans_a else (k, 1)
    sbk, sbn = (1, k) if trans_b else (n, 1)
    kernel = load_kernel("gemm.cu", VERSIONS[version], backend=kernel_backend(xp),
                         options=options)
    i32 = np.int32
    kernel(grid, block, (a, b, c, i32(m), i32(n), i32(k), i32(sam), i32(sak), i32(sbk), i32(sbn)))
    return c


def gemm_reference(a, b, trans_a: bool = False, trans_b: bool = False):
    """The NumPy reference: op(a)·op(b) accumulated in float64, then rounded to float32."""
    a64 = to_host(a).astype(np.float64)
    b64 = to_host(b).astype(np.float64)
    return ((a64.T if trans_a else a64) @ (b64.T if trans_b else b64)).astype(np.float32)


def gemm_tolerance(a, b, trans_a: bool = False, trans_b: bool = False):
    """Elementwise bound on |float32 GEMM − exact| for any summation order (Higham's bound).

    Each of the K products and K − 1 additions rounds once, so
    |fl(AB) − AB| ≤ γ_K (|A|·|B|) with γ_K = K·u / (1 − K·u), u = eps/2. We use K·eps·(|A|·|B|)
    (≥ γ_K while K·u ≤ 1/2) plus eps·|AB| for rounding the float64 reference to float32."""
    eps = float(np.finfo(np.float32).eps)
    a64, b64 = np.abs(to_host(a).astype(np.float64)), np.abs(to_host(b).astype(np.float64))
    a64, b64 = (a64.T if trans_a else a64), (b64.T if trans_b else b64)
    k = a64.shape[1]
    abs_prod = a64 @ b64
    return k * eps * abs_prod + eps * abs_prod


def gemm_backward(a, b, dc, version: int = 2, **config):
    """(dA, dB) of C = A·B given dC = dL/dC, with the GEMM kernels: dA = dC·Bᵀ, dB = Aᵀ·dC.

    a (M, K), b (K, N), dc (M, N), all float32; the transposes are strides, not copies."""
    xp = array_module(a)
    for name, x in (("a", a), ("b", b), ("dc", dc)):
        if not hasattr(x, "ndim") or x.ndim != 2:
            raise ValueError(f"gemm_backward: {name} must be a 2-D array, got {getattr(x, 'shape', x)}")
    if a.shape[1] != b.shape[0] or dc.shape != (a.shape[0], b.shape[1]):
        raise ValueError(f"gemm_backward: a {a.shape} · b {b.shape} gives C {(a.shape[0], b.shape[1])}, "
                         f"but dc is {dc.shape}")
    da = gemm(dc, b, version=version, trans_b=True, **config)  # (M, N)·(N, K) -> (M, K)
    db = gemm(a, dc, version=version, trans_a=True, **config)  # (K, M)·(M, N) -> (K, N)
    return da, db


def gemm_backward_reference(a, b, dc):
    """The same formulas in float64 NumPy (no rounding to float32): (dc @ b.T, a.T @ dc)."""
    a, b, dc = (to_host(x).astype(np.float64) for x in (a, b, dc))
    return dc @ b.T, a.T @ dc

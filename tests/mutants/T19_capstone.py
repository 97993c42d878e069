"""Plausible wrong solutions to the exercises of solutions/T19_capstone.ipynb; each must fail
its check (tests/test_mutants_T19.py)."""

import numpy as np


def _matmul_weights(c, kv_heads=None, lm_head=True):
    kv = c.n_kv_heads if kv_heads is None else kv_heads
    attn = 2 * c.dim * c.n_heads * c.head_dim + 2 * c.dim * kv * c.head_dim
    return c.n_layers * (attn + 3 * c.dim * c.ffn_dim) + (c.vocab_size * c.dim if lm_head else 0)


def _attention(c, T):
    return 12 * c.n_layers * T * c.n_heads * c.head_dim


# ----- T19.1 run_flops ----------------------------------------------------------------------
def run_flops_all_params(c, T, D):  # counts the embedding (a gather) and the norms as matmuls
    return (6 * c.n_params() + _attention(c, T)) * D


def run_flops_no_lm_head(c, T, D):  # "non-embedding" taken to exclude the lm_head too
    return (6 * _matmul_weights(c, lm_head=False) + _attention(c, T)) * D


def run_flops_forward_only(c, T, D):  # 2 FLOPs per weight: the backward forgotten
    return (2 * _matmul_weights(c) + _attention(c, T) // 3) * D


def run_flops_no_attention(c, T, D):  # 6ND alone
    return 6 * _matmul_weights(c) * D


def run_flops_mha(c, T, D):  # k_proj / v_proj sized as if every head had its own key and value
    return (6 * _matmul_weights(c, kv_heads=c.n_heads) + _attention(c, T)) * D


# ----- T19.2 law_residuals ------------------------------------------------------------------
def residuals_linear(theta, N, D, L):  # the error in loss, not in log loss
    lnE, lnA, lnB, a, b = theta
    return np.exp(lnE) + np.exp(lnA) * N ** -a + np.exp(lnB) * D ** -b - L


def residuals_no_E(theta, N, D, L):  # the irreducible term dropped
    lnE, lnA, lnB, a, b = theta
    return np.log(np.exp(lnA) * N ** -a + np.exp(lnB) * D ** -b) - np.log(L)


def residuals_raw_params(theta, N, D, L):  # E, A, B used as they are, not as logs
    E, A, B, a, b = theta
    return np.log(np.abs(E + A * N ** -a + B * D ** -b)) - np.log(L)


def residuals_log_each_term(theta, N, D, L):  # log of a sum taken as the sum of logs
    lnE, lnA, lnB, a, b = theta
    return lnE + (lnA - a * np.log(N)) + (lnB - b * np.log(D)) - np.log(L)


# ----- T19.3 predict_loss -------------------------------------------------------------------
def predict_no_E(fit, N, D):
    return fit["A"] / N ** fit["alpha"] + fit["B"] / D ** fit["beta"]


def predict_swapped_exponents(fit, N, D):
    return fit["E"] + fit["A"] / N ** fit["beta"] + fit["B"] / D ** fit["alpha"]


def predict_growing(fit, N, D):  # N^alpha instead of N^-alpha
    return fit["E"] + fit["A"] * N ** fit["alpha"] + fit["B"] * D ** fit["beta"]


def predict_product(fit, N, D):
    return fit["E"] + fit["A"] / N ** fit["alpha"] * fit["B"] / D ** fit["beta"]


BY_EXERCISE = {
    "T19.1": [run_flops_all_params, run_flops_no_lm_head, run_flops_forward_only, run_flops_no_attention,
              run_flops_mha],
    "T19.2": [residuals_linear, residuals_no_E, residuals_raw_params, residuals_log_each_term],
    "T19.3": [predict_no_E, predict_swapped_exponents, predict_growing, predict_product],
}

# tests/test_mutants.py's format: exercise id -> {what the mistake is: mutant}
MUTANTS = {ex: {f.__name__.replace("_", " "): f for f in fns} for ex, fns in BY_EXERCISE.items()}

"""A scaling law L(N, D) = E + A / N^alpha + B / D^beta, fitted with NumPy alone (T19).

    fit = fit_scaling_law(N, D, L)          # {"E", "A", "alpha", "B", "beta", "rms_log_error"}
    fit_scaling_law(N, D, L, E=0.8)         # the floor fixed, the other four fitted (a profile over E)
    predict(fit, N, D)                      # the law's loss
    compute_optimal(fit, C)                 # {"N", "D", "loss"} minimising L under 6*N*D = C

The fit (Hoffmann et al. 2022, "Chinchilla", approach 3, with squares instead of Huber):
minimise sum_i (log L_hat(N_i, D_i) - log L_i)^2 over theta = (log E, log A, log B, alpha,
beta), so every point counts by its relative error and E, A, B stay positive. The solver is
Levenberg-Marquardt with the exact Jacobian, started from a small grid of exponents; the
best end point is kept (the problem has flat valleys, one start can stop in the wrong one).

On a grid far from convergence the floor E is often not determined: the best fit may put it at 0
and give the power terms everything, while a floor of half the lowest loss fits almost as well.
Fitting with E fixed at several values (a profile) shows how much the data say about it.

Compute-optimal size: with C = 6 N D, L(N, C / 6N) is smallest at
N* = G (C/6)^(beta / (alpha + beta)),  G = (alpha A / (beta B))^(1 / (alpha + beta)).
"""

from __future__ import annotations

import itertools
import math

import numpy as np

__all__ = ["predict", "fit_scaling_law", "compute_optimal"]


def predict(fit: dict, N, D):
    """L = E + A / N^alpha + B / D^beta (arrays broadcast)."""
    N, D = np.asarray(N, dtype=np.float64), np.asarray(D, dtype=np.float64)
    return fit["E"] + fit["A"] / N ** fit["alpha"] + fit["B"] / D ** fit["beta"]


def _residual_and_jacobian(theta, lnN, lnD, lnL):
    e, a, b, alpha, beta = theta
    with np.errstate(over="ignore", invalid="ignore"):  # a wild trial step: rejected by its cost
        tE, tN, tD = np.exp(e), np.exp(a - alpha * lnN), np.exp(b - beta * lnD)
        pred = tE + tN + tD
        r = np.log(pred) - lnL
        J = np.stack([tE * np.ones_like(lnN), tN, tD, -lnN * tN, -lnD * tD], axis=1) / pred[:, None]
    return r, J


def _levenberg_marquardt(theta, lnN, lnD, lnL, iters: int = 300, free=slice(None)):
    """Minimise |r|^2 over theta[free]; the other entries stay as given."""
    lam = 1e-3
    r, J = _residual_and_jacobian(theta, lnN, lnD, lnL)
    cost = float(r @ r)
    for _ in range(iters):
        g, H = J[:, free].T @ r, J[:, free].T @ J[:, free]
        step = np.zeros_like(theta)
        step[free] = np.linalg.solve(H + lam * np.diag(np.diag(H) + 1e-12), -g)
        new = theta + step
        new[3:] = np.clip(new[3:], 1e-3, 5.0)  # exponents stay positive and sane
        r2, J2 = _residual_and_jacobian(new, lnN, lnD, lnL)
        c2 = float(r2 @ r2)
        if np.isfinite(c2) and c2 < cost:
            improved = cost - c2
            theta, r, J, cost, lam = new, r2, J2, c2, max(lam / 3, 1e-12)
            if improved < 1e-16 * max(cost, 1e-30) or np.abs(step).max() < 1e-12:
                break
        else:
            lam *= 4
            if lam > 1e12:
                break
    return theta, cost


def fit_scaling_law(N, D, L, E: float | None = None) -> dict:
    """Least squares in log space (module docstring). N, D, L: 1-D arrays of equal length >= 5.
    With E given, the floor is fixed at E (0 <= E < min L) and the other four are fitted."""
    N, D, L = (np.asarray(v, dtype=np.float64).ravel() for v in (N, D, L))
    if not (len(N) == len(D) == len(L)):
        raise ValueError(f"fit_scaling_law: N, D, L have lengths {len(N)}, {len(D)}, {len(L)}")
    if len(L) < 5:
        raise ValueError(f"fit_scaling_law: 5 parameters need at least 5 points, got {len(L)}")
    if (N <= 0).any() or (D <= 0).any() or (L <= 0).any():
        raise ValueError("fit_scaling_law: N, D and L must be positive")
    if E is not None and not 0 <= E < L.min():
        raise ValueError(f"fit_scaling_law: a fixed floor E must be in [0, min L) = [0, {L.min():.4g}), got {E}")
    lnN, lnD, lnL = np.log(N), np.log(D), np.log(L)
    free = [1, 2, 3, 4] if E is not None else slice(None)
    best = None
    for e_frac, alpha, beta in itertools.product((0.5, 0.9), (0.2, 0.5, 1.0), (0.2, 0.5, 1.0)):
        floor = e_frac * L.min() if E is None else E
        e = math.log(floor) if floor > 0 else -np.inf
        rest = L.max() - floor  # the two power terms share what E does not explain
        a = math.log(rest / 2) + alpha * lnN.mean()
        b = math.log(rest / 2) + beta * lnD.mean()
        theta, cost = _levenberg_marquardt(np.array([e, a, b, alpha, beta]), lnN, lnD, lnL, free=free)
        if best is None or cost < best[1]:
            best = (theta, cost)
    (e, a, b, alpha, beta), cost = best
    return {"E": math.exp(e) if E is None else float(E), "A": math.exp(a), "alpha": float(alpha), "B": math.exp(b),
            "beta": float(beta), "rms_log_error": math.sqrt(cost / len(L)), "n_points": len(L)}


def compute_optimal(fit: dict, C: float) -> dict:
    """The N, D = C / 6N that minimise the law's loss at C FLOPs (C = 6 N D), and that loss."""
    alpha, beta, A, B = fit["alpha"], fit["beta"], fit["A"], fit["B"]
    G = (alpha * A / (beta * B)) ** (1.0 / (alpha + beta))
    N = G * (C / 6.0) ** (beta / (alpha + beta))
    D = C / (6.0 * N)
    return {"flops": float(C), "N": float(N), "D": float(D), "loss": float(predict(fit, N, D))}

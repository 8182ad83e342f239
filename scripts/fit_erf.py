#!/usr/bin/python3
"""The coefficients of cx_verff (core/kernels/vmath.h): erf(x) ~ x P(t)/Q(t),
t = x^2, P and Q of degree 5, Q(0) = 1, fitted to erf(x)/x on [0, 3.9] for
the least worst relative error. Linearized least squares (P - f Q, scaled by
the last Q) reweighted the Lawson way towards minimax; the best iterate is
kept. Needs numpy only. Run: /usr/bin/python3 scripts/fit_erf.py"""
import math

import numpy as np

NP, NQ, X = 5, 5, 3.9
x = np.sort(np.concatenate([X * (1 - np.cos(np.linspace(0.001, np.pi / 2, 6000))), np.linspace(1e-4, X, 6000)]))
s = (x / X) ** 2  # t / X^2, in [0, 1], for a well-conditioned system
f = np.array([math.erf(v) / v for v in x])
q_prev, w, best = np.ones_like(s), np.ones_like(s), None
for _ in range(200):
    cols = [s ** k for k in range(NP + 1)] + [-f * s ** k for k in range(1, NQ + 1)]
    scale = np.sqrt(w) / (f * q_prev)
    sol = np.linalg.lstsq(np.vstack(cols).T * scale[:, None], f * scale, rcond=None)[0]
    p, q = sol[:NP + 1], np.concatenate([[1.0], sol[NP + 1:]])
    q_prev = np.polyval(q[::-1], s)
    err = (np.polyval(p[::-1], s) / q_prev - f) / f
    if best is None or np.abs(err).max() < best[0]:
        best = (np.abs(err).max(), p, q)
    w = np.maximum(w * np.abs(err) / np.sum(w * np.abs(err)), 1e-30)
worst, p, q = best
print(f"max relative error {worst:.3g} ({worst / 2 ** -24:.2f} units of 2^-24)")
print("P (t^0 first):", ", ".join(f"{c / X ** (2 * k):.9g}" for k, c in enumerate(p)))
print("Q (t^0 first):", ", ".join(f"{c / X ** (2 * k):.9g}" for k, c in enumerate(q)))

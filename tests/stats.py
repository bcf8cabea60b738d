"""A chi-square goodness-of-fit test without scipy (the project does not depend on it)."""

import math

import numpy as np


def chi2_sf(x: float, k: int) -> float:
    """Survival function of the chi-square distribution (Wilson-Hilferty approximation, accurate
    to a few percent of the p-value for k >= 3, which is all a pass/fail threshold needs)."""
    if k <= 0:
        return 1.0
    z = ((x / k) ** (1 / 3) - (1 - 2 / (9 * k))) / math.sqrt(2 / (9 * k))
    return 0.5 * math.erfc(z / math.sqrt(2))


def chi_square_pvalue(observed: np.ndarray, expected_probs: np.ndarray) -> float:
    """p-value of observed counts against expected probabilities. Cells expected to hold fewer
    than 5 counts are pooled into one, as the chi-square approximation requires."""
    observed = np.asarray(observed, dtype=float)
    n = observed.sum()
    expected = np.asarray(expected_probs, dtype=float) * n
    assert observed[expected == 0].sum() == 0, "a count where the expected probability is zero"
    big = expected >= 5
    obs = list(observed[big])
    exp = list(expected[big])
    rest_obs, rest_exp = observed[~big].sum(), expected[~big].sum()
    if rest_exp > 0:
        obs.append(rest_obs)
        exp.append(rest_exp)
    obs, exp = np.array(obs), np.array(exp)
    stat = float(((obs - exp) ** 2 / exp).sum())
    return chi2_sf(stat, len(obs) - 1)

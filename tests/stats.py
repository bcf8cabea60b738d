"""A chi-square goodness-of-fit test without scipy (the project does not depend on it)."""

import math

import numpy as np

from specllm.engine.sampling import SamplerSettings, distribution
from specllm.llama.model import Model
from specllm.llama.options import ModelOptions


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


def first_three_tokens_pvalue(engine, target_path, ids, drafter, n=3000):
    """Chi-square p-value of the first three tokens of n seeded generations with three-token
    drafts against the target's own joint distribution of them, and each generation's stats."""
    joint = target_joint_distribution(target_path, ids)
    counts, stats = dict.fromkeys(joint, 0), []
    for seed in range(n):
        r = engine.generate(ids, max_tokens=4, gamma=3, drafter=drafter, **SAMPLER.__dict__ | {"seed": seed})
        counts[tuple(r.tokens[:3])] += 1  # a KeyError here is a sequence the target cannot produce
        stats.append(r.stats)
    cells = sorted(joint)
    return chi_square_pvalue(np.array([counts[c] for c in cells]), np.array([joint[c] for c in cells])), stats


SAMPLER = SamplerSettings(temperature=1.0, top_k=4, top_p=1.0, min_p=0.0)


def target_joint_distribution(target_path, prompt_ids, depth=3):
    """P(t_1..t_depth) of target-only sampling with SAMPLER, exactly: the target's own distribution
    of each token given those before it (one token at a time), over every reachable prefix."""
    model = Model(target_path, ModelOptions(n_ctx=256, n_threads=1))
    joint = {(): 1.0}
    for _ in range(depth):
        grown = {}
        for prefix, prob in joint.items():
            row = distribution(model.sync(prompt_ids + list(prefix), n_logits=1)[0], SAMPLER)
            for t in np.flatnonzero(row):
                grown[prefix + (int(t),)] = prob * row[t]
        joint = grown
    model.close()
    return joint

"""Speculative verification (Leviathan et al. 2023), pure numpy.

Given draft tokens d_1..d_k with draft distributions q_1..q_k and the target's distributions
p_1..p_{k+1} at the same positions, accept d_i with probability min(1, p_i(d_i) / q_i(d_i)) left to
right. At the first rejection emit a token drawn from norm(max(0, p_i - q_i)); if all k are
accepted, emit a bonus token drawn from p_{k+1}. The emitted tokens are distributed exactly as
sampling from the target alone.
"""

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from .sampling import sample


@dataclass(frozen=True)
class Verdict:
    n_accepted: int  # how many draft tokens, from the left, the target accepted
    token: int  # the target's own token: the correction after a rejection, or the bonus


def verify_greedy(draft: list[int], target_argmax: list[int]) -> Verdict:
    """Greedy limit: accept while the draft equals the target's argmax; emit argmax at the stop."""
    n = 0
    while n < len(draft) and draft[n] == target_argmax[n]:
        n += 1
    return Verdict(n, target_argmax[n])


def verify_sampled(
    draft: list[int],
    q: Sequence[np.ndarray] | None,
    p: Sequence[np.ndarray],
    rng: np.random.Generator,
) -> Verdict:
    """Sampling case. q: k draft distributions (rows over the draft's vocabulary), or None for a
    drafter without one (n-gram lookup, greedy draft), which is a one-hot q. p: k + 1 target
    distributions over the target's vocabulary. Dense rows, as in the paper."""
    n_vocab = len(p[0])
    for i, token in enumerate(draft):
        q_tok = 1.0 if q is None else q[i][token]
        p_tok = p[i][token] if token < n_vocab else 0.0
        if rng.random() * q_tok < p_tok:  # u < p/q, without dividing by a tiny q
            continue
        q_i = _one_hot(token, n_vocab) if q is None else _fit(q[i], n_vocab)
        return Verdict(i, sample(residual(p[i], q_i), rng))
    return Verdict(len(draft), sample(p[len(draft)], rng))


def residual(p: np.ndarray, q: np.ndarray) -> np.ndarray:
    """norm(max(0, p - q)) (left unnormalised: `sample` normalises). If rounding leaves no mass
    (p == q, where a rejection has probability zero anyway), fall back to p."""
    r = np.maximum(p - q, 0.0)
    return r if r.sum() > 0 else p


def _one_hot(token: int, n: int) -> np.ndarray:
    q = np.zeros(n)
    if token < n:
        q[token] = 1.0
    return q


def _fit(q: np.ndarray, n: int) -> np.ndarray:
    """Bring a draft row to the target's vocabulary size. Draft tokens past the target's vocab
    have p = 0, so max(0, p - q) is 0 there and dropping them leaves the residual exact."""
    if q.size == n:
        return q
    if q.size > n:
        return q[:n]
    return np.concatenate([q, np.zeros(n - q.size)])

"""Speculative verification (Leviathan et al. 2023), pure numpy.

Given draft tokens d_1..d_k with draft distributions q_1..q_k and the target's distributions
p_1..p_{k+1} at the same positions, accept d_i with probability min(1, p_i(d_i) / q_i(d_i)) left to
right. At the first rejection emit a token drawn from norm(max(0, p_i - q_i)); if all k are
accepted, emit a bonus token drawn from p_{k+1}. The emitted tokens are distributed exactly as
sampling from the target alone.
"""

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol, TypeVar

import numpy as np

from specllm.engine.sampling import Sparse

RowT_co = TypeVar("RowT_co", covariant=True)


class Rows(Protocol[RowT_co]):
    """The target's rows, read by index left to right: a list, or rows computed as they are read."""

    def __getitem__(self, i: int, /) -> RowT_co: ...


@dataclass(frozen=True)
class Verdict:
    n_accepted: int  # how many draft tokens, from the left, the target accepted
    token: int  # the target's own token: the correction after a rejection, or the bonus


def verify_greedy(draft: list[int], target_argmax: Rows[int]) -> Verdict:
    """Greedy limit: accept while the draft equals the target's argmax; emit argmax at the stop.
    Reads target_argmax left to right, no further than the stop (the engine's rows are lazy)."""
    n = 0
    while n < len(draft) and draft[n] == target_argmax[n]:
        n += 1
    return Verdict(n, target_argmax[n])


def verify_sampled(
    draft: list[int],
    q: Sequence[Sparse | np.ndarray] | None,
    p: Rows[Sparse | np.ndarray],
    rng: np.random.Generator,
) -> Verdict:
    """Sampling case. q: k draft distributions (over the draft's vocabulary), or None for a
    drafter without one (n-gram lookup, greedy draft), which is a one-hot q. p: k + 1 target
    distributions over the target's vocabulary. Rows are Sparse (their nonzero entries; the
    engine's) or dense vectors, as in the paper."""
    n_vocab = _sparse(p[0]).size
    for i, token in enumerate(draft):
        q_i = _sparse(q[i]) if q is not None else Sparse(np.array([token]), np.ones(1), n_vocab)
        p_i = _sparse(p[i])
        p_tok = p_i[token] if token < n_vocab else 0.0
        if rng.random() * q_i[token] < p_tok:  # u < p/q, without dividing by a tiny q
            continue
        return Verdict(i, residual(p_i, q_i).sample(rng))
    return Verdict(len(draft), _sparse(p[len(draft)]).sample(rng))


def residual(p: Sparse | np.ndarray, q: Sparse | np.ndarray) -> Sparse:
    """norm(max(0, p - q)) (left unnormalised: sampling normalises), over the ids either puts
    mass on; q's ids past p's vocabulary (a larger draft vocabulary) have p = 0 there, so max(0,
    p - q) is 0 and they are dropped. If rounding leaves no mass (p == q, where a rejection has
    probability zero anyway), fall back to p."""
    p = _sparse(p)
    r = p.minus(_sparse(q))
    return r if r is not None else p


def _sparse(row: Sparse | np.ndarray) -> Sparse:
    return row if isinstance(row, Sparse) else Sparse.from_dense(np.asarray(row))

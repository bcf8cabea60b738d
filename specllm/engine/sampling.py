"""Sampler settings and logits -> processed distribution, in numpy, and in C where setup.py could
build it (_sampler.c: one call per row, the same tokens).

The target's p and the draft's q must be processed by the same chain, or speculative sampling
would not reproduce the target's own distribution. The chain is llama.cpp's default order (as in
llama-cli, llama-server and llama-cpp-python's Llama.create_completion):
top-k -> top-p -> min-p on the raw logits, then temperature -> softmax over the survivors.
So top-p's mass and min-p's threshold are measured on the untempered distribution (restricted to
the top-k survivors), and the temperature only reshapes what is kept. Temperature 0 means greedy
(argmax). Ties at a cut keep the lower token ids (llama.cpp keeps an unspecified one of them).
A NaN among the logits is never chosen, as llama.cpp's samplers pass it over; a row whose top is
not a finite number (the model's computation broke down) raises LogitsNotFinite.
"""

import math
import os
from collections.abc import Callable
from dataclasses import dataclass
from types import ModuleType

import numpy as np

from specllm.errors import GrammarInvalid, LogitsNotFinite, SpecllmError, real_number, whole_number

_compiled: ModuleType | None
try:  # the work on each row in C (_sampler.c), built by setup.py where a C compiler is found
    from specllm.engine import _sampler as _compiled
except ImportError:
    _compiled = None
_COMPILED_TOP_K_MAX = 256  # the largest top-k the compiled chain takes
_FLOAT32, _FLOAT64, _INTP = np.dtype(np.float32), np.dtype(np.float64), np.dtype(np.intp)


def implementation() -> str:
    """Which sampler chain runs, for `specllm doctor`."""
    if _compiled is not None:
        return "compiled (C)"
    return (
        "numpy (specllm was installed without a C compiler: sampling takes longer between model "
        "calls; install one and reinstall specllm)"
    )


# When top-k is off, top-p only needs the head of the sorted distribution: sort this many first
# and fall back to a full sort only if they do not reach top_p (exact either way).
_TOP_P_HEAD = 1024
_GROUPS = 16  # top-k: the row is read as this many interleaved slices, their maxima kept (see _top_k)
_GROUPS_OF_MAXIMA = 8  # and those maxima as this many, for the floor


@dataclass(frozen=True)
class SamplerSettings:
    temperature: float = 0.8
    top_k: int = 40
    top_p: float = 0.95
    min_p: float = 0.05
    seed: int | None = None

    def __post_init__(self):
        for name in ("temperature", "top_p", "min_p"):
            object.__setattr__(self, name, real_number(name.replace("_", "-"), getattr(self, name)))
        object.__setattr__(self, "top_k", whole_number("top-k", self.top_k))
        if self.seed is not None:
            object.__setattr__(self, "seed", whole_number("seed", self.seed))
            if not 0 <= self.seed <= MAX_SEED:
                raise SpecllmError(f"seed must be in 0..{MAX_SEED}, got {self.seed}")
        if not 0 <= self.temperature < math.inf:
            raise SpecllmError(f"temperature must be >= 0 and finite, got {self.temperature}")
        if self.top_k < 0:
            raise SpecllmError(f"top-k must be >= 0 (0 disables it), got {self.top_k}")
        # top-p 0 and min-p 1 keep only the most likely token (and its ties, for min-p), as in
        # llama.cpp, which keeps at least one; OpenAI's API takes top_p 0 too.
        if not 0 <= self.top_p <= 1:
            raise SpecllmError(f"top-p must be in [0, 1], got {self.top_p}")
        if not 0 <= self.min_p <= 1:
            raise SpecllmError(f"min-p must be in [0, 1], got {self.min_p}")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0


MAX_SEED = 2**32 - 1  # seeds are 32-bit, as llama.cpp's and the fresh ones default_seed draws


def default_seed(seed: int | None) -> int:
    """The seed given, or a fresh random one (reported back, so a run can be repeated)."""
    return seed if seed is not None else int.from_bytes(os.urandom(4), "little")


def distribution(logits: np.ndarray, s: SamplerSettings) -> np.ndarray:
    """The processed next-token distribution as a dense float64 vector over the vocabulary."""
    return dense(*candidates(logits, s), logits.shape[-1])


@dataclass(frozen=True)
class Sparse:
    """A distribution over `size` token ids as its nonzero entries, in ascending id order: what
    verification needs of a 150k-token row (its top-k survivors) without a pass over the whole
    vocabulary. In id order, its cumulative sums are those of the dense vector (the zeros add
    nothing), so `sample` draws the very token that sampling the dense vector would."""

    ids: np.ndarray
    p: np.ndarray
    size: int

    @classmethod
    def of(cls, ids: np.ndarray, p: np.ndarray, size: int) -> "Sparse":
        if _compiled is not None and ids.dtype == _INTP and p.dtype == _FLOAT64:
            by_id = np.empty_like(ids), np.empty_like(p)
            if _compiled.by_id(ids, p, *by_id) >= 0:  # the same stable sort, in one call
                return cls(*by_id, size)
        order = np.argsort(ids, kind="stable")
        return cls(ids[order], p[order], size)

    @classmethod
    def from_dense(cls, row: np.ndarray) -> "Sparse":
        ids = np.flatnonzero(row)
        return cls(ids, np.asarray(row, dtype=np.float64)[ids], row.size)

    def __getitem__(self, token: int) -> float:
        i = int(np.searchsorted(self.ids, token))
        return float(self.p[i]) if i < self.ids.size and self.ids[i] == token else 0.0

    def at(self, ids: np.ndarray) -> np.ndarray:
        """The probabilities of `ids`, ascending ids that include all of this row's."""
        out = np.zeros(ids.size)
        out[np.searchsorted(ids, self.ids)] = self.p
        return out

    def minus(self, q: "Sparse") -> "Sparse | None":
        """max(0, self - q) over the ids either puts mass on (left unnormalised), or None where
        that holds no mass. q's ids past this vocabulary (a larger draft vocabulary) are dropped:
        there this distribution is 0, so the difference is too."""
        room = self.ids.size + q.ids.size
        if _compiled is not None and self.ids.dtype == q.ids.dtype == _INTP and self.p.dtype == q.p.dtype == _FLOAT64:
            ids, r = np.empty(room, np.intp), np.empty(room)
            n = _compiled.residual(self.ids, self.p, q.ids, q.p, ids, r, self.size)  # the same subtractions
            if n >= 0:
                return Sparse(ids[:n], r[:n], self.size) if n > 0 else None
        inside = q.ids < self.size
        q = Sparse(q.ids[inside], q.p[inside], self.size)
        ids = np.union1d(self.ids, q.ids)
        r = np.maximum(self.at(ids) - q.at(ids), 0.0)
        return Sparse(ids, r, self.size) if r.sum() > 0 else None

    def sample(self, rng: np.random.Generator) -> int:
        return int(self.ids[sample(self.p, rng)])

    def dense(self) -> np.ndarray:
        return dense(self.ids, self.p, self.size)


def sparse_distribution(logits: np.ndarray, s: SamplerSettings) -> Sparse:
    """`distribution`, sparse."""
    return Sparse.of(*candidates(logits, s), logits.shape[-1])


def dense(ids: np.ndarray, p: np.ndarray, size: int) -> np.ndarray:
    """A sparse distribution (ids, probabilities) as a dense float64 vector of `size`."""
    probs = np.zeros(size, dtype=np.float64)
    probs[ids] = p
    return probs


def candidates(logits: np.ndarray, s: SamplerSettings) -> tuple[np.ndarray, np.ndarray]:
    """The same distribution, sparse: the token ids kept by the chain, by decreasing
    probability, and their probabilities."""
    if s.greedy:
        return np.array([greedy_token(logits)]), np.ones(1)
    if 0 < s.top_k < logits.size:
        compiled = _compiled_candidates(logits, s)  # it passes NaN over
        if compiled is not None:
            return compiled
        logits = _numbers_only(logits)
        # select on the raw float32 logits, so only the k survivors are converted and sorted
        ids = _top_k(logits, s.top_k)
        x = logits[ids].astype(np.float64)
        _check_top(x[0])
        p = _softmax_sorted(x)
    else:
        x = np.asarray(_numbers_only(logits), dtype=np.float64)
        ids, p = _sorted_head(x, _logsumexp(x), s.top_p)
        x = x[ids]
    # the survivors are sorted by decreasing probability, so top-p and min-p each keep a prefix
    keep = ids.size
    if s.top_p < 1.0:
        keep = int(np.searchsorted(np.cumsum(p), s.top_p)) + 1
    if s.min_p > 0:
        keep = int(np.count_nonzero(p[:keep] >= s.min_p * p[0]))
    # temperature last: it reshapes the survivors' probabilities, not which tokens survive. The
    # maximum is taken off before dividing: a tiny temperature (1e-320) made x / T infinite, and
    # the softmax of infinities is NaN, sampled as noise where it should be all but greedy. Now
    # only the others overflow, to -inf: probability 0.
    with np.errstate(over="ignore"):
        tempered = (x[:keep] - x[0]) / s.temperature
    return ids[:keep], _softmax_sorted(tempered)


# Tokens checked against a grammar first, by decreasing logit (then 8 times as many, and so on)
_ALLOWED_FIRST = 64


def masked(logits: np.ndarray, allowed: Callable[[np.ndarray], np.ndarray], s: SamplerSettings) -> np.ndarray:
    """The row with every token that `allowed` (a grammar: ids -> which of them it allows) refuses
    set to -inf, before the chain, as far as the chain can tell them apart. Greedy reads only the
    best allowed token and top-k only the k best, so the tokens are checked best first, a widening
    head at a time (greedy's first head is the argmax alone), until that many are allowed. Each
    head is a prefix of the chain's own order (by decreasing logit, ties by id) and of the next
    head, so only its new tokens are checked, and the k best allowed tokens in it are the k best of
    the row: the chain keeps the same tokens with the same probabilities as over the whole masked
    row. Without top-k, top-p and min-p measure the whole allowed mass: every token is checked.
    A grammar's check of the whole vocabulary is narrowed by the tokens' first bytes
    (Grammar.allowed): about 1 ms for a 152k vocabulary where few tokens are allowed, 60-170 ms
    where most are (inside a string)."""
    x = _numbers_only(logits)
    need = 1 if s.greedy else s.top_k if 0 < s.top_k < x.size else x.size
    head = 1 if need == 1 else _ALLOWED_FIRST if need < x.size else x.size
    checked, kept = np.zeros(0, np.intp), []
    while True:
        new = _head(x, head)[checked.size :] if head < x.size else _unchecked(x.size, checked)
        kept.append(new[allowed(new)])
        checked = np.concatenate([checked, new])
        if sum(k.size for k in kept) >= need or checked.size == x.size:
            break
        head = max(head * 8, _ALLOWED_FIRST)
    keep = np.concatenate(kept)
    if keep.size == 0:
        # the grammar's fault (a token the vocabulary lacks, text no token spells), not the model's
        raise GrammarInvalid("the grammar allows no token of this vocabulary at this point of the text")
    row = np.full(x.size, -np.inf, dtype=x.dtype)
    row[keep] = x[keep]
    return row


def _head(x: np.ndarray, n: int) -> np.ndarray:
    """The ids of the n best values in the chain's order (the argmax alone: numpy's lowest id)."""
    return np.array([int(x.argmax())]) if n == 1 else _top_k(x, n)


def _unchecked(size: int, checked: np.ndarray) -> np.ndarray:
    left = np.ones(size, dtype=bool)
    left[checked] = False
    return np.flatnonzero(left)


def greedy_token(logits: np.ndarray) -> int:
    """The row's argmax, NaN passed over."""
    token = int(logits.argmax())
    value = logits[token]
    if value != value:  # NaN: numpy's argmax stops at the first, so the row holds one
        token = int(_numbers_only(logits).argmax())
        value = logits[token]
    _check_top(value)
    return token


def _numbers_only(logits: np.ndarray) -> np.ndarray:
    """The row, or where it holds NaN a copy with -inf in their place: never chosen, as llama.cpp's
    samplers pass NaN over."""
    if not np.isnan(logits.max()):  # max, as argmax, stops at a NaN
        return logits
    return np.where(np.isnan(logits), -np.inf, logits).astype(logits.dtype)


def _check_top(value) -> None:
    """A row's largest logit (NaN passed over) is finite, or its model's computation broke down:
    a row of NaN and -inf alone has none, and +inf is an overflow (and, taken off the row for the
    softmax, NaN)."""
    if not -math.inf < value < math.inf:
        raise LogitsNotFinite()


def _softmax_sorted(x: np.ndarray) -> np.ndarray:
    """softmax of values sorted in decreasing order (so x[0] is their maximum)."""
    e = np.exp(x - x[0])
    return e / e.sum()


def _compiled_candidates(logits: np.ndarray, s: SamplerSettings) -> tuple[np.ndarray, np.ndarray] | None:
    """candidates' result in one call into C, where it is built and takes the row; else None.
    After a model call, on cold caches, each kind of numpy call costs tens of microseconds the
    first time: numpy's chain costs 150-400 us per row there, this 50-110. The same ids; the
    probabilities agree to rounding."""
    if _compiled is None or s.top_k > _COMPILED_TOP_K_MAX or logits.dtype != _FLOAT32:
        return None
    ids, p = np.empty(s.top_k, np.intp), np.empty(s.top_k)
    keep = _compiled.candidates(logits, ids, p, s.top_p, s.min_p, s.temperature)
    if keep <= 0:  # a strided row, fewer than k numbers, or min-p against a top that is not finite
        return None
    if p[0] != p[0]:  # the top less itself: not finite
        raise LogitsNotFinite()
    return ids[:keep], p[:keep]


def _top_k(x: np.ndarray, k: int) -> np.ndarray:
    """Ids of the k largest values, by decreasing value (at a tie, the lowest ids first, so a tie
    at the k-th value keeps the lowest ids). A full sort of a 150k vocabulary costs milliseconds,
    so the row is narrowed down first, exactly: read as _GROUPS interleaved slices, group j being
    ids j, j + m, j + 2m, ... (m = size // _GROUPS), each of the k largest values lies in a group
    whose maximum is at least the k-th largest maximum (were it not, k groups would each hold a
    larger value). Any floor at most that k-th largest maximum keeps them, and the k-th largest
    of the maxima's own group maxima is one (k groups of maxima each hold a maximum at least as
    large), found in a partition 8 times smaller. One elementwise max over the slices, and the
    values of about k groups, are all that is read of the row."""
    m = x.size // _GROUPS
    if m <= k:
        return np.argsort(-x, kind="stable")[:k]
    maxima = x[: _GROUPS * m].reshape(_GROUPS, m).max(axis=0)
    m2 = m // _GROUPS_OF_MAXIMA
    outer = maxima[: _GROUPS_OF_MAXIMA * m2].reshape(_GROUPS_OF_MAXIMA, m2).max(axis=0) if m2 > k else maxima
    floor = np.partition(outer, outer.size - k)[outer.size - k]
    groups = np.flatnonzero(maxima >= floor)  # every group tied at the floor too: ties keep the lowest ids
    ids = (groups + m * np.arange(_GROUPS)[:, None]).ravel()
    if _GROUPS * m < x.size:  # the few ids past the last whole slice are always candidates
        ids = np.concatenate([ids, np.arange(_GROUPS * m, x.size)])
    ids.sort()  # in id order, so that each stable step below keeps the lowest ids first at a tie
    values = x[ids]
    if values.size > 4 * k:  # many candidates (ties at the floor): keep those at or above the k-th
        kth = np.partition(values, values.size - k)[values.size - k]
        ids = ids[values >= kth]
        values = x[ids]
    return ids[np.argsort(-values, kind="stable")[:k]]


def _sorted_head(x: np.ndarray, logz: float, top_p: float) -> tuple[np.ndarray, np.ndarray]:
    """All ids sorted by probability, or, when top-p will cut, only a head long enough for it."""
    if top_p < 1.0 and x.size > _TOP_P_HEAD:
        head = np.argpartition(-x, _TOP_P_HEAD - 1)[:_TOP_P_HEAD]
        head = head[np.lexsort((head, -x[head]))]  # by value, ties by id
        p = np.exp(x[head] - logz)
        if p.sum() >= top_p:
            return head, p
    ids = np.argsort(-x, kind="stable")
    return ids, np.exp(x[ids] - logz)


def _logsumexp(x: np.ndarray) -> float:
    m = x.max()
    _check_top(m)
    return float(m + np.log(np.exp(x - m).sum()))


_CONFIDENCE_WINDOW = 20.0


def top_probability(logits: np.ndarray, token: int, below: float = 0.0) -> float:
    """The raw softmax's top probability, given the row's argmax `token`: the draft's confidence
    when decoding greedily (where the processed distribution is always one-hot). Logits more than
    20 below the top add at most n_vocab * e^-20 (3e-4 for 150k tokens) to a normaliser of at
    least 1, far below the confidence buckets' widths, so only the ones near the top are
    exponentiated: from 0.1% to a third of a real model's row. numpy finds them with a boolean copy
    of the row, 0.27-0.84 ms right after a call of the default draft; the compiled one gathers them
    a block at a time, 0.12-0.27 ms (benchmarks/sampled_row.py --prompt).

    Where the probability is under `below`, any value under it may come back: the compiled one
    stops once the blocks read so far prove it, which makes a flat row (a draft that has no idea,
    whose whole row lies near its top: 0.7 ms) cost about what a peaked one does."""
    if _compiled is not None and logits.dtype == _FLOAT32:
        probability = _compiled.top_probability(logits, token, _CONFIDENCE_WINDOW, below)
        if probability >= 0:  # else a strided row
            return probability
    top = logits[token]  # the maximum, without another pass over the row
    near = logits[logits >= top - _CONFIDENCE_WINDOW]
    return float(1.0 / np.exp(near - top, dtype=np.float64).sum())


def sample(probs: np.ndarray, rng: np.random.Generator) -> int:
    """Draw one token id from a (not necessarily normalised) non-negative vector."""
    u = rng.random()
    if _compiled is not None and probs.dtype == _FLOAT64:
        index = _compiled.draw(probs, u)  # the same sums and search, in one call
        if index >= 0:  # else a strided vector
            return index
    cdf = np.cumsum(probs)
    return int(min(np.searchsorted(cdf, u * cdf[-1], side="right"), probs.size - 1))

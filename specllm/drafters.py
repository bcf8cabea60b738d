"""Drafters propose the next few tokens; the target verifies them.

All three share one small interface so the engine runs target-only decoding through the very same
loop as speculative decoding, which keeps comparisons fair:

    propose(context, gamma) -> Draft   context: every token so far (prompt + generated)
"""

import time
from dataclasses import dataclass, field

import numpy as np

from .backend import Model
from .sampling import SamplerSettings, candidates, dense, sample


@dataclass
class Draft:
    tokens: list[int] = field(default_factory=list)
    # one dense draft distribution per token, or None when the drafter has none (one-hot q)
    q: list[np.ndarray] | None = None
    calls: int = 0  # draft model evaluations spent on it
    seconds: float = 0.0


class NoDrafter:
    """Target-only decoding: propose nothing, so each step is one target call and one token."""

    name = "none"

    def propose(self, context: list[int], gamma: int) -> Draft:
        return Draft()

    def reset(self) -> None:
        pass


class ModelDrafter:
    """A small model with its own context, kept in step with the accepted tokens.

    Its KV cache is cut back to the common prefix with the new context at the start of each
    proposal, so a rejection costs no extra call. The last draft token is never evaluated: if it
    is accepted it is evaluated next time together with the target's bonus token, in one call.

    A target's vocabulary may be larger than the draft's: once the context holds an id the draft
    does not have, the draft cannot read it, so it drafts nothing for the rest of the generation
    (each step is then a target-only step: exact, only slower). One drafter serves one generation,
    whose context only grows, so each token is checked once.
    """

    name = "model"

    def __init__(self, model: Model, sampler: SamplerSettings, rng: np.random.Generator):
        self.model = model
        self.sampler = sampler
        self.rng = rng
        self._checked = 0  # context tokens already checked against the draft's vocabulary
        self._blind = False  # the context holds a token outside the draft's vocabulary

    def reset(self) -> None:
        self.model.truncate(0)
        self._checked, self._blind = 0, False

    def prefill(self, prompt: list[int]) -> None:
        """Evaluate the prompt ahead of time (all but its last token, as the target does)."""
        if self._can_read(prompt):
            self.model.sync(prompt[:-1])

    def _can_read(self, context: list[int]) -> bool:
        new = context[self._checked :]
        self._blind = self._blind or (bool(new) and max(new) >= self.model.n_vocab)
        self._checked = len(context)
        return not self._blind

    def propose(self, context: list[int], gamma: int) -> Draft:
        start = time.perf_counter()
        gamma = min(gamma, self.model.n_ctx - len(context))
        if gamma <= 0 or not self._can_read(context):
            return Draft()
        logits = self.model.sync(context, n_logits=1)[0]
        tokens, rows, calls = [], [], 1
        while True:
            token, q = self._choose(logits)
            tokens.append(token)
            if q is not None:
                rows.append(q)
            if len(tokens) == gamma:
                break
            logits = self.model.eval([token], 1)[0]
            calls += 1
        return Draft(tokens, rows or None, calls, time.perf_counter() - start)

    def _choose(self, logits: np.ndarray) -> tuple[int, np.ndarray | None]:
        if self.sampler.greedy:
            return int(np.argmax(logits)), None  # greedy: q is one-hot
        ids, p = candidates(logits, self.sampler)
        return int(ids[sample(p, self.rng)]), dense(ids, p, logits.size)


# When does an n-gram draft pay? A target call on k+1 tokens costs V(k+1) one-token calls. On a GPU
# V is close to 1, so even a weak match (2 tokens) is worth verifying. On a small CPU it is not
# (measured on 2 cores with the default pair: V(2) = 1.7-2.0, V(5) = 3.4, V(17) = 8): only a draft
# that continues a long verbatim repeat pays, and the length of the repeat so far is the best
# predictor of that. Replaying the built-in prompt suite's outputs with the measured V, drafting only
# after a repeat of at least 6 tokens gained most on every category (and lost least where the output
# does not repeat the prompt); see the README's benchmark section.
CPU_MIN_MATCH = 6
GPU_MIN_MATCH = 2
_MATCH_CAP = 64  # how far back a repeat is measured: long enough to tell, short enough to be cheap


class NgramDrafter:
    """Prompt lookup: find the latest earlier occurrence of the last n tokens (longest n first)
    and, when the text before it repeats for at least `min_match` tokens, propose the tokens that
    followed it. No model, no distribution (one-hot q).

    An index from each n-gram to its latest end position is kept up to date incrementally, so a
    proposal costs O(gamma + min_match) whatever the length of the context.
    """

    name = "ngram"

    def __init__(self, max_ngram: int = 3, min_ngram: int = 2, min_match: int = CPU_MIN_MATCH):
        self.sizes = range(max_ngram, min_ngram - 1, -1)
        self.min_match = min_match
        self.reset()

    def reset(self) -> None:
        self._seen: list[int] = []
        self._last_end: dict[tuple[int, ...], int] = {}  # n-gram -> index after its latest end

    def propose(self, context: list[int], gamma: int) -> Draft:
        start = time.perf_counter()
        self._index(context)
        for n in self.sizes:
            if len(context) <= n:
                continue
            end = self._last_end.get(tuple(context[-n:]))
            if end is not None and _repeat_length(context, end) >= self.min_match:
                return Draft(context[end : end + gamma], None, 0, time.perf_counter() - start)
        return Draft(seconds=time.perf_counter() - start)

    def _index(self, context: list[int]) -> None:
        """Index every n-gram ending before the last token (the last one is what we look up)."""
        if self._seen != context[: len(self._seen)]:
            self.reset()
        for end in range(max(len(self._seen), 1), len(context)):
            for n in self.sizes:
                if end >= n:
                    self._last_end[tuple(context[end - n : end])] = end
        self._seen = list(context)


def _repeat_length(context: list[int], end: int) -> int:
    """How many tokens before position `end` equal the last tokens of the context."""
    n, last = 0, len(context) - 1
    while n < _MATCH_CAP and end - 1 - n >= 0 and context[end - 1 - n] == context[last - n]:
        n += 1
    return n

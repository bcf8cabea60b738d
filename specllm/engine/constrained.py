"""Structured output under speculation: the target's rows of one verify call, each masked by the
grammar state after the accepted text and the draft tokens before it.

Row i of a call on [last, d_1..d_k] predicts the token after d_1..d_i, so its mask is the one of
the grammar advanced over those tokens: a clone of the generation's grammar per row, each one the
clone before it advanced over one draft token. A row is read (and its clone made) only once every
draft token before it was accepted, so a clone only ever advances over tokens its grammar allows.
The grammar of the generation then advances over the accepted tokens and the target's own token.
"""

from collections.abc import Callable
from typing import Generic, TypeVar

import numpy as np

from specllm.engine.sampling import SamplerSettings, masked
from specllm.llama.grammar import Grammar

RowT = TypeVar("RowT")


class GrammarRows(Generic[RowT]):
    """What verification reads of each target row (see loop._LazyRows), masked by the grammar."""

    def __init__(
        self,
        logits: np.ndarray,
        read: Callable[[np.ndarray], RowT],
        grammar: Grammar,
        draft: list[int],
        sampler: SamplerSettings,
    ):
        self._logits, self._read, self._draft, self._sampler = logits, read, draft, sampler
        self._states = [grammar]  # _states[i]: the grammar after draft tokens 0..i-1
        self._rows: dict[int, RowT] = {}

    def __len__(self) -> int:
        return len(self._logits)

    def __getitem__(self, i: int) -> RowT:
        if i not in self._rows:
            state = self._state(i)
            self._rows[i] = self._read(masked(self._logits[i], state.allowed, self._sampler))
        return self._rows[i]

    def _state(self, i: int) -> Grammar:
        while len(self._states) <= i:
            state = self._states[-1].clone()
            state.accept(self._draft[len(self._states) - 1])
            self._states.append(state)
        return self._states[i]

    def advance(self, n_accepted: int, token: int) -> Grammar:
        """The grammar after the n accepted draft tokens and the target's `token`; the other
        rows' clones are freed."""
        grammar = self._state(n_accepted)
        grammar.accept(token)
        for state in self._states:
            if state is not grammar:
                state.close()
        return grammar


def allowed_prefix(grammar: Grammar, tokens: list[int]) -> list[int]:
    """A copied draft (one-hot q: an n-gram copy) up to its first token the grammar forbids. That
    token would be rejected for certain (p = 0) and its residual, p less a one-hot q where p is 0,
    is p itself: verifying the prefix alone and drawing the target's own token after it gives the
    same distribution, without the target evaluating tokens it cannot keep."""
    state, kept = grammar.clone(), []
    for token in tokens:
        if token >= grammar.model.n_vocab or not state.allowed(np.array([token]))[0]:
            break
        kept.append(token)
        if grammar.model.is_eog(token):  # nothing follows an end
            break
        state.accept(token)
    state.close()
    return kept

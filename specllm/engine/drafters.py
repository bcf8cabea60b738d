"""Drafters propose the next few tokens; the target verifies them.

All three share one small interface so the engine runs target-only decoding through the very same
loop as speculative decoding, which keeps comparisons fair:

    propose(context, gamma) -> Draft   context: every token so far (prompt + generated)
"""

import time
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from specllm.engine.constrained import OutputGrammar
from specllm.engine.policy import CONFIDENCE_EDGES, MATCH_EDGES, MODEL_MAX, MODEL_SOURCES, NGRAM_MAX, AutoPolicy, bucket
from specllm.engine.sampling import (
    SamplerSettings,
    Sparse,
    candidates,
    greedy_token,
    sample,
    top_probability,
)
from specllm.errors import LogitsNotFinite
from specllm.llama.model import Decoder


@dataclass
class Draft:
    tokens: list[int] = field(default_factory=list)
    # one draft distribution per token (sampling.Sparse), or None when the drafter has none (one-hot q)
    q: list[Sparse] | None = None
    calls: int = 0  # draft model evaluations spent on it
    seconds: float = 0.0
    source: str = "none"  # which drafter proposed it: "none", "ngram" or "model"
    confidences: list[float] = field(default_factory=list)  # the draft model's top probability per token
    # the draft model's catch-up on the context: (width, seconds, calls; calls > 1 where it went a
    # token a call, Model.one_token_catch_up)
    first_call: tuple[int, float, int] = (0, 0.0, 0)


class NoDrafter:
    """Target-only decoding: propose nothing, so each step is one target call and one token."""

    name = "none"

    def propose(self, context: list[int], gamma: int) -> Draft:
        return Draft()

    def prefill(self, prompt: list[int]) -> None:
        pass

    def observe(self, draft: Draft, accepted: int, verify_seconds: float, context: list[int]) -> None:
        """What verification made of the last proposal; `context` now holds the emitted tokens."""

    def finish(self, context: list[int]) -> None:
        """The generation ended."""

    def reset(self) -> None:
        pass


# On an H200 one call of 2 tokens and the two one-token calls after it cost a 0.5B draft 3.5-4.7
# plus 2 x 2.2-2.9 ms, four one-token calls in a row 4 x 1.2: one-token calls win up to about 5
# tokens, and a longer catch-up (after steps without drafting) goes in one call.
ONE_TOKEN_CATCH_UP = 4

# (confidences of the tokens taken so far, confidence of the next one, seconds spent) -> take it?
KeepGoing = Callable[[list[float], float, float], bool]


class ModelDrafter(NoDrafter):
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

    def __init__(
        self,
        model: Decoder,
        sampler: SamplerSettings,
        rng: np.random.Generator,
        name: str = "model",
        grammar: Callable[[], OutputGrammar | None] = lambda: None,
    ):
        self.model, self.name = model, name  # or the target's MTP head (llama.model.MtpHead): name "mtp"
        self.sampler = sampler
        self.rng = rng
        # The generation's grammar now (structured output): the draft masks its rows as the target
        # does, so that it proposes only what the target can accept. Its q is the masked
        # distribution it draws from, which the p/q rule needs.
        self.grammar = grammar
        self._checked = 0  # context tokens already checked against the draft's vocabulary
        self._blind = False  # the context holds a token outside the draft's vocabulary

    def reset(self) -> None:
        self.model.truncate(0)
        self._checked, self._blind = 0, False

    def prefill(self, prompt: list[int]) -> None:
        """Evaluate the prompt ahead of time (all but its last token, as the target does)."""
        if self.can_read(prompt):
            self.model.sync(prompt[:-1])

    def can_read(self, context: list[int]) -> bool:
        """Does the draft's vocabulary hold every context token? (Checks only the new ones.)"""
        new = context[self._checked :]
        self._blind = self._blind or (bool(new) and max(new) >= self.model.n_vocab)
        self._checked = len(context)
        return not self._blind

    def catch_up(self, context: list[int]) -> int:
        """How many context tokens the first call of a proposal has to evaluate."""
        return max(1, len(context) - self.model.cached_prefix(context))

    def propose(self, context: list[int], gamma: int, keep_going: KeepGoing | None = None) -> Draft:
        """Up to `gamma` tokens. `keep_going(confidences so far, next confidence, seconds spent)`,
        when given, decides before each token whether to take it (the auto policy stops early)."""
        try:
            return self._propose(context, gamma, keep_going)
        except LogitsNotFinite:
            what = "the draft model" if self.name == "model" else "the target's MTP layers"
            raise LogitsNotFinite(f"{what} ({self.model.path.name})") from None

    def _propose(self, context: list[int], gamma: int, keep_going: KeepGoing | None) -> Draft:
        start = time.perf_counter()
        gamma = min(gamma, self.model.n_ctx - len(context))
        if gamma <= 0 or not self.can_read(context):
            return Draft(source=self.name)
        width = self.catch_up(context)
        logits, calls = self._catch_up_to(context, width)
        first_call = (width, time.perf_counter() - start, calls)
        if gamma > 1:
            # A recurrent draft cannot take back its one-token steps: the next proposal starts
            # again from here, after the tokens the target kept.
            self.model.checkpoint()
        tokens: list[int] = []
        rows: list[Sparse] = []
        confidences: list[float] = []
        greedy = self.sampler.greedy
        grammar = self.grammar()
        state = grammar.clone() if grammar is not None else None  # advanced over the draft's own tokens
        while True:
            if state is not None:
                logits = state.masked(logits, self.sampler)
            if greedy:  # q is one-hot
                token = greedy_token(logits)
            else:
                ids, p = candidates(logits, self.sampler)
            if keep_going is not None:
                confidence = top_probability(logits, token, CONFIDENCE_EDGES[0]) if greedy else float(p[0])
                if not keep_going(confidences, confidence, time.perf_counter() - start):
                    break
                confidences.append(confidence)
            if not greedy:
                token = int(ids[sample(p, self.rng)])
                rows.append(Sparse.of(ids, p, logits.size))
            tokens.append(token)
            if len(tokens) == gamma or (state is not None and self._ends(state, token)):
                break
            logits = self.model.eval([tokens[-1]], 1)[0]
            calls += 1
        if state is not None:
            state.close()
        seconds = time.perf_counter() - start
        return Draft(tokens, rows or None, calls, seconds, self.name, confidences, first_call)

    def _catch_up_to(self, context: list[int], width: int) -> tuple[np.ndarray, int]:
        """Evaluate the `width` context tokens the draft has not seen: the last one's logits, and
        the calls it took. Where the model asks for it (CUDA graphs: Model.one_token_catch_up), a
        catch-up of up to ONE_TOKEN_CATCH_UP tokens (2 after a fully accepted draft: its last token
        and the bonus) goes one token a call, so that every drafting call keeps the one-token shape."""
        calls = 1
        if self.model.one_token_catch_up and 1 < width <= ONE_TOKEN_CATCH_UP:
            for end in range(len(context) - width + 1, len(context)):
                self.model.sync(context[:end], n_logits=1)
            calls = width
        return self.model.sync(context, n_logits=1)[0], calls

    def _ends(self, state: OutputGrammar, token: int) -> bool:
        """Advance the draft's grammar over its token; True at an end of generation, after which
        there is nothing to draft."""
        if state.model.is_eog(token):
            return True
        state.accept(token)
        return False


class StoppingRule:
    """auto's keep_going for one proposal of a model source (see AutoPolicy.model_keep_going).
    Nothing is learned while a proposal runs, so each taken token's estimate is looked up once,
    not again for every later token: that made a proposal of 15 tokens spend half a millisecond
    deciding."""

    def __init__(self, policy: AutoPolicy, source: str):
        self.policy, self.source = policy, source
        self.table = policy.by_confidence[source]
        self.taken: list[float] = []  # the estimates of the tokens taken so far

    def __call__(self, confidences: list[float], confidence: float, spent: float) -> bool:
        for j in range(len(self.taken), len(confidences)):
            self.taken.append(self.table.rate(bucket(confidences[j], CONFIDENCE_EDGES), j + 1))
        return self.policy.model_keep_going(self.taken, confidence, spent, MODEL_MAX, self.source)


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


class NgramDrafter(NoDrafter):
    """Prompt lookup: find the earlier occurrences of the last n tokens (longest n first), take the
    one preceded by the longest verbatim repeat of the text before them, and, when that repeat is
    at least `min_match` tokens, propose the tokens that followed it. No model, no distribution
    (one-hot q).

    A copy stops before the first of the `markup` tokens (the chat template's control tokens). An
    answer that repeats the end of the user's message would otherwise be offered the template's
    end-of-turn and role header as its next tokens, which it never writes: on this machine's
    open-ended prompts, such copies (15 tokens drafted, 3 kept) were what made code completion
    slower than the target alone.

    An index from each n-gram to its latest end positions is kept up to date incrementally, so a
    proposal costs O(gamma + occurrences x repeat) whatever the length of the context: it reads
    only the tokens added since the last one and a fixed window before them.
    """

    name = "ngram"
    OCCURRENCES = 8  # latest end positions kept per n-gram: the longest repeat among them wins

    def __init__(
        self,
        max_ngram: int = 3,
        min_ngram: int = 2,
        min_match: int = CPU_MIN_MATCH,
        markup: frozenset[int] = frozenset(),
    ):
        self.sizes = range(max_ngram, min_ngram - 1, -1)
        self.min_match = min_match
        self.markup = markup
        self.reset()

    def reset(self) -> None:
        self._seen = 0  # context tokens indexed so far
        self._seen_tail: list[int] = []  # the last of them (_MATCH_CAP at most): see _index
        self._ends: dict[tuple[int, ...], list[int]] = {}  # n-gram -> indices after its latest ends

    def propose(self, context: list[int], gamma: int) -> Draft:
        start = time.perf_counter()
        repeat, tokens = self.lookup(context, gamma)
        if repeat < self.min_match:
            tokens = []
        return Draft(tokens, None, 0, time.perf_counter() - start, self.name)

    def lookup(self, context: list[int], gamma: int) -> tuple[int, list[int]]:
        """(repeat length, up to `gamma` tokens that followed it) of the best earlier occurrence
        of the context's last n-gram; (0, []) when there is none."""
        self._index(context)
        for n in self.sizes:
            if len(context) <= n:
                continue
            ends = self._ends.get(tuple(context[-n:]))
            if ends:
                repeat, end = max((_repeat_length(context, e), e) for e in ends)
                return repeat, self._until_markup(context[end : end + gamma])
        return 0, []

    def _until_markup(self, copy: list[int]) -> list[int]:
        for i, token in enumerate(copy):
            if token in self.markup:
                return copy[:i]
        return copy

    def _index(self, context: list[int]) -> None:
        """Index every n-gram ending before the last token (the last one is what we look up).
        A context that does not go on from the one indexed (another generation's) starts the
        index again. That is told by its length and the last tokens indexed, not by comparing
        the whole context: a generation's context only grows, and comparing (and copying) all of
        it made every step slower than the one before (5x over 4k tokens). A copy is verified
        like any draft, so a context changed further back could only cost acceptance."""
        seen, tail = self._seen, self._seen_tail
        if len(context) < seen or context[seen - len(tail) : seen] != tail:
            self.reset()
        for end in range(max(self._seen, 1), len(context)):
            for n in self.sizes:
                if end >= n:
                    ends = self._ends.setdefault(tuple(context[end - n : end]), [])
                    ends.append(end)
                    if len(ends) > self.OCCURRENCES:
                        del ends[0]
        self._seen = len(context)
        self._seen_tail = context[max(0, len(context) - _MATCH_CAP) :]


def _repeat_length(context: list[int], end: int) -> int:
    """How many tokens before position `end` equal the last tokens of the context."""
    n, last = 0, len(context) - 1
    while n < _MATCH_CAP and end - 1 - n >= 0 and context[end - 1 - n] == context[last - n]:
        n += 1
    return n


class AutoDrafter(NoDrafter):
    """The `auto` policy's drafter: each step, an n-gram copy, the draft model, the target's MTP
    layers or nothing, whichever promises the most tokens per second (policy.AutoPolicy decides;
    this class only gathers what it needs, runs the chosen drafter and reports back).

    `model` (`mtp`) is None when there is no draft model (MTP layers) or the policy found that it
    cannot pay on this machine: then it costs nothing at all (no prefill, no catch-up calls)."""

    name = "auto"

    def __init__(
        self,
        policy: AutoPolicy,
        model: ModelDrafter | None,
        markup: frozenset[int] = frozenset(),
        mtp: ModelDrafter | None = None,
    ):
        self.policy = policy
        policy.start_generation()
        self.drafters = {name: d for name, d in (("model", model), ("mtp", mtp)) if d is not None}
        self.ngram = NgramDrafter(min_match=0, markup=markup)  # the policy judges every match, however short

    def prefill(self, prompt: list[int]) -> None:
        for name, drafter in self.drafters.items():
            if self._ready(name, prompt):
                drafter.prefill(prompt)

    def _ready(self, name: str, context: list[int]) -> bool:
        return self.drafters[name].can_read(context) and self.policy.model_could_pay(name)

    def propose(self, context: list[int], gamma: int) -> Draft:
        start = time.perf_counter()
        policy = self.policy
        policy.scorer.resolve(context)
        repeat, copy = self.ngram.lookup(context, min(gamma, NGRAM_MAX))
        ready = {name: d.catch_up(context) for name, d in self.drafters.items() if self._ready(name, context)}
        if not copy and not ready:  # nothing to draft with: a plain step, with no decision to make
            return Draft(seconds=time.perf_counter() - start)
        policy.scorer.propose(len(context), bucket(repeat, MATCH_EDGES), copy)
        plan = policy.choose(repeat, len(copy), False, gamma, ready=ready)
        if plan.source in self.drafters:
            decided, source = time.perf_counter(), plan.source
            keep_going = StoppingRule(policy, source)
            draft = self.drafters[source].propose(context, min(gamma, MODEL_MAX), keep_going)
            draft.seconds += decided - start  # the lookup and the decision are drafting time too
            return draft
        tokens = copy[: plan.k] if plan.source == "ngram" else []
        return Draft(tokens, None, 0, time.perf_counter() - start, plan.source)

    def observe(self, draft: Draft, accepted: int, verify_seconds: float, context: list[int]) -> None:
        policy = self.policy
        policy.observe_verify(len(draft.tokens) + 1, verify_seconds)
        costs = policy.costs.get(draft.source) if draft.source in MODEL_SOURCES else None
        if costs is not None:
            width, first, first_calls = draft.first_call
            costs.observe(width, first)
            if draft.calls > first_calls:
                costs.observe(1, (draft.seconds - first) / (draft.calls - first_calls))
            policy.record_model(draft.confidences, accepted, draft.source)
        emitted = min(accepted, len(draft.tokens)) + 1
        policy.record_step(draft.source, emitted, draft.seconds + verify_seconds)

    def finish(self, context: list[int]) -> None:
        self.policy.scorer.resolve(context, final=True)

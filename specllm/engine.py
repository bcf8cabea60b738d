"""The speculative decoding loop, as a generator of step events. It never prints.

Invariant: the target's KV cache holds every context token but the last, so each step is one
target call on [last token, d_1..d_k] that yields p_1..p_{k+1}.
"""

import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field, fields

import numpy as np

from .backend import Model, check_compatible, common_prefix
from .drafters import CPU_MIN_MATCH, GPU_MIN_MATCH, Draft, ModelDrafter, NgramDrafter, NoDrafter
from .errors import SpecllmError
from .sampling import SamplerSettings, distribution
from .speculative import verify_greedy, verify_sampled
from .text import TextStream

DRAFTERS = ("model", "ngram", "none")


@dataclass(frozen=True)
class GenerationConfig:
    max_tokens: int = 256
    sampler: SamplerSettings = SamplerSettings()
    drafter: str = "model"
    gamma: int = 4
    stop: tuple[str, ...] = ()

    def __post_init__(self):
        if self.max_tokens < 1:
            raise SpecllmError(f"max tokens must be >= 1, got {self.max_tokens}")
        if self.gamma < 1:
            raise SpecllmError(f"gamma (draft length) must be >= 1, got {self.gamma}")
        if self.drafter not in DRAFTERS:
            raise SpecllmError(f"unknown drafter {self.drafter!r}: use one of {', '.join(DRAFTERS)}")


@dataclass
class Stats:
    prompt_tokens: int = 0
    prefill_tokens: int = 0  # prompt tokens the target evaluated: not already in its KV cache
    generated_tokens: int = 0
    n_drafted: int = 0
    n_accepted: int = 0
    target_calls: int = 0
    draft_calls: int = 0
    drafted_per_position: list[int] = field(default_factory=list)
    accepted_per_position: list[int] = field(default_factory=list)
    prefill_seconds: float = 0.0
    decode_seconds: float = 0.0
    draft_seconds: float = 0.0
    verify_seconds: float = 0.0

    @property
    def acceptance_rate(self) -> float:
        return self.n_accepted / self.n_drafted if self.n_drafted else 0.0

    @property
    def mean_accepted_length(self) -> float:
        """Tokens emitted per target call."""
        return self.generated_tokens / self.target_calls if self.target_calls else 0.0

    @property
    def tokens_per_second(self) -> float:
        return self.generated_tokens / self.decode_seconds if self.decode_seconds else 0.0

    def record(self, drafted: int, accepted: int) -> None:
        grow = drafted - len(self.drafted_per_position)
        if grow > 0:
            self.drafted_per_position += [0] * grow
            self.accepted_per_position += [0] * grow
        for i in range(drafted):
            self.drafted_per_position[i] += 1
            self.accepted_per_position[i] += i < accepted
        self.n_drafted += drafted
        self.n_accepted += accepted
        self.target_calls += 1

    def to_dict(self) -> dict:
        d = dict(self.__dict__)
        d.update(
            acceptance_rate=self.acceptance_rate,
            mean_accepted_length=self.mean_accepted_length,
            tokens_per_second=self.tokens_per_second,
        )
        return d


def aggregate(stats: Iterable[Stats]) -> Stats:
    """Sum of several generations' stats (counts, seconds, per-position counts)."""
    total = Stats()
    for s in stats:
        for f in fields(Stats):
            a, b = getattr(total, f.name), getattr(s, f.name)
            if isinstance(a, list):
                n = max(len(a), len(b))
                setattr(total, f.name, [(a[i] if i < len(a) else 0) + (b[i] if i < len(b) else 0) for i in range(n)])
            else:
                setattr(total, f.name, a + b)
    return total


@dataclass(frozen=True)
class Step:
    """One target call: the draft, what the target kept of it, and the target's own token."""

    drafted: list[int]
    accepted: int  # leading draft tokens the target accepted
    token: int  # the target's own token (correction or bonus); -1 if cut by a stop
    accepted_text: str  # text the accepted draft tokens added
    token_text: str  # text the target's own token added
    rejected_text: str  # the rejected draft tokens, for display only
    stats: "Stats"


@dataclass
class Result:
    text: str
    tokens: list[int]
    stop_reason: str  # "eos", "max_tokens", "stop", "context_full"
    stats: Stats


@dataclass(frozen=True)
class Finished:
    result: Result


class Engine:
    """A loaded target (and optional draft model) that can generate many times."""

    def __init__(self, target: Model, draft: Model | None = None):
        if draft is not None:
            check_compatible(target, draft)
        self.target = target
        self.draft = draft

    def close(self) -> None:
        for model in (self.target, self.draft):
            if model is not None:
                model.close()

    # --- prompts ----------------------------------------------------------------------------

    def prompt_tokens(self, prompt: str | list[int], *, chat: bool = False, system: str | None = None) -> list[int]:
        """Token ids for a prompt: ids are used as given; text gets BOS as the model wants it, and
        with chat=True is first rendered as one user message (after the system message, if any)
        with the model's chat template, or ChatML for a model without one, as chat does."""
        if not isinstance(prompt, str):
            return [int(t) for t in prompt]
        if chat:
            system_message = [{"role": "system", "content": system}] if system else []
            prompt = self.target.render_chat(system_message + [{"role": "user", "content": prompt}])
        try:  # bytes that were not UTF-8 (from a pipe or an argument) arrive as lone surrogates
            prompt.encode("utf-8")
        except UnicodeEncodeError:
            raise SpecllmError("the prompt is not valid UTF-8 text") from None
        tokens = self.target.tokenize(prompt, add_special=True, parse_special=True)
        if len(tokens) > 1 and tokens[0] == tokens[1] == self.target.bos:  # template added one too
            tokens = tokens[1:]
        return tokens

    # --- generation -------------------------------------------------------------------------

    def generate(self, prompt: str | list[int], **kwargs) -> Result:
        for event in self.stream(prompt, **kwargs):
            if isinstance(event, Finished):
                return event.result
        raise AssertionError("stream ended without a result")

    def stream(
        self,
        prompt: str | list[int],
        config: GenerationConfig | None = None,
        *,
        chat: bool = False,
        system: str | None = None,
        **kwargs,
    ) -> Iterator[Step | Finished]:
        """Yield a Step per target call, then Finished. Keywords not given take GenerationConfig's
        and SamplerSettings' defaults (max_tokens, drafter, gamma, stop, temperature, top_k, ...)."""
        config = config or make_config(**kwargs)
        tokens = self.prompt_tokens(prompt, chat=chat, system=system)
        return _Run(self, tokens, config).steps()


class _LazyRows:
    """The target's processed distributions, computed only for the rows verification reads: it
    stops at the first rejection, so the rows after it cost nothing."""

    def __init__(self, logits: np.ndarray, sampler: SamplerSettings):
        self._logits, self._sampler, self._rows = logits, sampler, {}

    def __len__(self) -> int:
        return len(self._logits)

    def __getitem__(self, i: int) -> np.ndarray:
        if i not in self._rows:
            self._rows[i] = distribution(self._logits[i], self._sampler)
        return self._rows[i]


def make_config(**kwargs) -> GenerationConfig:
    sampler_keys = SamplerSettings.__dataclass_fields__.keys()
    sampler = SamplerSettings(**{k: v for k, v in kwargs.items() if k in sampler_keys})
    rest = {k: v for k, v in kwargs.items() if k not in sampler_keys}
    unknown = set(rest) - set(GenerationConfig.__dataclass_fields__)
    if unknown:
        raise TypeError(f"unknown generation options: {', '.join(sorted(unknown))}")
    if "stop" in rest:
        rest["stop"] = tuple([rest["stop"]] if isinstance(rest["stop"], str) else rest["stop"])
    return GenerationConfig(sampler=sampler, **rest)


class _Run:
    """State of one generation."""

    def __init__(self, engine: Engine, prompt: list[int], config: GenerationConfig):
        target = engine.target
        if not prompt:
            raise SpecllmError("the prompt is empty")
        if len(prompt) >= target.n_ctx:
            raise SpecllmError(
                f"the prompt is {len(prompt)} tokens but the context holds {target.n_ctx}: "
                "raise --ctx-size or shorten the prompt"
            )
        self.target, self.config, self.sampler = target, config, config.sampler
        self.rng = np.random.default_rng(config.sampler.seed)
        self.drafter = self._make_drafter(engine)
        self.context = list(prompt)
        self.generated: list[int] = []
        self.text = TextStream(config.stop)
        self.stats = Stats(prompt_tokens=len(prompt))

    def _make_drafter(self, engine: Engine):
        name = self.config.drafter
        if name == "model":
            if engine.draft is None:
                raise SpecllmError("drafter 'model' needs a draft model (--draft), or use --drafter ngram")
            return ModelDrafter(engine.draft, self.sampler, self.rng)
        if name == "ngram":
            return NgramDrafter(min_match=GPU_MIN_MATCH if self.target.on_gpu else CPU_MIN_MATCH)
        return NoDrafter()

    def steps(self) -> Iterator[Step | Finished]:
        self._prefill()
        start = time.perf_counter()
        reason = None
        while reason is None:
            # A step evaluates [last, d_1..d_k] on top of len(context) - 1 cached tokens.
            room = self.target.n_ctx - len(self.context)
            if room < 0:
                reason = "context_full"
                break
            budget = self.config.max_tokens - len(self.generated) - 1  # the step adds one more
            step, reason = self._step(min(self.config.gamma, room, budget))
            self.stats.decode_seconds = time.perf_counter() - start
            yield step
        tail = self.text.finish()
        if tail:
            yield Step([], 0, -1, "", tail, "", self.stats)
        self.stats.decode_seconds = time.perf_counter() - start
        yield Finished(Result(self.text.text, self.generated, reason, self.stats))

    def _prefill(self) -> None:
        start = time.perf_counter()
        # Whatever the KV cache already holds of this prompt (an earlier turn) is reused.
        self.stats.prefill_tokens = len(self.context) - 1 - common_prefix(self.target.tokens, self.context[:-1])
        self.target.sync(self.context[:-1])
        if isinstance(self.drafter, ModelDrafter):
            self.drafter.prefill(self.context)
        self.stats.prefill_seconds = time.perf_counter() - start

    def _step(self, gamma: int) -> tuple[Step, str | None]:
        draft = self.drafter.propose(self.context, gamma) if gamma > 0 else Draft()
        draft.tokens = draft.tokens[:gamma]
        t0 = time.perf_counter()
        verdict = self._verify(draft)
        self.stats.verify_seconds += time.perf_counter() - t0
        self.stats.draft_seconds += draft.seconds
        self.stats.draft_calls += draft.calls
        self.stats.record(len(draft.tokens), verdict.n_accepted)
        kept = draft.tokens[: verdict.n_accepted]
        # The target evaluated [last, d_1..d_k]; keep only what was accepted.
        self.target.truncate(len(self.context) + len(kept))
        return self._emit(draft.tokens, kept, verdict.token)

    def _verify(self, draft: Draft):
        n = len(draft.tokens)
        logits = self.target.eval([self.context[-1], *draft.tokens], n + 1)
        if self.sampler.greedy:
            return verify_greedy(draft.tokens, [int(i) for i in logits.argmax(axis=1)])
        return verify_sampled(draft.tokens, draft.q, _LazyRows(logits, self.sampler), self.rng)

    def _emit(self, drafted: list[int], kept: list[int], token: int) -> tuple[Step, str | None]:
        """Append the accepted tokens and the target's token, honouring EOS, max tokens, stops."""
        accepted_text, reason = "", None
        for tok in kept:
            accepted_text += self._append(tok)
            reason = self._stop_reason(tok)
            if reason:
                break
        token_text = ""
        if reason is None:
            token_text = self._append(token)
            reason = self._stop_reason(token)
        else:
            token = -1  # never emitted: the step ended inside the accepted draft
        self.stats.generated_tokens = len(self.generated)
        rejected = self.target.detokenize(drafted[len(kept) :]).decode("utf-8", errors="replace")
        return Step(drafted, len(kept), token, accepted_text, token_text, rejected, self.stats), reason

    def _append(self, token: int) -> str:
        if self.target.is_eog(token):
            return ""
        self.context.append(token)
        self.generated.append(token)
        return self.text.push(self.target.piece(token))

    def _stop_reason(self, token: int) -> str | None:
        if self.target.is_eog(token):
            return "eos"
        if self.text.stopped:
            return "stop"
        if len(self.generated) >= self.config.max_tokens:
            return "max_tokens"
        return None

"""The speculative decoding loop, as a generator of step events. It never prints.

Invariant: the target's KV cache holds every context token but the last, so each step is one
target call on [last token, d_1..d_k] that yields p_1..p_{k+1}.
"""

import copy
import math
import threading
import time
import weakref
from collections.abc import Callable, Generator, Iterable, Mapping, Sequence
from collections.abc import Set as AbstractSet
from contextlib import AbstractContextManager, contextmanager, nullcontext
from dataclasses import dataclass, field, fields
from itertools import zip_longest
from pathlib import Path
from typing import TYPE_CHECKING, Any, Generic, TypedDict, TypeVar

import numpy as np

from specllm import report
from specllm.engine import calibration
from specllm.engine.constrained import GrammarRows, OutputGrammar, allowed_prefix, message_start, where_it_applies
from specllm.engine.drafters import (
    CPU_MIN_MATCH,
    GPU_MIN_MATCH,
    ONE_TOKEN_CATCH_UP,
    AutoDrafter,
    Draft,
    ModelDrafter,
    NgramDrafter,
    NoDrafter,
)
from specllm.engine.infill import FILES_SHARE, ContextFile, InfillPrompt, infill_prompt
from specllm.engine.names import FIXED_GAMMA, Drafter
from specllm.engine.policy import NGRAM_MAX, AutoPolicy, CostTable
from specllm.engine.sampling import SamplerSettings, greedy_token, sparse_distribution
from specllm.engine.speculative import verify_greedy, verify_sampled
from specllm.engine.text import TextStream, check_utf8
from specllm.errors import (
    CannotTakeBack,
    ContextFull,
    DraftNotLoaded,
    DraftTooLong,
    GammaTooLong,
    Interrupted,
    LogitsNotFinite,
    NeedsDraftModel,
    NoMtpLayers,
    SpecllmError,
    real_number,
    whole_number,
)
from specllm.files import human_size
from specllm.llama.grammar import Grammar, find_probes, schema_grammar, schema_text
from specllm.llama.model import Model, MtpHead, interruptible
from specllm.llama.options import ModelOptions
from specllm.llama.system import llama_cpp_python_version
from specllm.llama.vocab import ensure_compatible

if TYPE_CHECKING:  # typing's own from Python 3.11; typing_extensions is pydantic's (serve)
    from typing_extensions import Unpack

DRAFTERS = tuple(Drafter)  # their names, in this order, for messages
SAVE_COSTS_EVERY = 60.0  # seconds: how often costs that were only refined are written back
RowT = TypeVar("RowT")  # what verification reads of a target row
# A prompt's last tokens, where a think block it opens is read from: the longest opening marker is
# a few tokens. A gpt-oss prompt's end goes back further, to the message it ends in (prompt_end).
PROMPT_END_TOKENS = 64


@dataclass(frozen=True)
class GenerationConfig:
    """`drafter="auto"` chooses the source and length of every draft (up to `gamma` tokens when
    given); a fixed drafter ("model", "mtp", "ngram", "none") drafts `gamma` tokens (default 4)
    each step."""

    max_tokens: int = 256
    sampler: SamplerSettings = SamplerSettings()
    drafter: str = Drafter.AUTO
    gamma: int | None = None
    stop: Sequence[str] = ()  # one string or several: kept as a tuple
    # An editor's limits on a completion (TextStream): end before a new line indented by fewer
    # spaces or tabs than this (0: off), and at a line break once this many seconds have passed.
    min_indent: int = 0
    line_seconds: float | None = None
    # Structured output: a GBNF grammar the text must follow, or a JSON schema (a dict, or its JSON
    # text; {} is any JSON object) it must be JSON of. One of them at most.
    grammar: str | None = None
    json_schema: dict | str | None = None
    # Tools offered beside the grammar: the text a tool call begins with, as the chat template
    # writes it. The answer may be a call instead (that text, then anything) as well as the
    # grammar's text (engine/constrained.py).
    call_opening: str | None = None
    # Where the model may begin a call inside its think block (Qwen3.5's, Nemotron 3's): the
    # openings that end the reasoning there, the call then free as after call_opening.
    calls_in_reasoning: Sequence[str] = ()  # kept as a tuple
    # The offered tools' names, beside call_opening: a call may also be a fenced JSON call naming
    # one (```json {"name": "get_weather", ...), as the reply reader reads one.
    call_names: Sequence[str] = ()  # kept as a tuple

    def __post_init__(self):
        object.__setattr__(self, "stop", stop_strings(self.stop))
        if self.grammar is not None and self.json_schema is not None:
            raise SpecllmError("give a grammar or a JSON schema, not both")
        if self.grammar is not None and not isinstance(self.grammar, str):
            raise SpecllmError(f"a grammar is GBNF text (a str), not {type(self.grammar).__name__}")
        if self.json_schema is not None:  # kept as JSON text: the config stays hashable
            object.__setattr__(self, "json_schema", schema_text(self.json_schema))
        self._check_call_opening()
        self._check_calls_in_reasoning()
        self._check_call_names()
        object.__setattr__(self, "min_indent", whole_number("min_indent", self.min_indent))
        if self.min_indent < 0:
            raise SpecllmError(f"min_indent must be >= 0, got {self.min_indent}")
        if self.line_seconds is not None:
            object.__setattr__(self, "line_seconds", real_number("line_seconds", self.line_seconds))
            if not 0 <= self.line_seconds < math.inf:
                raise SpecllmError(f"line_seconds must be a finite number >= 0, got {self.line_seconds}")
        object.__setattr__(self, "max_tokens", whole_number("max tokens", self.max_tokens))
        if self.gamma is not None:
            object.__setattr__(self, "gamma", whole_number("gamma (draft length)", self.gamma))
        if not isinstance(self.sampler, SamplerSettings):
            raise SpecllmError(f"sampler must be a SamplerSettings, got {self.sampler!r}")
        if self.max_tokens < 1:
            raise SpecllmError(f"max tokens must be >= 1, got {self.max_tokens}")
        if self.gamma is not None and self.gamma < 1:
            raise SpecllmError(f"gamma (draft length) must be >= 1, got {self.gamma}")
        if self.drafter not in DRAFTERS:
            raise SpecllmError(f"unknown drafter {self.drafter!r}: use one of {', '.join(DRAFTERS)}")
        object.__setattr__(self, "drafter", Drafter(self.drafter).value)  # its name, however given

    def _check_call_opening(self) -> None:
        if self.call_opening is None:
            return
        if not isinstance(self.call_opening, str) or not self.call_opening.strip():
            raise SpecllmError(f"a call opening is the text a tool call begins with, not {self.call_opening!r}")
        if self.grammar is None and self.json_schema is None:
            raise SpecllmError("a call opening is given beside a grammar or a JSON schema, not alone")
        object.__setattr__(self, "call_opening", self.call_opening.strip())

    def _check_calls_in_reasoning(self) -> None:
        describe = "calls in reasoning are texts a tool call begins with"
        self._keep_beside_call_opening("calls_in_reasoning", "calls in reasoning", describe, str.strip)

    def _check_call_names(self) -> None:
        describe = "call names are the offered tools' names"
        self._keep_beside_call_opening("call_names", "call names", describe, str)

    def _keep_beside_call_opening(self, field: str, called: str, describe: str, kept: Callable[[str], str]) -> None:
        """A field of texts given beside call_opening (a text alone is one), kept as a tuple (as
        given: the reply reader reads them so); `kept`: what of a text must not be empty."""
        value = getattr(self, field)
        texts = tuple(((value,) if isinstance(value, str) else value) or ())
        if not all(isinstance(text, str) and kept(text) for text in texts):
            raise SpecllmError(f"{describe}, not {value!r}")
        if texts and self.call_opening is None:
            raise SpecllmError(f"{called} are given beside a call opening, not alone")
        object.__setattr__(self, field, texts)

    def draft_length(self, fixed_gamma: int = FIXED_GAMMA) -> int:
        """The longest draft of a step: gamma, or auto's longest, or a fixed drafter's default."""
        if self.gamma is not None:
            return self.gamma
        return NGRAM_MAX if self.drafter == Drafter.AUTO else fixed_gamma


class GenerationOptions(TypedDict, total=False):
    """The keywords Engine.generate, stream and start take in place of a GenerationConfig: its
    fields and its SamplerSettings' (those not given take their defaults)."""

    max_tokens: int
    drafter: str
    gamma: int | None
    stop: str | Sequence[str] | None
    min_indent: int
    line_seconds: float | None
    grammar: str | None
    json_schema: dict | str | None
    call_opening: str | None
    calls_in_reasoning: Sequence[str]
    call_names: Sequence[str]
    temperature: float
    top_k: int
    top_p: float
    min_p: float
    seed: int | None
    sampler: SamplerSettings  # the five above at once


def stop_strings(stop) -> tuple[str, ...]:
    """One stop string, or several (any iterable of them), or None for none."""
    if stop is None:
        return ()
    stops = (stop,) if isinstance(stop, str) else stop  # one string, not a sequence of one-letter stops
    if isinstance(stops, (bytes, bytearray)) or not isinstance(stops, Iterable):
        raise SpecllmError(f"stop must be a string or a list of strings, got {stop!r}")
    stops = tuple(stops)
    if not all(isinstance(s, str) for s in stops):
        raise SpecllmError(f"stop strings must be strings, got {stop!r}")
    for s in stops:  # a lone surrogate ("\ud800") is no text a model can write: it would never stop
        check_utf8(s, "a stop string")
    return stops


@dataclass
class Stats:
    prompt_tokens: int = 0
    prefill_tokens: int = 0  # prompt tokens evaluated before the first step: not cached, not the last
    generated_tokens: int = 0
    n_drafted: int = 0
    n_accepted: int = 0
    target_calls: int = 0
    draft_calls: int = 0
    drafted_per_position: list[int] = field(default_factory=list)
    accepted_per_position: list[int] = field(default_factory=list)
    prefill_seconds: float = 0.0
    decode_seconds: float = 0.0
    llama_seconds: float = 0.0  # of decode_seconds, inside llama.cpp's calls (all models): the rest is the loop's
    draft_seconds: float = 0.0
    verify_seconds: float = 0.0
    calibration_seconds: float = 0.0  # auto: timing the models' calls (0 when the cache had it)
    # per drafting source ("none", "ngram", "model", "mtp"): steps, drafted and accepted tokens
    sources: dict[str, dict[str, int]] = field(default_factory=dict)
    # auto: the cost estimates at the end and where they came from; None for a fixed drafter
    policy: dict[str, Any] | None = None

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

    @property
    def loop_seconds_per_step(self) -> float:
        """The loop's own time (drafting logic, sampling, verification, text) per target call."""
        return (self.decode_seconds - self.llama_seconds) / self.target_calls if self.target_calls else 0.0

    def record(self, drafted: int, accepted: int, source: str = "none") -> None:
        counts = self.sources.setdefault(source, {"steps": 0, "drafted": 0, "accepted": 0})
        counts["steps"] += 1
        counts["drafted"] += drafted
        counts["accepted"] += accepted
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

    def source_shares(self) -> dict[str, float]:
        """The fraction of steps each source drafted (nothing drafted counts as "none")."""
        steps = sum(c["steps"] for c in self.sources.values())
        return {name: c["steps"] / steps for name, c in self.sources.items()} if steps else {}

    def to_dict(self) -> dict[str, Any]:
        """A copy, lists and dicts too: a step's stats go on changing as the generation runs."""
        d = copy.deepcopy(self.__dict__)
        d.update(
            acceptance_rate=self.acceptance_rate,
            mean_accepted_length=self.mean_accepted_length,
            tokens_per_second=self.tokens_per_second,
            loop_seconds_per_step=self.loop_seconds_per_step,
        )
        return d


def aggregate(stats: Iterable[Stats]) -> Stats:
    """Sum of several generations' stats (counts, seconds, per-position and per-source counts;
    the latest policy estimates)."""
    total = Stats()
    for s in stats:
        for f in fields(Stats):
            a, b = getattr(total, f.name), getattr(s, f.name)
            if f.name == "policy":
                value = b if b is not None else a
            elif f.name == "sources":
                value = {k: _add_counts(a.get(k, {}), b.get(k, {})) for k in dict.fromkeys([*a, *b])}
            elif isinstance(a, list):
                value = [x + y for x, y in zip_longest(a, b, fillvalue=0)]
            else:
                value = a + b
            setattr(total, f.name, value)
    return total


def _add_counts(a: dict[str, int], b: dict[str, int]) -> dict[str, int]:
    return {k: a.get(k, 0) + b.get(k, 0) for k in dict.fromkeys([*a, *b])}


@dataclass(frozen=True)
class Step:
    """One target call: the draft, what the target kept of it, and the target's own token."""

    drafted: list[int]
    accepted: int  # leading draft tokens the target accepted and the output used (up to an EOS or a stop)
    token: int  # the target's own token (correction or bonus); -1 if cut by a stop, and in a text_tail step
    accepted_text: str  # text the accepted draft tokens added
    token_text: str  # text the target's own token added
    rejected_text: str  # the rejected draft tokens, for display only
    stats: "Stats" = field(repr=False)  # the generation's, shared by all its steps: shown by its Result
    source: str = "none"  # which drafter proposed the draft: "none", "ngram", "model" or "mtp"

    @classmethod
    def text_tail(cls, text: str, stats: "Stats") -> "Step":
        """The last step of a generation whose text held back its end (TextStream: an unfinished
        character, or what might have begun a stop string): no target call, no token, only that
        text, released at the end."""
        return cls(drafted=[], accepted=0, token=-1, accepted_text="", token_text=text, rejected_text="", stats=stats)


@dataclass
class Result:
    text: str
    tokens: list[int]
    stop_reason: str  # "eos", "max_tokens", "stop", "context_full", "limit" (min_indent, line_seconds)
    stats: Stats
    stop_string: str | None = None  # the stop string that ended it (stop_reason "stop")


@dataclass(frozen=True)
class Finished:
    """The last event of Engine.stream: the generation's Result."""

    result: Result


class Generation:
    """A generation under way, as Engine.start returns it: an iterator of its Steps, one per
    target call; once they have run out, `result` is its Result. Leaving its `with` block (or
    close()) before then stops the generation and frees the engine; `result` then stays unset
    (reading it raises), so a cut-short generation cannot pass for a finished one. `cancel()`,
    from any thread, cuts it short the same way at its next chance: within a long prompt's
    prefill, or after the step under way.

        with engine.start(prompt, max_tokens=64) as generation:
            for step in generation:
                show(step)
        generation.result
    """

    def __init__(
        self,
        steps: Generator[Step, None, Result | None],
        ready: Callable[[], None] = lambda: None,
        in_use: Callable[[], AbstractContextManager] = nullcontext,
        cancel: Callable[[], None] = lambda: None,
    ):
        self._steps = steps  # a generator of Steps whose return value is the Result (None: cut short)
        self._cancel = cancel
        self._ready = ready  # raises while the steps cannot start (before a generator is spent on it)
        self._in_use = in_use  # held while a step runs: the models are not freed under it
        self._started = False
        self._result: Result | None = None
        self._cut_short = False  # its steps ran out with no result: cancelled or closed

    def __iter__(self) -> "Generation":
        return self

    def __next__(self) -> Step:
        if self._result is not None:
            raise StopIteration
        with self._in_use():
            if not self._started:  # a refusal now leaves the generation able to start later
                self._ready()
                self._started = True
            try:
                return next(self._steps)
            except StopIteration as end:  # its value is the Result (None once closed: cut short)
                self._result = end.value
                self._cut_short = end.value is None
                raise StopIteration from None

    @property
    def finished(self) -> bool:
        return self._result is not None

    @property
    def result(self) -> Result:
        if self._result is None and self._cut_short:
            raise RuntimeError("the generation has not finished: it was cut short (cancel() or close())")
        if self._result is None:
            raise RuntimeError("the generation has not finished: its steps were not all taken")
        return self._result

    def __repr__(self) -> str:
        if self._result is not None:
            state = f"finished ({self._result.stop_reason}, {len(self._result.tokens)} tokens)"
        else:
            state = "cut short" if self._cut_short else "running" if self._started else "not started"
        return f"<Generation {state}>"

    def run(self) -> Result:
        """Take the steps left and return the result."""
        for _ in self:
            pass
        return self.result

    def events(self) -> "Events":
        """Engine.stream's form: the Steps, then Finished(result). Closing it closes the generation."""
        return Events(self)

    def close(self) -> None:
        self._cancel()  # a prefill under way in another thread stops at once, not at its end
        with self._in_use():  # a step under way in another thread ends first
            self._steps.close()
        self._cut_short = self._result is None

    def cancel(self) -> None:
        """Cut the generation short from any thread, without waiting: a prompt's prefill stops
        at once on a CPU (llama.cpp asks between the operations of a batch), elsewhere before its
        next batch (n_batch tokens); a generation under way after its step. Its steps then run
        out, with no result, as after close()."""
        self._cancel()

    def __enter__(self) -> "Generation":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class Events:
    """A Generation's Steps, then Finished(result): what Engine.stream returns."""

    def __init__(self, generation: Generation):
        self._generation = generation
        self._done = False

    def __iter__(self) -> "Events":
        return self

    def __repr__(self) -> str:
        return f"<Events of {self._generation!r}>"

    def __next__(self) -> "Step | Finished":
        if self._done:
            raise StopIteration
        try:
            return next(self._generation)
        except StopIteration:
            self._done = True
            if not self._generation.finished:  # closed, or failed on the way: no result to give
                raise
            return Finished(self._generation.result)

    def close(self) -> None:
        self._done = True
        self._generation.close()


class Engine:
    """A loaded target (and optional draft model) that can generate many times.

    `draft_file` (a path and its ModelOptions) names a draft to load only when first needed: the
    auto policy does not load a draft model that its cached costs say cannot pay on this machine.
    The auto policy's state (costs, acceptance statistics, guard) lives here, so it carries over
    from one generation to the next."""

    def __init__(
        self, target: Model, draft: Model | None = None, *, draft_file: tuple[str, ModelOptions] | None = None
    ):
        if draft is not None:
            ensure_compatible(target.path, draft.path, target=target, draft=draft)
        self.target = target
        self.draft = draft
        self.draft_file = draft_file if draft is None else None
        self.mtp = MtpHead(target) if target.n_nextn else None  # the target's own MTP layers
        # Why the auto drafter gave the deferred draft up (its load failed): it never tries again
        self.draft_unavailable: str | None = None
        # Tells the user once that auto goes on without the draft (serve logs it instead)
        self.on_draft_dropped: Callable[[str], None] = warn_draft_dropped
        self.policy: AutoPolicy | None = None
        self.calibration: dict = {}  # how the auto policy's costs were obtained
        self._costs_saved: tuple[float, dict] | None = None  # when save_costs last wrote, and which calibration
        self._fixed_gamma = FIXED_GAMMA
        self._live = False  # a stream is under way: it owns both KV caches until it ends
        # Held while llama.cpp works on the models (a step, a tokenization; see _using_models):
        # close() waits for it, or from within it (a signal handler) leaves the freeing to its end.
        self._in_use = threading.RLock()
        self._user: int | None = None  # the thread inside _using_models
        self.closed = False
        self._models_left = False  # leave_models: close() frees none of them
        self._lanes: weakref.WeakSet[Engine] = weakref.WeakSet()  # open lanes on these weights

    def __repr__(self) -> str:
        return f"<Engine {describe_models(self)}{', closed' if self.closed else ''}>"

    def __enter__(self) -> "Engine":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def has_draft(self) -> bool:
        return self.draft is not None or self.draft_file is not None

    def load_draft(self) -> Model | None:
        """The draft model, loaded now if it was deferred (not into a closed engine: nothing
        would free it)."""
        if self.draft is None and self.draft_file is not None:
            self._check_open()
            path, options = self.draft_file
            try:
                draft = Model(path, options)
            except SpecllmError as e:
                raise DraftNotLoaded(e) from None
            try:
                ensure_compatible(self.target.path, draft.path, target=self.target, draft=draft)
            except SpecllmError as e:
                draft.close()
                raise DraftNotLoaded(e) from None
            self.draft, self.draft_file = draft, None
        return self.draft

    def auto_draft(self) -> Model | None:
        """The draft model for the auto drafter, loaded now if it was deferred. One that cannot
        load (its file went bad, or its context no longer fits in the memory the target left) is
        given up for the engine's life: auto goes on with what it has left (n-gram, MTP, the target
        alone), which it may always choose, and the user is told once. `load_draft`, which an
        explicit model drafter calls, still tries (and fails) each time."""
        if self.draft_unavailable is not None:
            return None
        try:
            return self.load_draft()
        except DraftNotLoaded as e:
            self.draft_unavailable = str(e)
            if self.policy is not None:  # shared with the lanes: none of them prices the draft again
                self.policy.costs.pop("model", None)
            self.on_draft_dropped(self.draft_unavailable)
            return None

    def llama_seconds(self) -> float:
        """Seconds all its models have spent inside llama.cpp's evaluating calls so far."""
        return sum(m.llama_seconds for m in (self.target, self.draft, self.mtp) if m is not None)

    def close(self) -> None:
        """Free the models. A stream under way stops at its next step (SpecllmError), and every
        later call raises SpecllmError: llama.cpp's freed memory is never touched again. Its
        lanes are closed first: their KV caches live on these weights."""
        for lane in list(self._lanes):
            lane.close()
        self.closed = True
        with self._in_use:
            if self._user != threading.get_ident():  # else a call under way frees them when it ends
                self._free_models()

    def leave_models(self) -> None:
        """Let close() free none of the models, for a process that ends with another thread still
        in a llama.cpp call that reads them and cannot be stopped (a server's grammar mask): freed
        under it, the memory it reads would crash the process; the process's end frees them."""
        self._models_left = True

    def _free_models(self) -> None:
        if self._models_left:
            return
        for model in (self.mtp, self.target, self.draft):
            if model is not None:
                model.close()

    @contextmanager
    def _using_models(self):
        """Hold the models for a call into llama.cpp: another thread's close() waits for its end,
        and a close() from inside it (a signal handler) frees them only once it ends."""
        if self._user == threading.get_ident():  # already held by this thread
            yield
            return
        with self._in_use:
            try:  # an interrupt right after taking the lock still leaves _user as it was
                self._user = threading.get_ident()
                yield
            finally:
                self._user = None
                if self.closed:
                    self._free_models()

    @property
    def fixed_gamma(self) -> int:
        """A fixed drafter's draft length where a generation gives none: the command line sets a
        curated pair's recommended one, so `/drafter model` in chat drafts as `--drafter model` does."""
        return self._fixed_gamma

    @fixed_gamma.setter
    def fixed_gamma(self, gamma: int) -> None:
        gamma = whole_number("fixed_gamma", gamma)
        if gamma < 1:
            raise SpecllmError(f"fixed_gamma must be >= 1, got {gamma}")
        check_gamma(gamma, self.target.n_batch)
        self._fixed_gamma = gamma

    def _check_open(self) -> None:
        if self.closed:
            raise SpecllmError("this engine is closed: load the models again")

    def lane(self) -> "Engine":
        """An engine on this one's loaded models (the same weights) with KV caches of its own,
        sharing the auto policy: generations on two lanes can be interleaved step by step. Closing
        this engine closes the lane too."""
        self._check_open()
        draft = self.draft.sibling() if self.draft is not None else None
        twin = Engine(self.target.sibling(), draft, draft_file=self.draft_file)
        twin.policy, twin.calibration, twin.fixed_gamma = self.policy, self.calibration, self.fixed_gamma
        twin.draft_unavailable, twin.on_draft_dropped = self.draft_unavailable, self.on_draft_dropped
        self._lanes.add(twin)
        return twin

    # --- the auto policy's costs ------------------------------------------------------------

    def auto_policy(self, context: list[int]) -> AutoPolicy:
        """The auto policy, created on first use with the models' call costs: from the on-disk
        calibration cache, else measured now on top of `context` (held by the target's KV cache)."""
        if self.policy is None:
            start, measured = time.perf_counter(), []
            target = calibration.load_costs(self._key(self.target))
            if target is None:
                target = calibration.measure(self.target, self._target_widths(), context)
                measured.append("target")
            draft = mtp = None
            if self.has_draft and self.draft_unavailable is None:
                draft = calibration.load_costs(self._draft_key())
                if draft is None and (model := self.auto_draft()) is not None:
                    draft = self._measure_draft(model, context)
                    measured.append("draft")
            if self.mtp is not None:
                mtp = calibration.load_costs(self._mtp_key())
                if mtp is None:
                    mtp = self._measure_mtp(self.mtp, context)
                    measured.append("mtp")
            self.policy = AutoPolicy(target, draft, mtp)
            self.policy.replays = self.target.max_draft == 0  # no snapshots: a rejection is evaluated again
            self._calibrated(start, measured)
        if self.policy.target.drifted():  # since the costs were measured, here or in the cache
            self._measure_again(context)
        return self.policy

    def _measure_again(self, context: list[int]) -> None:
        """The machine's speed changed since the policy's costs were measured (see
        CostTable.drifted): time each loaded model's calls again on top of `context`. A draft
        model that is not loaded keeps its costs, which followed the target's drift."""
        start, policy, measured = time.perf_counter(), self.policy, ["target"]
        assert policy is not None
        policy.target = calibration.measure(self.target, self._target_widths(), context)
        if self.draft is not None and policy.draft is not None:
            policy.costs["model"] = self._measure_draft(self.draft, context)
            measured.append("draft")
        if self.mtp is not None and "mtp" in policy.costs:
            policy.costs["mtp"] = self._measure_mtp(self.mtp, context)
            measured.append("mtp")
        self._calibrated(start, measured)

    @staticmethod
    def _measure_draft(draft: Model, context: list[int]) -> CostTable:
        # a short catch-up that goes one token a call (ModelDrafter) is not timed: it is that many calls
        short = range(2, ONE_TOKEN_CATCH_UP + 1) if draft.one_token_catch_up else range(0)
        widths = tuple(w for w in calibration.DRAFT_WIDTHS if w not in short)
        table = calibration.measure(draft, widths, context[: calibration.DRAFT_CONTEXT])
        table.V.update((w, float(w)) for w in short)
        return table

    @staticmethod
    def _measure_mtp(mtp: MtpHead, context: list[int]) -> CostTable:
        # its inputs are the target's hidden states: timed on the target's context
        return calibration.measure(mtp, calibration.DRAFT_WIDTHS, context)

    def _target_widths(self) -> tuple[int, ...]:
        """The target call widths auto can use: no wider than its longest draft (snapshots) + 1."""
        longest = longest_draft(self.target, Drafter.AUTO)
        return tuple(w for w in calibration.TARGET_WIDTHS if longest is None or w <= longest + 1)

    def _calibrated(self, start: float, measured: list[str]) -> None:
        self.calibration = {
            "measured": measured,  # [] when all came from the cache
            "seconds": time.perf_counter() - start,
            "cache": str(calibration.cache_path()),
        }

    @property
    def fixed_draft_length(self) -> int:
        """A fixed drafter's draft length where a generation gives none: fixed_gamma, within a
        hybrid target's snapshots (0 snapshots: none to keep within, a checkpoint takes it back)."""
        return min(self.fixed_gamma, self.target.max_draft or self.fixed_gamma)

    def save_costs(self) -> None:
        """Write the auto policy's costs to the calibration cache for the next run: at once when
        they were obtained now (measured, or read from the cache), else, as every generation
        refines them, at most every SAVE_COSTS_EVERY seconds. Written after every generation (a
        lock, a whole new file, an fsync), they cost each ~20 ms, more than a short generation
        of a small model takes."""
        if self.policy is None:
            return
        now = time.monotonic()
        if self._costs_saved is not None:
            saved_at, saved_calibration = self._costs_saved
            if saved_calibration is self.calibration and now - saved_at < SAVE_COSTS_EVERY:
                return
        tables = {self._key(self.target): self.policy.target}
        if self.policy.draft is not None and self.has_draft:
            tables[self._draft_key()] = self.policy.draft
        if "mtp" in self.policy.costs and self.mtp is not None:
            tables[self._mtp_key()] = self.policy.costs["mtp"]
        calibration.save_costs(tables)
        self._costs_saved = (now, self.calibration)

    def policy_report(self, calibrated: bool = True) -> dict | None:
        """The auto policy's cost estimates now, for --json and -v; `calibrated`: the generation
        reported on is the one that obtained the costs (a later one measured nothing)."""
        p = self.policy
        if p is None:
            return None
        calibration = dict(self.calibration, reused=not calibrated)
        if not calibrated:
            calibration.update(measured=[], seconds=0.0)
        return {
            "calibration": calibration,
            "target": p.target.to_dict(),
            "draft": p.draft.to_dict() if p.draft else None,
            "c": p.draft.step_seconds / p.target.step_seconds if p.draft else None,
            "model_could_pay": p.model_could_pay(),
            "mtp": p.costs["mtp"].to_dict() if "mtp" in p.costs else None,
            "c_mtp": p.costs["mtp"].step_seconds / p.target.step_seconds if "mtp" in p.costs else None,
            "mtp_could_pay": p.model_could_pay("mtp") if "mtp" in p.costs else None,
            "guard_backoffs": p.guard.backoffs,
            "draft_unavailable": self.draft_unavailable,  # why auto goes on without the draft model
        }

    @staticmethod
    def _key(model: Model) -> str:
        return calibration.model_key(model.path, model.options, model.on_huge_pages)

    def _mtp_key(self) -> str:
        return self._key(self.target) + "|mtp"

    def _draft_key(self) -> str:
        if self.draft is not None:
            return self._key(self.draft)
        if self.draft_file is None:
            raise ValueError("this engine has no draft model")
        return calibration.model_key(*self.draft_file)

    # --- prompts ----------------------------------------------------------------------------

    def prompt_tokens(self, prompt: str | list[int], *, chat: bool = False, system: str | None = None) -> list[int]:
        """Token ids for a prompt: ids are used as given; text gets BOS as the model wants it, and
        with chat=True is first rendered as one user message (after the system message, if any)
        with the model's chat template, or ChatML for a model without one, as chat does."""
        with self._using_models():  # the vocabulary is not freed under the call
            return self._prompt_tokens(prompt, chat, system)

    def chat_prompt(self, message: str, system: str | None = None, variables: dict | None = None) -> str:
        """One user message (after the system message, if any) through the target's chat template
        (ChatML for a model without one), with the template's `variables` ({"enable_thinking":
        False}); what chat=True prompts with."""
        _require_str(message, "a message")  # else the template's own error would take the blame
        check_system(system)
        system_message = [{"role": "system", "content": system}] if system else []
        with self._using_models():  # the template is read from the model: not freed under the call
            self._check_open()
            return self.target.render_chat(system_message + [{"role": "user", "content": message}], variables=variables)

    def infill_prompt(
        self,
        prefix: str,
        suffix: str,
        *,
        files: Sequence[ContextFile] = (),
        line: str = "",
        max_tokens: int | None = None,
    ) -> InfillPrompt:
        """The fill-in-the-middle prompt (token ids) for the gap between `prefix` and `suffix`, with
        other `files` of the project for context (engine/infill.py): the latest that fit in a
        quarter of the context. It leaves room for `max_tokens` (at most half the context; a
        quarter when not given) and cuts the code to do so."""
        with self._using_models():
            self._check_open()
            return gap_prompt(self.target, prefix, suffix, files=files, line=line, max_tokens=max_tokens)

    def _prompt_tokens(self, prompt: str | list[int], chat: bool, system: str | None) -> list[int]:
        self._check_open()
        if not isinstance(chat, bool):  # chat="no" would be taken as yes
            raise SpecllmError(f"chat must be True or False, got {chat!r}")
        check_system(system)
        if not isinstance(prompt, str):
            if chat or system is not None:
                raise SpecllmError("chat and system apply to a text prompt: token ids are used as given")
            return self._token_ids(prompt)
        if system is not None and not chat:
            raise SpecllmError("a system message needs chat=True (the chat template)")
        if chat:
            prompt = self.chat_prompt(prompt, system)
        return text_tokens(self.target, prompt)

    def _token_ids(self, prompt) -> list[int]:
        if isinstance(prompt, (bytes, bytearray)) or not isinstance(prompt, Iterable):
            raise SpecllmError(f"a prompt is text (a str) or a list of token ids, not {type(prompt).__name__}")
        if isinstance(prompt, (AbstractSet, Mapping)):  # no order of its own: the ids would be shuffled
            raise SpecllmError(f"a prompt's token ids are a list, in order, not a {type(prompt).__name__}")
        ids, n_vocab = [], self.target.n_vocab
        for token in prompt:
            token = whole_number("a token id", token)
            if not 0 <= token < n_vocab:
                raise SpecllmError(f"token id {token} is outside the vocabulary (0 to {n_vocab - 1})")
            ids.append(token)
        return ids

    # --- generation -------------------------------------------------------------------------

    def generate(
        self,
        prompt: str | list[int],
        config: GenerationConfig | None = None,
        *,
        chat: bool = False,
        system: str | None = None,
        **kwargs: "Unpack[GenerationOptions]",
    ) -> Result:
        """The whole generation at once (what `stream` takes): its Result. The engine is free again
        when it returns, or raises."""
        with self.start(prompt, config, chat=chat, system=system, **kwargs) as generation:
            return generation.run()

    def stream(
        self,
        prompt: str | list[int],
        config: GenerationConfig | None = None,
        *,
        chat: bool = False,
        system: str | None = None,
        **kwargs: "Unpack[GenerationOptions]",
    ) -> Events:
        """Yield a Step per target call, then Finished. Give either a GenerationConfig or keywords
        (max_tokens, drafter, gamma, stop, temperature, top_k, ...; those not given take the
        defaults), not both. One stream at a time per engine: the models' KV caches are shared, so
        a second stream is refused until the first has finished or been closed. `start` gives the
        same generation as an iterator of Steps with a `result`."""
        return self.start(prompt, config, chat=chat, system=system, **kwargs).events()

    def start(
        self,
        prompt: str | list[int],
        config: GenerationConfig | None = None,
        *,
        chat: bool = False,
        system: str | None = None,
        prepared: "PreparedGrammar | None" = None,
        **kwargs: "Unpack[GenerationOptions]",
    ) -> Generation:
        """The generation `stream` yields the events of, as a Generation: its Steps, then its
        `result`. Bad options and prompts are refused now, before the first step. `prepared`: the
        config's grammar made already (prepare_grammar), used where it fits this prompt."""
        if config is not None and kwargs:
            raise TypeError(f"give a GenerationConfig or keywords, not both (got {', '.join(sorted(kwargs))})")
        if config is None:
            config = make_config(**kwargs)
        elif not isinstance(config, GenerationConfig):  # a dict of options would be half read, or ignored when empty
            raise SpecllmError(f"config must be a GenerationConfig, got {type(config).__name__}")
        self._check_idle()
        with self._using_models():  # preparing the run reads the models too (its drafter, their limits)
            if isinstance(prompt, str):  # a prompt that cannot fit is refused before it is all tokenized
                self._check_open()
                check_fits(self.target, prompt)
            tokens = self.prompt_tokens(prompt, chat=chat, system=system)
            run = _Run(self, tokens, config, prepared)
        return Generation(self._own(run), ready=self._check_ready, in_use=self._using_models, cancel=run.cancelled.set)

    def _check_idle(self) -> None:
        if self._live:
            raise SpecllmError(
                "another stream of this engine is still running: finish or close() it first "
                "(the models' KV caches are shared)"
            )

    def _check_ready(self) -> None:
        self._check_open()  # closed between start and the first step
        self._check_idle()  # two streams created, then both started

    def _own(self, run: "_Run") -> Generator[Step, None, Result | None]:
        """Run's steps and result, holding the engine from the first step until the run ends or is
        closed (the Generation checks _check_ready just before that first step)."""
        self._live = True
        try:
            return (yield from run.steps())
        finally:
            self._live = False


def _require_str(value, what: str) -> None:
    if not isinstance(value, str):
        raise SpecllmError(f"{what} is text (a str), not {type(value).__name__}")


def _check_text(text, what: str) -> None:
    _require_str(text, what)
    check_utf8(text, what)


CHARS_PER_TOKEN_AT_MOST = 16  # of ordinary text; a text's first n_ctx times this many decide


def check_fits(model, text: str, what: str = "the prompt") -> None:
    """A text far longer than the context (a 100 MB file piped to `run -`) is refused from the
    tokens of its start: tokenizing all of it would take seconds and gigabytes (a Python int per
    token) per 100 MB, and a chat template would first fail on its size and take the blame.
    Twice the context: a cut in the middle of a word changes only the tokens near it. A text of
    longer tokens than that is tokenized whole, as before."""
    head = text[: model.n_ctx * CHARS_PER_TOKEN_AT_MOST]
    if len(head) == len(text):
        return
    check_utf8(head, what)  # what the tokenizer cannot take
    n = len(model.tokenize(head, add_special=False, parse_special=True))
    if n >= 2 * model.n_ctx:
        raise ContextFull(n, model.n_ctx, what, detail=f" in its first {len(head)} of {len(text)} characters")


def warn_draft_dropped(reason: str) -> None:
    report.say(f"warning: the draft model could not be loaded, so auto goes on without it: {reason}")


def describe_models(engine: Engine) -> str:
    """The engine's models by file name, for a status line: "target.gguf + draft.gguf"."""
    models = engine.target.path.name
    if engine.draft is not None:
        models += f" + {engine.draft.path.name}"
    elif engine.draft_file is not None:
        models += f" + {Path(engine.draft_file[0]).name} (loaded when it pays)"
    return models


class _LazyRows(Generic[RowT]):
    """What verification reads of each target row (its argmax, or its processed distribution),
    computed only for the rows it reads: it stops at the first rejection, so the rows after it
    cost nothing."""

    def __init__(self, logits: np.ndarray, read: Callable[[np.ndarray], RowT]):
        self._logits, self._read = logits, read
        self._rows: dict[int, RowT] = {}

    def __len__(self) -> int:
        return len(self._logits)

    def __getitem__(self, i: int) -> RowT:
        if i not in self._rows:
            self._rows[i] = self._read(self._logits[i])
        return self._rows[i]


def check_system(system: str | None) -> None:
    if system is not None:
        _require_str(system, "a system message")


def make_config(**kwargs) -> GenerationConfig:
    sampler_keys = SamplerSettings.__dataclass_fields__.keys()
    sampler_kwargs = {k: v for k, v in kwargs.items() if k in sampler_keys}
    if "sampler" in kwargs and sampler_kwargs:  # one would be dropped
        raise TypeError(
            f"give a sampler or its keywords, not both (got sampler and {', '.join(sorted(sampler_kwargs))})"
        )
    sampler = kwargs.pop("sampler") if "sampler" in kwargs else SamplerSettings(**sampler_kwargs)
    rest = {k: v for k, v in kwargs.items() if k not in sampler_keys}
    unknown = set(rest) - set(GenerationConfig.__dataclass_fields__)
    if unknown:
        raise TypeError(f"unknown generation options: {', '.join(sorted(unknown))}")
    return GenerationConfig(sampler=sampler, **rest)


def output_grammar(
    target: Model, config: GenerationConfig, prompt: list[int], prepared: "PreparedGrammar | None" = None
) -> OutputGrammar | None:
    """The grammar the generation's text must follow, over the target's vocabulary, or None: after
    the reasoning where the prompt opened a think block (constrained.where_it_applies). The one
    `prepared` already when it was made for this config and a prompt that ends the same way."""
    if config.json_schema is None and config.grammar is None:
        return None
    end = prompt_end(target, prompt)
    made = prepared.take(config, end) if prepared is not None else None
    if made is not None:
        return made
    text = grammar_text(config)
    assert text is not None
    return _applied(target, config, text, end)


def grammar_text(config: GenerationConfig) -> str | None:
    """The GBNF of the config's grammar or JSON schema, as the user asked for it (before it is
    placed after a reasoning, beside a tool call or in gpt-oss's final message); None: none."""
    if config.json_schema is not None:
        return schema_grammar(config.json_schema)
    return config.grammar


def _applied(target: Model, config: GenerationConfig, text: str, end: str) -> OutputGrammar:
    """GBNF `text` where it applies after a prompt ending with `end` (where_it_applies)."""
    calls = (config.call_opening or "", tuple(config.calls_in_reasoning), tuple(config.call_names))
    return where_it_applies(target, text, end, *calls)


def prompt_end(target: Model, prompt: list[int]) -> str:
    """A prompt's last tokens as text: where the grammar applies is read from them (a think block
    the prompt opened). On gpt-oss's vocabulary they go back to the start of the message the
    prompt ends in (constrained.message_start), however much text the prompt wrote in it (an
    analysis begun for the model): bounded by the message, not by a count."""
    begins = min(len(prompt) - PROMPT_END_TOKENS, message_start(target, prompt))
    return target.detokenize(prompt[max(0, begins) :]).decode("utf-8", errors="replace")


def grammar_asked(config: GenerationConfig, end: str) -> tuple:
    """What makes a generation's grammar: the config's fields that output_grammar reads, and the
    end of the prompt it follows."""
    calls = (config.call_opening, config.calls_in_reasoning, config.call_names)
    return (config.grammar, config.json_schema, *calls, end)


@dataclass
class PreparedGrammar:
    """A generation's grammar made before the engine is free (prepare_grammar), used once: by the
    generation whose config asks for the same grammar after a prompt that ends the same way (its
    prompt's tokens may differ from those it was made for: a prompt cache reuses tokens)."""

    asked: tuple  # grammar_asked's, for the config and prompt it was made for
    made: OutputGrammar | None
    text: str  # grammar_text's: the answer's own grammar (first_mask_seconds times it)

    def take(self, config: GenerationConfig, end: str) -> OutputGrammar | None:
        made, self.made = self.made, None
        if made is None or grammar_asked(config, end) == self.asked:
            return made
        made.close()
        return None


def prepare_grammar(target: Model, prompt: list[int], config: GenerationConfig) -> PreparedGrammar | None:
    """The grammar `config` asks for after `prompt`, made ahead for Engine.start (its `grammar`), or
    None when it asks for none. It reads only the target's vocabulary, never its context or KV
    cache: a server makes it beside the generation under way, the engine kept open meanwhile. Bad
    grammars raise here as they would in start."""
    text = grammar_text(config)
    if text is None:
        return None
    end = prompt_end(target, prompt)
    return PreparedGrammar(grammar_asked(config, end), _applied(target, config, text, end), text)


def first_mask_seconds(target: Model, text: str) -> float:
    """How long GBNF `text` (grammar_text's) takes to say which tokens of the target's whole
    vocabulary may begin the answer: the costliest mask a first step computes (a sampled row
    without top-k; greedy and top-k ask fewer tokens). Counting rules cannot tell a grammar whose
    every mask takes seconds from a real schema; timing one can. The answer's own grammar is timed,
    not the generation's first step: that may be in a reasoning or gpt-oss's analysis, free of it,
    the answer's masks coming later. It reads only the vocabulary, so a server measures it beside
    the generation under way."""
    grammar = Grammar(target, text)
    try:
        find_probes(target)  # once per model, not the grammar's cost
        started = time.perf_counter()
        grammar.allowed(np.arange(target.n_vocab))
        return time.perf_counter() - started
    finally:
        grammar.close()


def gap_prompt(
    target: Model,
    prefix: str,
    suffix: str,
    *,
    files: Sequence[ContextFile] = (),
    line: str = "",
    max_tokens: int | None = None,
) -> InfillPrompt:
    """Engine.infill_prompt's prompt. It reads only the vocabulary (a server makes it beside the
    generation under way)."""
    for text, what in ((prefix, "the prefix"), (suffix, "the suffix"), (line, "the cursor's line")):
        _check_text(text, what)
    for file in files:
        if not isinstance(file, ContextFile):
            raise SpecllmError(f"files are ContextFile(name, text)s, not {type(file).__name__}")
        _check_text(file.name, "a file's name")
        _check_text(file.text, f"the text of {file.name}")
    if max_tokens is not None and whole_number("max_tokens", max_tokens) < 1:
        raise SpecllmError(f"max_tokens must be >= 1, got {max_tokens}")
    n_ctx = target.n_ctx
    reply = n_ctx // 4 if max_tokens is None else min(max_tokens, n_ctx // 2)
    budget, files_room = n_ctx - reply, int(n_ctx * FILES_SHARE)
    return infill_prompt(target, prefix, suffix, budget=budget, files_room=files_room, files=files, line=line)


def text_tokens(target: Model, text: str) -> list[int]:
    """A text prompt's tokens: BOS as the model wants it, its control tokens read as such. It reads
    only the vocabulary (a server tokenizes beside the generation under way)."""
    _check_text(text, "the prompt")
    tokens = target.tokenize(text, add_special=True, parse_special=True)
    if len(tokens) > 1 and tokens[0] == tokens[1] == target.bos:  # template added one too
        tokens = tokens[1:]
    return tokens


def check_snapshots(drafter: str, gamma: int | None, target: Model) -> None:
    """A hybrid target takes back rejected draft tokens with its recurrent-state snapshots: a fixed
    drafter's draft must fit in them (auto's gamma is only its longest, and auto keeps within them)."""
    if gamma is None or drafter in (Drafter.AUTO, Drafter.NONE):
        return
    if target.max_draft and gamma > target.max_draft:
        raise DraftTooLong(gamma, target.max_draft, target.path.name, target.state_bytes)


def longest_draft(target: Model, drafter: str) -> int | None:
    """The longest draft a generation may verify on this target (None: no limit). A hybrid keeps
    its snapshots; a model whose recurrent layers llama.cpp keeps none of (Mamba, RWKV, Granite 4,
    Jamba) takes a rejection back from a checkpoint and evaluates the kept tokens again: no limit,
    but a second target call, which auto counts in its costs."""
    limit = target.max_draft
    if limit is None or drafter == Drafter.NONE:
        return None
    if not target.can_take_back:
        if drafter != Drafter.AUTO:
            raise CannotTakeBack(
                f"this llama-cpp-python build ({llama_cpp_python_version()}) cannot take rejected draft tokens "
                f"back out of the recurrent state of {target.path.name}: install llama-cpp-python 0.3.36 or later"
            )
        return 0
    return limit or None


def draft_limit_note(target: Model) -> str | None:
    """Why auto's drafts on this target are limited, or cost more (for -v), or None."""
    limit, name = target.max_draft, target.path.name
    if limit is None:
        return None
    if not target.can_take_back:
        return (
            f"no drafts: this llama-cpp-python build cannot take rejected tokens back out of {name}'s recurrent state"
        )
    if limit > 0:
        return (
            f"drafts of at most {limit} tokens: {name} is a hybrid model, whose rejected draft tokens are "
            f"taken back with its {limit} recurrent-state snapshots "
            f"({human_size(target.state_bytes)} each; --snapshots)"
        )
    return (
        f"{name} has recurrent layers and llama.cpp keeps no snapshots of their state: a rejected draft is "
        "taken back from a checkpoint and the kept tokens are evaluated again, a second target call that auto "
        "counts in each draft's cost"
    )


def check_gamma(gamma: int, n_batch: int) -> None:
    """A verify call evaluates gamma + 1 tokens and reads a logit row for each: they must fit in
    one batch of the target's context (n_batch: 512, or the context size if smaller)."""
    if gamma >= n_batch:
        raise GammaTooLong(gamma, n_batch)


class _Run:
    """State of one generation."""

    def __init__(
        self, engine: Engine, prompt: list[int], config: GenerationConfig, prepared: PreparedGrammar | None = None
    ):
        target = engine.target
        if not prompt:
            raise SpecllmError("the prompt is empty")
        if len(prompt) >= target.n_ctx:
            raise ContextFull(len(prompt), target.n_ctx)
        if config.gamma is not None:  # auto's own lengths stay within the batch (see steps)
            check_gamma(config.gamma, target.n_batch)
            check_snapshots(config.drafter, config.gamma, target)
        self.engine, self.target, self.config, self.sampler = engine, target, config, config.sampler
        self.longest_draft = longest_draft(target, config.drafter)
        self.rng = np.random.default_rng(config.sampler.seed)
        self.grammar = output_grammar(target, config, prompt, prepared)
        self.drafter = self._make_drafter(engine)
        self.context = list(prompt)
        self.generated: list[int] = []
        self.text = TextStream(config.stop, config.min_indent, config.line_seconds)
        self.stats = Stats(prompt_tokens=len(prompt))
        self.calibrated = False  # this generation obtained auto's costs (see _auto_drafter)
        self.cancelled = threading.Event()  # Generation.cancel

    def current_grammar(self) -> OutputGrammar | None:
        """The grammar after the text so far (a drafter's view of it)."""
        return self.grammar

    def _make_drafter(self, engine: Engine):
        name = self.config.drafter
        if name == Drafter.MODEL:
            draft = engine.load_draft()
            if draft is None:
                raise NeedsDraftModel()
            return ModelDrafter(draft, self.sampler, self.rng, grammar=self.current_grammar)
        if name == Drafter.MTP:
            if engine.mtp is None:
                raise NoMtpLayers(self.target.path.name)
            return ModelDrafter(engine.mtp, self.sampler, self.rng, name="mtp", grammar=self.current_grammar)
        if name == Drafter.AUTO:
            return NoDrafter()  # until _prefill: the policy's calibration needs the prompt in the KV cache
        if name == Drafter.NGRAM:
            min_match = GPU_MIN_MATCH if self.target.on_gpu else CPU_MIN_MATCH
            return NgramDrafter(min_match=min_match, markup=self.target.markup_tokens)
        return NoDrafter()

    def steps(self) -> Generator[Step, None, Result | None]:
        """A Step per target call (and a last text_tail step when the end releases held-back
        text); returns the Result, or None once cancelled."""
        try:
            self._prefill()
        except Interrupted:
            self.engine._check_open()  # closed during the prefill: said, as at a step
            return None
        # decode_seconds counts the engine's own time: the clock stops while the consumer holds a
        # step (rendering it, writing to a slow pipe), between the yield and the next request.
        start, in_llama = time.perf_counter(), self.engine.llama_seconds()
        reason = None
        while reason is None:
            self.engine._check_open()  # closed while the consumer held the last step
            if self.cancelled.is_set():
                return None
            # A step evaluates [last, d_1..d_k] on top of len(context) - 1 cached tokens.
            room = self.target.n_ctx - len(self.context)
            if room < 0:
                reason = "context_full"
                break
            budget = self.config.max_tokens - len(self.generated) - 1  # the step adds one more
            longest = min(self.config.draft_length(self.engine.fixed_gamma), room, budget, self.target.n_batch - 1)
            if self.longest_draft is not None:
                longest = min(longest, self.longest_draft)
            step, reason = self._step(longest)
            self.stats.decode_seconds += time.perf_counter() - start
            self.stats.llama_seconds += self.engine.llama_seconds() - in_llama
            yield step
            start, in_llama = time.perf_counter(), self.engine.llama_seconds()
        self.drafter.finish(self.context)
        if self.config.drafter == Drafter.AUTO:
            self.engine.save_costs()
            self.stats.policy = self.engine.policy_report(calibrated=self.calibrated)
            if self.stats.policy is not None:
                self.stats.policy["draft_limit"] = draft_limit_note(self.target)
        tail = self.text.finish()
        if self.text.stopped and not self.text.limited:  # a character left unfinished at the end,
            reason = "stop"  # shown as U+FFFD, completed a stop string
        self.stats.decode_seconds += time.perf_counter() - start
        self.stats.llama_seconds += self.engine.llama_seconds() - in_llama
        if tail:
            yield Step.text_tail(tail, self.stats)
        return Result(self.text.text, self.generated, reason, self.stats, self.text.stop_string)

    def _stopping(self) -> bool:
        """Whether a prefill under way should stop: the generation was cancelled, or its engine
        closed (from another thread, which waits for the call under way to end)."""
        return self.cancelled.is_set() or self.engine.closed

    def _prefill(self) -> None:
        start, evaluated = time.perf_counter(), self.target.n_evaluated
        # Whatever the KV cache already holds of this prompt (an earlier turn) is reused; a
        # recurrent state may have to evaluate more than the tokens after the common prefix again.
        with interruptible(self._stopping):  # not auto's calibration: its timings stay clean
            self.target.sync(self.context[:-1])
        self.stats.prefill_tokens = self.target.n_evaluated - evaluated
        self.target.checkpoint("prompt")  # a recurrent state: the next prompt (a chat's next turn) resumes here
        if self.config.drafter == Drafter.AUTO:
            self.drafter = self._auto_drafter()
        with interruptible(self._stopping):
            self.drafter.prefill(self.context)
        self.stats.prefill_seconds = time.perf_counter() - start - self.stats.calibration_seconds

    def _auto_drafter(self) -> AutoDrafter:
        engine = self.engine
        before = engine.calibration
        policy = engine.auto_policy(self.context[:-1])
        # costs obtained now (on first use, or again once the machine's speed changed) come with
        # a new account of how they were
        self.calibrated = engine.calibration is not before
        if self.calibrated and engine.calibration["measured"]:  # reading the cache is not calibrating
            self.stats.calibration_seconds = engine.calibration["seconds"]
        model = mtp = None
        if policy.model_could_pay() and (draft := engine.auto_draft()) is not None:
            model = ModelDrafter(draft, self.sampler, self.rng, grammar=self.current_grammar)
        if policy.model_could_pay("mtp") and engine.mtp is not None:
            mtp = ModelDrafter(engine.mtp, self.sampler, self.rng, name="mtp", grammar=self.current_grammar)
        return AutoDrafter(policy, model, self.target.markup_tokens, mtp)

    def _step(self, gamma: int) -> tuple[Step, str | None]:
        draft = self.drafter.propose(self.context, gamma) if gamma > 0 else Draft()
        draft.tokens = draft.tokens[:gamma]
        if self.grammar is not None and draft.source == "ngram":
            draft.tokens = allowed_prefix(self.grammar, draft.tokens)
        t0 = time.perf_counter()
        if draft.tokens and self.target.recurrent and len(draft.tokens) > self.target.snapshots:
            self.target.checkpoint()  # more than its snapshots can take back
        verdict, rows = self._verify(draft)
        if isinstance(rows, GrammarRows):
            self.grammar = rows.advance(verdict.n_accepted, verdict.token)
        verify_seconds = time.perf_counter() - t0
        self.stats.verify_seconds += verify_seconds
        self.stats.draft_seconds += draft.seconds
        self.stats.draft_calls += draft.calls
        kept = draft.tokens[: verdict.n_accepted]
        # The target evaluated [last, d_1..d_k]; keep only what was accepted.
        self.target.truncate(len(self.context) + len(kept))
        source = draft.source if draft.tokens or draft.calls else "none"
        step, reason = self._emit(draft.tokens, kept, verdict.token, source)
        self.stats.record(len(draft.tokens), step.accepted, source)
        self.drafter.observe(draft, verdict.n_accepted, verify_seconds, self.context)
        return step, reason

    def _verify(self, draft: Draft):
        # A draft token outside the target's vocabulary (a draft vocab may be larger) has p = 0:
        # it is rejected for certain, so the target is shown only the tokens before it and gives
        # the row p_i its rejection samples from. The tokens after it are never reached.
        n = next((i for i, t in enumerate(draft.tokens) if t >= self.target.n_vocab), len(draft.tokens))
        logits = self.target.eval([self.context[-1], *draft.tokens[:n]], n + 1)
        try:
            if self.sampler.greedy:
                argmax = self._rows(logits, greedy_token, draft.tokens)
                return verify_greedy(draft.tokens, argmax), argmax
            distributions = self._rows(logits, lambda row: sparse_distribution(row, self.sampler), draft.tokens)
            return verify_sampled(draft.tokens, draft.q, distributions, self.rng), distributions
        except LogitsNotFinite:
            raise LogitsNotFinite(f"the target model ({self.target.path.name})") from None

    def _rows(
        self, logits: np.ndarray, read: Callable[[np.ndarray], RowT], draft: list[int]
    ) -> "_LazyRows[RowT] | GrammarRows[RowT]":
        """The target rows as verification reads them: masked by the grammar, if there is one."""
        if self.grammar is None:
            return _LazyRows(logits, read)
        return GrammarRows(logits, read, self.grammar, draft, self.sampler)

    def _emit(self, drafted: list[int], kept: list[int], token: int, source: str) -> tuple[Step, str | None]:
        """Append the accepted tokens and the target's token, honouring EOS, max tokens, stops.
        Accepted draft tokens after the one that ends the generation (an EOS, or the token that
        completes a stop string) are never emitted: Step.accepted counts up to that one only."""
        accepted_text, reason, n_used = "", None, 0
        for tok in kept:
            accepted_text += self._append(tok)
            n_used += 1
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
        rejected = self._draft_text(drafted[len(kept) :])
        step = Step(
            drafted=drafted,
            accepted=n_used,
            token=token,
            accepted_text=accepted_text,
            token_text=token_text,
            rejected_text=rejected,
            stats=self.stats,
            source=source,
        )
        return step, reason

    def _draft_text(self, tokens: list[int]) -> str:
        """Text of draft tokens, for display."""
        return b"".join(self._draft_piece(t) for t in tokens).decode("utf-8", errors="replace")

    def _draft_piece(self, token: int) -> bytes:
        """A draft token's bytes; an id the target lacks is the draft model's own (no other
        drafter proposes one)."""
        if token < self.target.n_vocab:
            return self.target.piece(token)
        if self.engine.draft is None:
            raise ValueError(f"draft token {token} is outside the target's vocabulary, and there is no draft model")
        return self.engine.draft.piece(token)

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
            return "limit" if self.text.limited else "stop"
        if len(self.generated) >= self.config.max_tokens:
            return "max_tokens"
        return None

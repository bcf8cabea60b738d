"""A chat session on top of the engine: history, rendering to tokens, overflow trimming, settings,
transcripts. `ChatSession` never prints and needs no terminal: the terminal front end `specllm
chat` runs, slash commands included, is chat/repl.py.

Staying fast turn after turn rests on the engine's KV reuse: a turn's prompt is the whole
conversation rendered with the target's chat template, and engine/prompt_cache.py turns it into
tokens that reuse the previous turn's tokens (the reply as generated included) when the text
extends it, else the longest common token prefix with what the KV cache holds.
"""

import dataclasses
import json
import threading
from collections.abc import Generator
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from specllm.engine.functionary import asks_recipient
from specllm.engine.loop import (
    DRAFTERS,
    Engine,
    Generation,
    GenerationConfig,
    Result,
    Stats,
    Step,
    aggregate,
    check_fits,
    check_gamma,
    check_snapshots,
)
from specllm.engine.names import Drafter
from specllm.engine.prompt_cache import PromptCache
from specllm.engine.reasoning import CLOSINGS, Split, closing_marker, split_reasoning
from specllm.engine.sampling import MAX_SEED, default_seed
from specllm.engine.text import check_utf8
from specllm.errors import ContextFull, NeedsDraftModel, SpecllmError
from specllm.files import read_text_file, write_text_atomic

SYSTEM_PROMPT = "the system prompt"  # ContextFull's `what` when the system prompt alone does not fit


@dataclass
class Turn:
    """One user message and the reply to it."""

    user: str
    reply: str = ""
    stop_reason: str = ""  # eos, max_tokens, stop, context_full, or interrupted (the partial reply kept)
    stats: Stats | None = None
    in_context: bool = True  # False once dropped to make room in the context
    seed: int | None = None  # this turn's own seed, derived from the session's (turn_seed)
    reasoning: str = ""  # a thinking model's reasoning, apart from its answer (the reply)

    def messages(self) -> list[dict]:
        """As the chat template gets them: a thinking model's reasoning as reasoning_content,
        which a template renders (Qwen3.5's, in the turns after the last user message) or not.
        A reply that writes a think block's closing marker gets it even when empty: a template
        given none looks for the reasoning in the reply, up to a "</think>" (Qwen3's, Qwen3.5's,
        GLM's, MiniMax M2's) or a "</mm:think>" (MiniMax M3's), and would cut off the part of the
        answer before it."""
        reply: dict[str, str] = {"role": "assistant", "content": self.reply}
        if self.reasoning or any(closing in self.reply for closing in CLOSINGS):
            reply["reasoning_content"] = self.reasoning
        return [{"role": "user", "content": self.user}, reply]

    def to_dict(self) -> dict:
        d: dict[str, object] = {"user": self.user, "reply": self.reply, "stop_reason": self.stop_reason}
        if self.reasoning:
            d["reasoning"] = self.reasoning
        d["interrupted"] = self.stop_reason == "interrupted"
        d["dropped_from_context"] = not self.in_context
        d["seed"] = self.seed
        d["stats"] = self.stats.to_dict() if self.stats else None
        return d


@dataclass
class Prepared:
    """A turn ready to generate: the prompt tokens and how they relate to the previous turn."""

    turn: Turn
    text: str  # the rendered conversation, ending with the template's assistant header
    tokens: list[int]
    reused: int  # leading tokens of the previous turn's prompt + reply: in the KV cache (after /load: not yet)
    extended: bool  # the text extended the previous turn's text exactly (tokens reused as they were)
    dropped: list[Turn] = field(default_factory=list)  # oldest turns dropped to fit the context
    notices: list[str] = field(default_factory=list)


class ChatSession:
    """A conversation with an engine. Typical use:

    prepared = session.prepare("Hello")   # may drop old turns (prepared.notices say so)
    with session.stream(prepared) as reply:   # a Generation
        for step in reply: ...
    reply.result
    """

    def __init__(
        self,
        engine: Engine,
        config: GenerationConfig,
        system: str | None = None,
        template_variables: dict | None = None,
    ):
        self.engine = engine
        # More variables for the chat template ({"enable_thinking": False}: --no-think)
        self.template_variables = template_variables
        # One seed for the whole session (config.sampler.seed, shown in /stats and /save); each
        # reply draws from its own stream derived from it (turn_seed), so no two replies repeat
        # one random stream, not even the same message after /reset.
        seed = default_seed(config.sampler.seed)
        self.config = dataclasses.replace(config, sampler=dataclasses.replace(config.sampler, seed=seed))
        self.replies_started = 0  # every reply of the session, /reset or not: the next stream's index
        self.system = system or None
        self.turns: list[Turn] = []  # the conversation since the last /reset, dropped turns included
        self._unfinished: tuple[Prepared, list[str]] | None = None  # the reply being generated, so far
        self.unanswered: str | None = None  # a loaded chat's last message, which got no reply: to send again
        # Every turn of the session added up, for /stats: a running sum, not a list of every
        # turn's Stats, which grew for as long as the chat ran, /reset or not.
        self.session_stats = Stats()
        self.turns_counted = 0
        self.interrupted = 0
        self.dropped = 0
        # The previous turn's transcript, prompt + reply, as text and as the tokens in the KV cache.
        self.cache = PromptCache(engine)
        self.notices: list[str] = []
        if engine.target.chat_template() is None:
            self.notices.append(f"{engine.target.path.name} has no chat template: using ChatML")

    # --- a turn -----------------------------------------------------------------------------

    def prepare(self, message: str) -> Prepared:
        """Render the conversation plus `message` to prompt tokens, dropping the oldest turns when
        the prompt would leave no room for a reply. Raises SpecllmError for a message that does
        not fit the context on its own."""
        # Checked before rendering: a position in the rendered conversation means nothing to the user.
        check_utf8(message, "the message")
        check_fits(self.engine.target, message, "the message")  # not a template's failure on its size
        turn = Turn(message)
        live = [t for t in self.turns if t.in_context]
        prepared = self._render(live, turn)
        if len(prepared.tokens) + self._reserve() > self.n_ctx:
            prepared = self._drop_oldest(live, turn)
        return prepared

    def stream(self, prepared: Prepared) -> Generation:
        """Generate the reply: its Steps, then its `result`. The turn joins the history when the
        generation ends or is cut short (KeyboardInterrupt inside, the consumer closing it, or
        its cancel() from any thread): a partial reply is kept, marked "interrupted"; a reply
        stopped before its first token is dropped with its message."""
        cancelled = threading.Event()
        started: list[Generation] = []  # the engine's generation, once the first step starts it

        def cancel() -> None:
            cancelled.set()  # first: a generation started after this sees it
            for generation in started:
                generation.cancel()

        # Held while a step runs: a close() from another thread waits for it, as an engine
        # generation's does, rather than closing the reply's generator while it executes.
        stepping = threading.RLock()
        return Generation(self._reply(prepared, started, cancelled), in_use=lambda: stepping, cancel=cancel)

    def _reply(
        self, prepared: Prepared, started: list[Generation], cancelled: threading.Event
    ) -> Generator[Step, None, Result | None]:
        """The reply's steps, from its first step on (nothing happens before: closed before it
        started, the reply leaves no trace); returns its result (None: cancelled)."""
        result, stats = None, None
        pieces: list[str] = []
        prepared.turn.seed = turn_seed(self.config.sampler.seed, self.replies_started)
        self.replies_started += 1
        sampler = dataclasses.replace(self.config.sampler, seed=prepared.turn.seed)
        stop = (*self.config.stop, *self.engine.target.chat_stops)  # a turn's end the model may spell out
        config = dataclasses.replace(self.config, sampler=sampler, stop=stop)
        self._unfinished = (prepared, pieces)
        try:
            with self.engine.start(prepared.tokens, config) as generation:
                started.append(generation)
                if cancelled.is_set():  # cancelled before this generation was there to hear it
                    generation.cancel()
                for step in generation:
                    pieces.append(step.accepted_text + step.token_text)
                    stats = step.stats
                    yield step
                result = generation.result if generation.finished else None
        finally:
            self._unfinished = None
            self._commit(prepared, result, "".join(pieces), stats)
        return result

    def send(self, message: str) -> Result:
        """prepare + stream to the end; returns the Result (for library use and tests)."""
        with self.stream(self.prepare(message)) as reply:
            return reply.run()

    @property
    def generating(self) -> bool:
        """A reply is being generated (its message is not in the turns yet)."""
        return self._unfinished is not None

    @property
    def n_ctx(self) -> int:
        return self.engine.target.n_ctx

    def _reserve(self) -> int:
        """Room a turn wants for its reply: max tokens, but at most a quarter of the context."""
        return min(self.config.max_tokens, self.n_ctx // 4)

    def messages(self, turns: list[Turn] | None = None, pending: Turn | None = None) -> list[dict]:
        turns = [t for t in self.turns if t.in_context] if turns is None else turns
        msgs = [{"role": "system", "content": self.system}] if self.system else []
        for t in turns:
            msgs += t.messages()
        if pending is not None:
            msgs.append({"role": "user", "content": pending.user})
        return msgs

    def _render(self, turns: list[Turn], pending: Turn) -> Prepared:
        text = self.render(self.messages(turns, pending))
        prompt = self.cache.prompt(text)
        return Prepared(pending, text, prompt.tokens, prompt.reused, prompt.extended)

    def render(self, messages: list[dict]) -> str:
        """The conversation through the target's chat template, with the session's variables."""
        return self.engine.target.render_chat(messages, variables=self.template_variables)

    def _drop_oldest(self, live: list[Turn], pending: Turn) -> Prepared:
        alone = self._render([], pending)
        if len(alone.tokens) >= self.n_ctx:
            raise self._too_long(len(alone.tokens))
        # Drop a quarter of the context more than needed, so the next turns do not each have to
        # drop again and re-prefill the whole remaining history.
        goal = self.n_ctx - self._reserve() - self.n_ctx // 4
        # The fewest oldest turns to drop, found by bisection: the prompt only shortens as more are
        # dropped, and rendering every candidate in turn took minutes for a loaded conversation
        # of thousands of turns (each render is the whole conversation). Dropping all of them is
        # the last resort.
        fits, too_long = len(live), 0
        while fits - too_long > 1:
            n = (too_long + fits) // 2
            if len(self._render(live[n:], pending).tokens) <= goal:
                fits = n
            else:
                too_long = n
        drop = fits
        prepared = self._render(live[drop:], pending) if drop < len(live) else alone
        prepared.dropped = live[:drop]
        if drop:
            prepared.notices.append(
                f"context full: dropped the {drop} oldest turn{'s' * (drop != 1)}; "
                f"prefilling the {len(prepared.tokens)}-token conversation again"
            )
        room = self.n_ctx - len(prepared.tokens)
        if room < self._reserve():
            prepared.notices.append(f"only {room} tokens of context left for the reply")
        return prepared

    def _too_long(self, tokens: int) -> ContextFull:
        """The error for a message that does not fit the context with no turn before it. A system
        prompt that alone leaves no room (set with /system, --system or a saved chat) is named:
        told to shorten the message, the user would shorten it in vain."""
        if self.system:
            system_alone = len(self._render([], Turn("")).tokens)
            if system_alone >= self.n_ctx:
                return ContextFull(system_alone, self.n_ctx, what=SYSTEM_PROMPT)
        with_system = " with the system prompt" if self.system else ""
        return ContextFull(tokens, self.n_ctx, what="this message", detail=with_system)

    def _commit(self, prepared: Prepared, result, partial: str, stats: Stats | None) -> None:
        for t in prepared.dropped:
            t.in_context = False
        self.dropped += len(prepared.dropped)
        stats = result.stats if result else stats
        if stats is not None:  # the generation has ended: its stats change no more
            self.session_stats = aggregate([self.session_stats, stats])
            self.turns_counted += 1
        self.cache.remember(prepared.text, prepared.tokens, result)
        if result is None:
            self.interrupted += 1
            if not partial:
                return  # nothing generated: the message goes too, so the history holds no empty reply
        self.turns.append(_ended(prepared.turn, prepared.text, result.text if result else partial, result, stats))

    # --- settings (chat/repl.py's slash commands) ------------------------------------------------

    def reset(self) -> None:
        """Forget the conversation; the system prompt stays."""
        self.turns.clear()
        self.cache.forget()

    def set_gamma(self, gamma: int | None) -> None:
        """The draft length (None: auto, or the drafter's default)."""
        if gamma is not None:
            check_gamma(gamma, self.engine.target.n_batch)
        # refused by the command that would set it, not by every message after it
        check_snapshots(self.config.drafter, gamma, self.engine.target)
        self.config = dataclasses.replace(self.config, gamma=gamma)

    def set_drafter(self, name: str) -> None:
        if name not in DRAFTERS:
            raise SpecllmError(f"unknown drafter {name!r}: use one of {', '.join(DRAFTERS)}")
        if name == Drafter.MODEL:
            if not self.engine.has_draft:
                raise NeedsDraftModel()
            self.engine.load_draft()  # now, so that a problem shows here and not mid-reply
        if name == Drafter.MTP and self.engine.mtp is None:
            raise SpecllmError(f"{self.engine.target.path.name} has no MTP layers: /drafter auto, ngram or model")
        check_snapshots(name, self.config.gamma, self.engine.target)
        self.config = dataclasses.replace(self.config, drafter=name)

    @property
    def gamma_shown(self) -> str:
        """The draft length as /stats and /gamma say it: a fixed drafter's default is a number,
        the pair's length, or a hybrid target's snapshots where they are fewer (the engine keeps
        such a draft within them; 0 snapshots: none to keep within, a checkpoint takes it back)."""
        c = self.config
        if c.gamma is not None:
            return str(c.gamma)
        if c.drafter in (Drafter.AUTO, Drafter.NONE):
            return "auto"
        return str(self.engine.fixed_draft_length)

    def set_temperature(self, temperature: float) -> None:
        sampler = dataclasses.replace(self.config.sampler, temperature=temperature)
        self.config = dataclasses.replace(self.config, sampler=sampler)

    def set_system(self, text: str) -> None:
        """A new system prompt: the next turn prefills the conversation again."""
        check_utf8(text, "the system prompt")
        self.system = text

    def save(self, path: Path, unfinished: bool = False) -> None:
        """Write the transcript as JSON (read_transcript reads it back); with `unfinished`, the
        reply being generated as an interrupted turn, even with nothing generated yet: when
        llama.cpp ends the process, its message would be lost with it."""
        transcript = self.transcript()
        if unfinished and self._unfinished is not None:
            prepared, pieces = self._unfinished
            turn = _ended(dataclasses.replace(prepared.turn), prepared.text, "".join(pieces), None, None)
            transcript["turns"].append(turn.to_dict())
        try:
            write_text_atomic(path, json.dumps(transcript, indent=2, ensure_ascii=False) + "\n")
        except OSError as e:
            raise SpecllmError(f"cannot save to {path}: {e.strerror or e}") from None
        except (ValueError, TypeError) as e:  # nothing was written: the conversation goes on
            raise SpecllmError(f"cannot save to {path}: {e}") from None

    def restore(self, saved: "SavedChat") -> str:
        """Continue a saved conversation: its system prompt and turns replace this one's. Its
        tokens are reused when they still spell the conversation for this target, so the next
        turn prefills the whole conversation once and goes on as the saved session would have."""
        self.system = saved.system
        self.turns = [dataclasses.replace(t) for t in saved.turns]
        self.unanswered = None
        last = self.turns[-1] if self.turns else None
        if last and last.stop_reason == "interrupted" and not (last.reply or last.reasoning):
            # saved when the chat ended under it: as a live chat drops such a message, and the
            # template would get an empty reply
            self.unanswered = self.turns.pop().user
        self.cache.forget()
        live = [t for t in self.turns if t.in_context]
        if saved.context_tokens and live and live[-1].stop_reason != "interrupted":
            self._reuse_tokens(list(saved.context_tokens), live)
        turns = f"{len(self.turns)} turn{'s' * (len(self.turns) != 1)}"
        loaded = f"loaded {turns} from {saved.path}: the next message prefills the conversation once"
        return loaded + ("; its last message got no reply and is left out" if self.unanswered else "")

    def _reuse_tokens(self, tokens: list[int], live: list[Turn]) -> None:
        """Take the saved tokens as the conversation's if they spell its last prompt, then a reply
        that splits into the last turn's reasoning and answer (the reply's own text, as generated:
        the split drops the whitespace around a think block, and the answer alone is no reply)."""
        target = self.engine.target
        if not all(0 <= t < target.n_vocab for t in tokens):
            return
        prompt = self.render(self.messages(live[:-1], pending=live[-1]))
        spelled, prompt_spelled = _spelled(target, tokens), _spelled(target, self.engine.prompt_tokens(prompt))
        if not spelled.startswith(prompt_spelled):
            return
        reply = spelled[len(prompt_spelled) :]
        if _split(prompt, reply) == Split(live[-1].reasoning, live[-1].reply):
            self.cache.restore(prompt + reply, tokens)

    # --- reporting --------------------------------------------------------------------------

    def transcript(self) -> dict:
        s, engine = self.config.sampler, self.engine
        return {
            "target": str(engine.target.path),
            "draft": str(engine.draft.path) if engine.draft else None,
            "settings": {
                "drafter": self.config.drafter,
                "gamma": self.config.gamma,
                "max_tokens": self.config.max_tokens,
                "temperature": s.temperature,
                "top_k": s.top_k,
                "top_p": s.top_p,
                "min_p": s.min_p,
                "seed": s.seed,
                "ctx_size": self.n_ctx,
            },
            "system": self.system,
            "messages": self.messages(),  # what the model sees now, as the template gets it
            "turns": [t.to_dict() for t in self.turns],
            "session": self.totals(),
            # the conversation's tokens as the model last saw them, generated ones as generated, so
            # that /load continues exactly where this session would (absent after an interruption)
            "context_tokens": self.cache.tokens,
        }

    def totals(self) -> dict:
        s = self.session_stats
        return {
            "turns": self.turns_counted,
            "interrupted": self.interrupted,
            "dropped_turns": self.dropped,
            "generated_tokens": s.generated_tokens,
            "decode_seconds": s.decode_seconds,
            "tokens_per_second": s.tokens_per_second,
            "drafted": s.n_drafted,
            "accepted": s.n_accepted,
            "acceptance_rate": s.acceptance_rate,
            "target_calls": s.target_calls,
            "mean_accepted_length": s.mean_accepted_length,
            "prompt_tokens": s.prompt_tokens,
            "prefill_tokens": s.prefill_tokens,
            "prefill_seconds": s.prefill_seconds,
        }

    @property
    def context_in_use(self) -> int:
        """Tokens of the context the conversation holds now. A reply that filled the context
        ends with a token the context has no room for (it was never evaluated): /stats said
        "257 of 256 tokens in use"."""
        held = self.cache.tokens
        return min(len(held) if held is not None else len(self.engine.target.tokens), self.n_ctx)


@dataclass(frozen=True)
class SavedChat:
    """A conversation read from a /save transcript."""

    path: Path
    system: str | None
    turns: tuple[Turn, ...]
    context_tokens: tuple[int, ...] | None


def read_transcript(path: Path) -> SavedChat:
    """Read a transcript written by /save. Raises SpecllmError, saying what is wrong with it."""
    try:
        data = json.loads(read_text_file(path, "utf-8-sig"))  # a BOM, as some editors write, is no error
    except OSError as e:
        raise SpecllmError(f"cannot read {path}: {e.strerror or e}") from None
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise SpecllmError(f"{path} is not a conversation saved with /save: not JSON ({e})") from None
    except RecursionError:
        raise SpecllmError(f"{path} is not a conversation saved with /save: nested too deeply") from None
    try:
        return _saved_chat(path, data)
    except KeyError as e:
        raise SpecllmError(f"{path} is not a conversation saved with /save: a turn has no {e.args[0]!r}") from None
    except (TypeError, ValueError) as e:
        raise SpecllmError(f"{path} is not a conversation saved with /save: {e}") from None


def _saved_chat(path: Path, data) -> SavedChat:
    def text(value, what: str) -> str:
        if not isinstance(value, str):
            raise TypeError(f"{what} is not text")
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            raise ValueError(f"{what} is not valid UTF-8 text") from None
        return value

    if not isinstance(data, dict) or not isinstance(data.get("turns"), list):
        raise ValueError("no list of turns")
    system = data.get("system")
    turns = []
    for i, t in enumerate(data["turns"], 1):
        if not isinstance(t, dict):
            raise TypeError(f"turn {i} is not an object")
        stats = t.get("stats") or {}
        turns.append(
            Turn(
                text(t["user"], f"turn {i}'s user message"),
                text(t["reply"], f"turn {i}'s reply"),
                text(t.get("stop_reason", ""), f"turn {i}'s stop reason"),
                _stats(stats, i) if stats else None,
                in_context=not _flag(t.get("dropped_from_context", False), f"turn {i}'s dropped_from_context"),
                seed=_seed(t.get("seed"), i),
                reasoning=text(t.get("reasoning", ""), f"turn {i}'s reasoning"),
            )
        )
    tokens = data.get("context_tokens")
    if tokens is not None and not (isinstance(tokens, list) and all(type(x) is int for x in tokens)):
        raise TypeError("context_tokens is not a list of token ids")
    return SavedChat(
        path,
        text(system, "the system prompt") if system is not None else None,
        tuple(turns),
        tuple(tokens) if tokens else None,
    )


def _flag(value, what: str) -> bool:
    if not isinstance(value, bool):  # "no" would read as true
        raise TypeError(f"{what} is not true or false")
    return value


def _seed(value, turn: int) -> int | None:
    if value is not None and (type(value) is not int or not 0 <= value <= MAX_SEED):
        raise TypeError(f"turn {turn}'s seed is not a seed /save writes")
    return value


def _stats(saved, turn: int) -> Stats:
    """A turn's Stats from its to_dict() (which adds derived values: left out), each field of the
    type Stats gives it: a wrong one would only fail later, at /stats or /save."""
    if not isinstance(saved, dict):
        raise TypeError(f"turn {turn}'s stats are not an object")
    blank = Stats()
    values = {f.name: saved[f.name] for f in dataclasses.fields(Stats) if f.name in saved}
    for name, value in values.items():
        if not _same_kind(value, getattr(blank, name)):
            raise TypeError(f"turn {turn}'s stats field {name!r} is not what /save writes")
    return Stats(**values)


def _same_kind(value, like) -> bool:
    """Is `value` of the kind of Stats' default `like`: a count, seconds, counts per position,
    counts per source, or the policy's report (an object, or null)?"""
    count = lambda v: type(v) is int  # noqa: E731 (bool is not a count)
    if isinstance(like, int):
        return count(value)
    if isinstance(like, float):
        return count(value) or type(value) is float
    if isinstance(like, list):
        return isinstance(value, list) and all(map(count, value))
    if isinstance(like, dict):  # sources: name -> {"steps": n, "drafted": n, "accepted": n}
        return isinstance(value, dict) and all(
            isinstance(c, dict) and all(isinstance(k, str) and count(n) for k, n in c.items()) for c in value.values()
        )
    return value is None or isinstance(value, dict)


def _ended(turn: Turn, prompt: str, text: str, result: Result | None, stats: Stats | None) -> Turn:
    """`turn`, given its reply (result None: cut short, `text` is what was generated). A thinking
    model's reasoning is kept apart: the template gets it as reasoning_content."""
    split = _split(prompt, text)
    turn.reply, turn.reasoning = split.answer, split.reasoning
    turn.stop_reason = result.stop_reason if result else "interrupted"
    turn.stats = stats
    return turn


def _split(prompt: str, reply: str) -> Split:
    """The reasoning and answer of a reply to a rendered prompt, read as its end says (inside a
    think block, or before functionary v3.2's first recipient)."""
    return split_reasoning(reply, closing_marker(prompt) or False, recipient=asks_recipient(prompt))


def _spelled(target, tokens: list[int]) -> str:
    """The text tokens spell, as a reply's text is made of them (invalid UTF-8 as U+FFFD; special
    tokens spell nothing)."""
    return target.detokenize(tokens).decode("utf-8", errors="replace")


def turn_seed(session_seed: int | None, index: int) -> int:
    """The seed of a session's index-th reply: child `index` of the session seed's SeedSequence
    (numpy's way to derive independent streams), so replaying a session with its seed replays
    every reply."""
    return int(np.random.SeedSequence(session_seed, spawn_key=(index,)).generate_state(1)[0])

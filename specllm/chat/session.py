"""A chat session on top of the engine: history, rendering to tokens, overflow trimming, slash
commands and transcripts. `ChatSession` never prints and needs no terminal; `repl` at the bottom
is the terminal front end `specllm chat` runs (chat/input.py reads the messages; Ctrl-C, views
from view.py).

Staying fast turn after turn rests on the engine's KV reuse: a turn's prompt is the whole
conversation rendered with the target's chat template, and the engine evaluates only what its
caches do not already hold. To make that "only the new tokens", a turn whose rendered text extends
the previous turn's text (its prompt plus the reply as generated) exactly reuses the previous
turn's tokens as they were, the reply's generated tokens included, and tokenizes only the text
after them. Re-tokenizing the whole text instead would re-prefill every reply whose text
tokenizes differently from how it was generated (invalid UTF-8, non-canonical merges). When the
text does not extend (a template that trims or rewrites history, a changed system prompt, dropped
turns, an interrupted reply), the whole text is tokenized and the engine falls back to the
longest common token prefix.
"""

import dataclasses
import json
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from specllm.chat.view import source_mix
from specllm.engine.loop import DRAFTERS, Engine, Finished, GenerationConfig, Stats, Step, aggregate, check_gamma
from specllm.engine.sampling import default_seed
from specllm.engine.text import check_utf8
from specllm.errors import SpecllmError
from specllm.files import write_text_atomic
from specllm.llama.model import common_prefix


@dataclass
class Turn:
    """One user message and the reply to it."""

    user: str
    reply: str = ""
    stop_reason: str = ""  # eos, max_tokens, context_full, or interrupted (the partial reply kept)
    stats: Stats | None = None
    in_context: bool = True  # False once dropped to make room in the context
    seed: int | None = None  # this turn's own seed, derived from the session's (turn_seed)

    def messages(self) -> list[dict]:
        return [{"role": "user", "content": self.user}, {"role": "assistant", "content": self.reply}]

    def to_dict(self) -> dict:
        d = {"user": self.user, "reply": self.reply, "stop_reason": self.stop_reason}
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

    @property
    def new_tokens(self) -> int:
        return len(self.tokens) - self.reused


@dataclass(frozen=True)
class CommandResult:
    text: str = ""
    exit: bool = False


HELP = """\
/help            this list
/reset           forget the conversation (the system prompt stays)
/stats           statistics of the whole session
/gamma N|auto    draft length (with auto: the longest draft; auto: let it choose)
/drafter NAME    auto | model | ngram | none
/temp T          temperature (0 is greedy)
/system [TEXT]   set the system prompt (alone: show it)
/save FILE       write the transcript as JSON
/load FILE       continue a conversation saved with /save
/exit            quit (Ctrl-D too)
Start a message with // to send one that begins with /. End a line with \\ to continue it."""


class ChatSession:
    """A conversation with an engine. Typical use:

    prepared = session.prepare("Hello")   # may drop old turns (prepared.notices say so)
    for event in session.stream(prepared): ...   # Step events, then Finished
    """

    def __init__(self, engine: Engine, config: GenerationConfig, system: str | None = None):
        self.engine = engine
        # One seed for the whole session (config.sampler.seed, shown in /stats and /save); each
        # reply draws from its own stream derived from it (turn_seed), so no two replies repeat
        # one random stream, not even the same message after /reset.
        seed = default_seed(config.sampler.seed)
        self.config = dataclasses.replace(config, sampler=dataclasses.replace(config.sampler, seed=seed))
        self.replies_started = 0  # every reply of the session, /reset or not: the next stream's index
        self.system = system or None
        self.turns: list[Turn] = []  # the conversation since the last /reset, dropped turns included
        self.all_stats: list[Stats] = []  # every turn of the session, for /stats
        self.interrupted = 0
        self.dropped = 0
        # The previous turn's transcript, prompt + reply, as text and as the tokens in the KV cache.
        self._last: tuple[str, list[int]] | None = None
        self.notices: list[str] = []
        if engine.target.chat_template() is None:
            self.notices.append(f"{engine.target.path.name} has no chat template: using ChatML")

    # --- a turn -----------------------------------------------------------------------------

    def prepare(self, message: str) -> Prepared:
        """Render the conversation plus `message` to prompt tokens, dropping the oldest turns when
        the prompt would leave no room for a reply. Raises SpecllmError for a message that does
        not fit the context on its own."""
        turn = Turn(message)
        live = [t for t in self.turns if t.in_context]
        prepared = self._render(live, turn)
        if len(prepared.tokens) + self._reserve() > self.n_ctx:
            prepared = self._drop_oldest(live, turn)
        return prepared

    def stream(self, prepared: Prepared) -> Iterator[Step | Finished]:
        """Generate the reply. The turn joins the history when generation ends or is cut short
        (KeyboardInterrupt inside, or the consumer closing this generator): a partial reply is kept,
        marked "interrupted"; a reply stopped before its first token is dropped with its message."""
        result, stats, pieces = None, None, []
        prepared.turn.seed = turn_seed(self.config.sampler.seed, self.replies_started)
        self.replies_started += 1
        sampler = dataclasses.replace(self.config.sampler, seed=prepared.turn.seed)
        try:
            for event in self.engine.stream(prepared.tokens, dataclasses.replace(self.config, sampler=sampler)):
                if isinstance(event, Finished):
                    result = event.result
                else:
                    pieces.append(event.accepted_text + event.token_text)
                    stats = event.stats
                yield event
        finally:
            self._commit(prepared, result, "".join(pieces), stats)

    def send(self, message: str):
        """prepare + stream to the end; returns the Result (for library use and tests)."""
        for event in self.stream(self.prepare(message)):
            if isinstance(event, Finished):
                return event.result

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
        text = self.engine.target.render_chat(self.messages(turns, pending))
        return Prepared(pending, text, *extend_prompt(self.engine, text, self._last))

    def _drop_oldest(self, live: list[Turn], pending: Turn) -> Prepared:
        alone = self._render([], pending)
        if len(alone.tokens) >= self.n_ctx:
            with_system = " with the system prompt" if self.system else ""
            raise SpecllmError(
                f"this message is {len(alone.tokens)} tokens{with_system} but the context holds "
                f"{self.n_ctx}: shorten it or raise --ctx-size"
            )
        # Drop a quarter of the context more than needed, so the next turns do not each have to
        # drop again and re-prefill the whole remaining history.
        goal = self.n_ctx - self._reserve() - self.n_ctx // 4
        prepared, drop = alone, len(live)
        for n in range(1, len(live) + 1):
            prepared = self._render(live[n:], pending)
            if len(prepared.tokens) <= goal:
                drop = n
                break
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

    def _commit(self, prepared: Prepared, result, partial: str, stats: Stats | None) -> None:
        for t in prepared.dropped:
            t.in_context = False
        self.dropped += len(prepared.dropped)
        stats = result.stats if result else stats
        if stats is not None:
            self.all_stats.append(stats)
        self._last = None
        if result is None:
            self.interrupted += 1
            if not partial:
                return  # nothing generated: the message goes too, so the history holds no empty reply
        turn = prepared.turn
        turn.reply = result.text if result else partial
        turn.stop_reason = result.stop_reason if result else "interrupted"
        turn.stats = stats
        self.turns.append(turn)
        if result is not None:
            self._last = (prepared.text + result.text, prepared.tokens + result.tokens)

    # --- slash commands ---------------------------------------------------------------------

    def command(self, line: str) -> CommandResult:
        """Run a slash command. Bad arguments raise SpecllmError."""
        name, _, arg = line.strip().partition(" ")
        handler = self._commands().get(name.lower())
        if handler is None:
            raise SpecllmError(f"unknown command {name}: /help lists them")
        return handler(arg.strip())

    def _commands(self):
        return {
            "/help": lambda _: CommandResult(HELP),
            "/reset": self._reset,
            "/stats": lambda _: CommandResult("\n".join(self.stats_lines())),
            "/gamma": self._set_gamma,
            "/drafter": self._set_drafter,
            "/temp": self._set_temperature,
            "/temperature": self._set_temperature,
            "/system": self._set_system,
            "/save": self._save,
            "/load": self._load,
            "/exit": lambda _: CommandResult(exit=True),
            "/quit": lambda _: CommandResult(exit=True),
        }

    def _reset(self, _arg: str) -> CommandResult:
        self.turns.clear()
        self._last = None
        kept = " (the system prompt stays)" if self.system else ""
        return CommandResult(f"conversation cleared{kept}")

    def _set_gamma(self, arg: str) -> CommandResult:
        gamma = None if arg == "auto" else _parse(int, arg, "/gamma N|auto")
        if gamma is not None:
            check_gamma(gamma, self.engine.target.n_batch)
        self.config = dataclasses.replace(self.config, gamma=gamma)
        return CommandResult(f"gamma {self.config.gamma or 'auto'}")

    def _set_drafter(self, arg: str) -> CommandResult:
        if arg not in DRAFTERS:
            raise SpecllmError(f"usage: /drafter {'|'.join(DRAFTERS)}")
        if arg == "model":
            if not self.engine.has_draft:
                raise SpecllmError("no draft model: start the chat with --draft PATH or --pair NAME")
            self.engine.load_draft()  # now, so that a problem shows here and not mid-reply
        if arg == "mtp" and self.engine.mtp is None:
            raise SpecllmError(f"{self.engine.target.path.name} has no MTP layers: /drafter auto, ngram or model")
        self.config = dataclasses.replace(self.config, drafter=arg)
        return CommandResult(f"drafter {arg}")

    def _set_temperature(self, arg: str) -> CommandResult:
        sampler = dataclasses.replace(self.config.sampler, temperature=_parse(float, arg, "/temp T"))
        self.config = dataclasses.replace(self.config, sampler=sampler)
        return CommandResult(f"temperature {sampler.temperature:g}" + (" (greedy)" if sampler.greedy else ""))

    def _set_system(self, arg: str) -> CommandResult:
        if not arg:
            return CommandResult(f"system prompt: {self.system!r}" if self.system else "no system prompt")
        check_utf8(arg, "the system prompt")
        self.system = arg
        return CommandResult("system prompt set; the conversation is prefilled again on the next turn")

    def _save(self, arg: str) -> CommandResult:
        if not arg:
            raise SpecllmError("usage: /save FILE")
        path = Path(arg).expanduser()
        try:
            write_text_atomic(path, json.dumps(self.transcript(), indent=2, ensure_ascii=False) + "\n")
        except OSError as e:
            raise SpecllmError(f"cannot save to {path}: {e.strerror or e}") from None
        except (ValueError, TypeError) as e:  # nothing was written: the conversation goes on
            raise SpecllmError(f"cannot save to {path}: {e}") from None
        return CommandResult(f"saved {len(self.turns)} turns to {path}")

    def _load(self, arg: str) -> CommandResult:
        if not arg:
            raise SpecllmError("usage: /load FILE")
        return CommandResult(self.restore(read_transcript(Path(arg).expanduser())))

    def restore(self, saved: "SavedChat") -> str:
        """Continue a saved conversation: its system prompt and turns replace this one's. Its
        tokens are reused when they still spell the conversation for this target, so the next
        turn prefills the whole conversation once and goes on as the saved session would have."""
        self.system = saved.system
        self.turns = [dataclasses.replace(t) for t in saved.turns]
        self._last = None
        live = [t for t in self.turns if t.in_context]
        if saved.context_tokens and live and live[-1].stop_reason != "interrupted":
            target = self.engine.target
            text = target.render_chat(self.messages(live[:-1], pending=live[-1])) + live[-1].reply
            tokens = list(saved.context_tokens)
            in_vocabulary = all(0 <= t < target.n_vocab for t in tokens)
            if in_vocabulary and _spelled(target, tokens) == _spelled(target, self.engine.prompt_tokens(text)):
                self._last = (text, tokens)
        return f"loaded {len(self.turns)} turns from {saved.path}: the next message prefills the conversation once"

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
            },  # fmt: skip
            "system": self.system,
            "messages": self.messages(),  # what the model sees now, as the template gets it
            "turns": [t.to_dict() for t in self.turns],
            "session": self.totals(),
            # the conversation's tokens as the model last saw them, generated ones as generated, so
            # that /load continues exactly where this session would (absent after an interruption)
            "context_tokens": self._last[1] if self._last else None,
        }

    def totals(self) -> dict:
        s = aggregate(self.all_stats)
        return {
            "turns": len(self.all_stats), "interrupted": self.interrupted, "dropped_turns": self.dropped,
            "generated_tokens": s.generated_tokens, "decode_seconds": s.decode_seconds,
            "tokens_per_second": s.tokens_per_second,
            "drafted": s.n_drafted, "accepted": s.n_accepted, "acceptance_rate": s.acceptance_rate,
            "target_calls": s.target_calls, "mean_accepted_length": s.mean_accepted_length,
            "prompt_tokens": s.prompt_tokens, "prefill_tokens": s.prefill_tokens,
            "prefill_seconds": s.prefill_seconds,
        }  # fmt: skip

    def stats_lines(self) -> list[str]:
        t, c = self.totals(), self.config
        in_use = len(self._last[1]) if self._last else len(self.engine.target.tokens)
        return [
            f"turns {t['turns']} ({t['interrupted']} interrupted, {t['dropped_turns']} dropped to fit)",
            f"generated {t['generated_tokens']} tokens in {t['decode_seconds']:.2f}s: "
            f"{t['tokens_per_second']:.1f} tok/s",
            f"drafted {t['drafted']}, accepted {t['accepted']} ({t['acceptance_rate']:.0%}); "
            f"{t['mean_accepted_length']:.2f} tokens per target call ({t['target_calls']} calls)",
            f"prefilled {t['prefill_tokens']} of {t['prompt_tokens']} prompt tokens "
            f"in {t['prefill_seconds']:.2f}s (the rest came from the KV cache)",
            f"context {in_use} of {self.n_ctx} tokens in use",
            *([source_mix(aggregate(self.all_stats))] if c.drafter == "auto" else []),
            f"drafter {c.drafter} · gamma {c.gamma or 'auto'} · temperature {c.sampler.temperature:g} · "
            f"max tokens {c.max_tokens} · seed {c.sampler.seed}",
        ]


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
        data = json.loads(path.read_text(encoding="utf-8"))
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
                in_context=not t.get("dropped_from_context", False),
                seed=t.get("seed"),
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


def _spelled(target, tokens: list[int]) -> str:
    """The text tokens spell, as a reply's text is made of them (invalid UTF-8 as U+FFFD; special
    tokens spell nothing)."""
    return target.detokenize(tokens).decode("utf-8", errors="replace")


def extend_prompt(engine: Engine, text: str, last: tuple[str, list[int]] | None) -> tuple[list[int], int, bool]:
    """The prompt tokens of `text` given the previous generation's transcript `last` (its prompt
    text + generated text, and the tokens its KV cache holds for them): (tokens, how many of them
    the KV cache already holds, whether `text` extended `last` so its tokens were reused as they
    were). See the module docstring for why a text that extends `last` reuses its tokens."""
    target = engine.target
    full = engine.prompt_tokens(text)
    if last is not None:
        last_text, last_tokens = last
        if text.startswith(last_text):
            tail = target.tokenize(text[len(last_text) :], add_special=False, parse_special=True)
            # The tail must tokenize on its own as it does at the end of the whole text, or
            # the split would put tokens the model never sees in a fresh run.
            if tail and full[-len(tail) :] == tail:
                return last_tokens + tail, len(last_tokens), True
    # What the engine will reuse: the longest common prefix with what the KV cache holds.
    return full, common_prefix(target.tokens, full), False


def turn_seed(session_seed: int, index: int) -> int:
    """The seed of a session's index-th reply: child `index` of the session seed's SeedSequence
    (numpy's way to derive independent streams), so replaying a session with its seed replays
    every reply."""
    return int(np.random.SeedSequence(session_seed, spawn_key=(index,)).generate_state(1)[0])


def _parse(kind, arg: str, usage: str):
    try:
        return kind(arg)
    except ValueError:
        raise SpecllmError(f"usage: {usage}") from None


def is_command(line: str) -> bool:
    return line.startswith("/") and not line.startswith("//")


# --- the terminal front end ------------------------------------------------------------------------


def repl(session: ChatSession, console, live: bool) -> None:
    """The chat loop: read, run a command or stream a reply, repeat."""
    from specllm.chat.input import message_reader
    from specllm.chat.view import legend

    reader = message_reader()
    for notice in session.notices + ([reader.history_note] if reader.history_note else []):
        console.print(f"note: {notice}", style="yellow", markup=False)
    console.print(describe_session(session), style="dim", markup=False, highlight=False)
    if live and session.config.drafter != "none":
        console.print(legend(session.config.drafter))
    console.print("/help for commands, Ctrl-D or /exit to quit", style="dim")
    while True:
        line = reader.read()
        if line is None:
            console.print()
            return
        if reader.notice is not None:  # a Ctrl-C at the prompt: the typed line is gone
            console.print(reader.notice, style="dim")
            reader.notice = None
        if not line.strip():
            continue
        try:
            if is_command(line):
                result = session.command(line)
                if result.text:
                    console.print(result.text, markup=False, highlight=False)
                if result.exit:
                    return
            else:
                _reply(session, line[1:] if line.startswith("//") else line, console, live)
        except SpecllmError as e:
            console.print(f"error: {e}", style="red", markup=False, highlight=False)
        except KeyboardInterrupt:  # outside a reply (rendering, a command): the chat goes on
            console.print("\n[interrupted]", style="yellow", markup=False)


def describe_models(engine: Engine) -> str:
    models = engine.target.path.name
    if engine.draft is not None:
        models += f" + {engine.draft.path.name}"
    elif engine.draft_file is not None:
        models += f" + {Path(engine.draft_file[0]).name} (loaded when it pays)"
    return models


def describe_session(session: ChatSession) -> str:
    engine, c = session.engine, session.config
    models = describe_models(engine)
    return (
        f"{models} · drafter {c.drafter} · gamma {c.gamma or 'auto'} · temperature {c.sampler.temperature:g}"
        f" · context {session.n_ctx} tokens"
    )


def _reply(session: ChatSession, message: str, console, live: bool) -> None:
    from specllm.chat.view import LiveView, PlainView, chat_summary

    prepared = session.prepare(message)
    for notice in prepared.notices:
        console.print(f"note: {notice}", style="yellow", markup=False)
    drafter = session.config.drafter
    if live:
        view = LiveView(console, drafter, show_legend=False, describe=chat_summary)
    else:
        view = PlainView(drafter, describe=chat_summary)
    events = session.stream(prepared)
    try:
        with view:
            for event in events:
                if isinstance(event, Finished):
                    view.finish(event.result)
                else:
                    view.step(event)
    except KeyboardInterrupt:
        events.close()  # the session keeps the partial reply (see ChatSession.stream)
        kept = session.turns and session.turns[-1] is prepared.turn
        what = "the partial reply is kept in the history" if kept else "nothing was generated; the message is dropped"
        console.print(f"\n[reply interrupted: {what}]", style="yellow", markup=False)

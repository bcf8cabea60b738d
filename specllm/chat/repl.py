"""`specllm chat` in a terminal: read a message (chat/input.py), run a slash command or stream a
reply through the views (chat/view.py), repeat; Ctrl-C stops a reply, not the chat. The
conversation itself is a ChatSession (chat/session.py), which never prints.
"""

import contextlib
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from specllm.chat.session import SYSTEM_PROMPT, ChatSession, read_transcript
from specllm.chat.view import source_mix
from specllm.engine.functionary import asks_recipient
from specllm.engine.loop import DRAFTERS, describe_models
from specllm.engine.names import Drafter
from specllm.engine.reasoning import closing_marker
from specllm.engine.text import shown
from specllm.errors import (
    ContextFull,
    ContextTooLarge,
    DraftNotLoaded,
    DraftTooLong,
    NeedsDraftModel,
    SpecllmError,
    Terminated,
)
from specllm.files import state_dir
from specllm.llama.aborts import before_abort

HELP = f"""\
/help            this list
/reset           forget the conversation (the system prompt stays)
/stats           statistics of the whole session
/gamma N|auto    draft length (with auto: the longest draft; auto: let it choose)
/drafter NAME    {" | ".join(DRAFTERS)}
/temp T          temperature (0 is greedy)
/system [TEXT]   set the system prompt (alone: show it)
/save FILE       write the transcript as JSON
/load FILE       continue a conversation saved with /save
/exit            quit (Ctrl-D too)
Start a message with // to send one that begins with /. End a line with \\ to continue it."""


@dataclass(frozen=True)
class CommandResult:
    text: str = ""
    exit: bool = False


def is_command(line: str) -> bool:
    return line.startswith("/") and not line.startswith("//")


def command(session: ChatSession, line: str) -> CommandResult:
    """Run a slash command on the session. Bad arguments raise SpecllmError."""
    name, _, arg = line.strip().partition(" ")
    handler = COMMANDS.get(name.lower())
    if handler is None:
        raise SpecllmError(f"unknown command {name}: /help lists them")
    if name.lower() in TAKE_NO_ARGUMENT and arg.strip():  # "/reset all" must not pass for something else
        raise SpecllmError(f"{name.lower()} takes no argument")
    return handler(session, arg.strip())


def _reset(session: ChatSession, _arg: str) -> CommandResult:
    session.reset()
    kept = " (the system prompt stays)" if session.system else ""
    return CommandResult(f"conversation cleared{kept}")


def _gamma(session: ChatSession, arg: str) -> CommandResult:
    session.set_gamma(None if arg == "auto" else _parse(int, arg, "/gamma N|auto"))
    return CommandResult(f"gamma {session.gamma_shown}")


def _drafter(session: ChatSession, arg: str) -> CommandResult:
    if arg not in DRAFTERS:
        raise SpecllmError(f"usage: /drafter {'|'.join(DRAFTERS)}")
    session.set_drafter(arg)
    return CommandResult(f"drafter {arg}")


def _temperature(session: ChatSession, arg: str) -> CommandResult:
    session.set_temperature(_parse(float, arg, "/temp T"))
    sampler = session.config.sampler
    return CommandResult(f"temperature {sampler.temperature:g}" + (" (greedy)" if sampler.greedy else ""))


def _system(session: ChatSession, arg: str) -> CommandResult:
    if not arg:
        return CommandResult(f"system prompt: {session.system!r}" if session.system else "no system prompt")
    session.set_system(arg)
    return CommandResult("system prompt set; the conversation is prefilled again on the next turn")


def _save(session: ChatSession, arg: str) -> CommandResult:
    if not arg:
        raise SpecllmError("usage: /save FILE")
    path = Path(arg).expanduser()
    session.save(path)
    return CommandResult(f"saved {len(session.turns)} turn{'s' * (len(session.turns) != 1)} to {path}")


def _load(session: ChatSession, arg: str) -> CommandResult:
    if not arg:
        raise SpecllmError("usage: /load FILE")
    return CommandResult(session.restore(read_transcript(Path(arg).expanduser())))


def _exit(_session: ChatSession, _arg: str) -> CommandResult:
    return CommandResult(exit=True)


COMMANDS = {
    "/help": lambda _session, _arg: CommandResult(HELP),
    "/reset": _reset,
    "/stats": lambda session, _arg: CommandResult("\n".join(stats_lines(session))),
    "/gamma": _gamma,
    "/drafter": _drafter,
    "/temp": _temperature,
    "/temperature": _temperature,
    "/system": _system,
    "/save": _save,
    "/load": _load,
    "/exit": _exit,
    "/quit": _exit,
}


TAKE_NO_ARGUMENT = {"/help", "/reset", "/stats", "/exit", "/quit"}


def _parse(kind, arg: str, usage: str):
    try:
        return kind(arg)
    except ValueError:
        raise SpecllmError(f"usage: {usage}") from None


def stats_lines(session: ChatSession) -> list[str]:
    """/stats: the whole session's statistics and settings."""
    t, c = session.totals(), session.config
    return [
        f"turns {t['turns']} ({t['interrupted']} interrupted, {t['dropped_turns']} dropped to fit)",
        f"generated {t['generated_tokens']} tokens in {t['decode_seconds']:.2f}s: {t['tokens_per_second']:.1f} tok/s",
        f"drafted {t['drafted']}, accepted {t['accepted']} ({t['acceptance_rate']:.0%}); "
        f"{t['mean_accepted_length']:.2f} tokens per target call ({t['target_calls']} calls)",
        f"prefilled {t['prefill_tokens']} of {t['prompt_tokens']} prompt tokens "
        f"in {t['prefill_seconds']:.2f}s (the rest came from the KV cache)",
        f"context {session.context_in_use} of {session.n_ctx} tokens in use",
        *([source_mix(session.session_stats)] if c.drafter == Drafter.AUTO else []),
        f"drafter {c.drafter} · gamma {session.gamma_shown} · temperature {c.sampler.temperature:g} · "
        f"max tokens {c.max_tokens} · seed {c.sampler.seed}",
    ]


def describe_session(session: ChatSession) -> str:
    c = session.config
    return (
        f"{describe_models(session.engine)} · drafter {c.drafter} · gamma {session.gamma_shown}"
        f" · temperature {c.sampler.temperature:g} · context {session.n_ctx} tokens"
    )


# --- the loop ------------------------------------------------------------------------------------


def repl(session: ChatSession, console, live: bool) -> None:
    """The chat loop: read, run a command or stream a reply, repeat."""
    from specllm.chat.input import message_reader
    from specllm.chat.view import legend

    reader = message_reader()
    # Every line that quotes a file name or an error's text goes through shown(): its escape
    # sequences would be obeyed by the terminal.
    for notice in session.notices + ([reader.history_note] if reader.history_note else []):
        console.print(shown(f"note: {notice}"), style="yellow", markup=False)
    console.print(shown(describe_session(session)), style="dim", markup=False, highlight=False)
    if live and session.config.drafter != Drafter.NONE:
        console.print(legend(session.config.drafter))
    console.print("/help for commands, Ctrl-D or /exit to quit", style="dim")
    with before_abort(lambda: _save_before_exit(session)):
        try:
            _converse(session, reader, console, live)
        except Terminated:  # SIGTERM, or SIGHUP: the terminal closed, and the conversation with it
            with contextlib.suppress(OSError, SpecllmError):  # a terminal gone cannot be told
                _save_before_exit(session)
            raise


def _save_before_exit(session: ChatSession) -> None:
    """When the process ends under the chat (llama.cpp aborts it, an RPC server gone; SIGTERM;
    its terminal closed), the conversation is written where --resume can take it up, as /save
    would, with the message whose reply it cut short: nothing else can keep them. Where the state
    folder cannot take it (a full disk, a read-only home), the system's temporary folder is tried;
    where neither can, the user is told it is lost (it was lost without a word)."""
    if not session.turns and not session.generating:
        return
    name = f"chat-{time.strftime('%Y%m%d-%H%M%S')}.json"
    failures = []
    for folder in (state_dir, _temporary_folder):
        try:
            path = folder() / name
            path.parent.mkdir(parents=True, exist_ok=True)
            session.save(path, unfinished=True)
        except SpecllmError as e:  # save's OSError, in its words
            failures.append(str(e))
        except OSError as e:
            failures.append(f"{e.strerror or e}" + (f": {e.filename}" if e.filename else ""))
        else:
            print(f"specllm: the conversation is saved: specllm chat --resume {path}", file=sys.stderr, flush=True)
            return
    print(f"specllm: the conversation is lost: {'; '.join(failures)}", file=sys.stderr, flush=True)


def _temporary_folder() -> Path:
    """The system's temporary folder (where none can be written, tempfile's OSError names every
    folder it tried)."""
    return Path(tempfile.gettempdir())


def _converse(session: ChatSession, reader, console, live: bool) -> None:
    while True:
        line = reader.read(session.unanswered or "")  # a terminal offers it again, ready to send
        session.unanswered = None
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
                result = command(session, line)
                if result.text:
                    console.print(shown(result.text), markup=False, highlight=False)
                if result.exit:
                    return
            else:
                _reply(session, line[1:] if line.startswith("//") else line, console, live)
        except SpecllmError as e:
            console.print(shown(f"error: {e}{chat_hint(e)}"), style="red", markup=False, highlight=False)
        except KeyboardInterrupt:  # outside a reply (rendering, a command): the chat goes on
            console.print("\n[interrupted]", style="yellow", markup=False)


def chat_hint(error: SpecllmError) -> str:
    """What the user can do about an error inside the chat: the chat's commands, or the flags
    to start it with."""
    if isinstance(error, DraftNotLoaded):  # /drafter model, or a reply's draft: its load's error
        error = error.cause
    if isinstance(error, ContextTooLarge):
        return f": start the chat with --ctx-size {error.fits} or less" if error.fits else ": free some memory"
    if isinstance(error, ContextFull) and error.what == SYSTEM_PROMPT:
        return ": /system TEXT sets a shorter one, or raise --ctx-size"
    if isinstance(error, ContextFull):
        return ": shorten it or raise --ctx-size"
    if isinstance(error, NeedsDraftModel):
        return ": start the chat with --draft PATH or --pair NAME"
    if isinstance(error, DraftTooLong):
        return f": /gamma {error.snapshots} or less, /drafter auto, or start the chat with --snapshots {error.gamma}"
    return ""


def _reply(session: ChatSession, message: str, console, live: bool) -> None:
    from specllm.chat.view import LiveView, PlainView, chat_summary

    prepared = session.prepare(message)
    for notice in prepared.notices:
        console.print(shown(f"note: {notice}"), style="yellow", markup=False)
    drafter = session.config.drafter
    view: LiveView | PlainView
    opened = closing_marker(prepared.text) or False  # the template began the reply's reasoning
    recipient = asks_recipient(prepared.text)  # or its first recipient line (functionary v3.2)
    if live:
        view = LiveView(console, drafter, show_legend=False, describe=chat_summary, opened=opened, recipient=recipient)
    else:
        view = PlainView(drafter, describe=chat_summary, opened=opened, recipient=recipient)
    reply = session.stream(prepared)
    try:
        with view:
            for step in reply:
                view.step(step)
            view.finish(reply.result)
    except KeyboardInterrupt:
        reply.close()  # the session keeps the partial reply (see ChatSession.stream)
        kept = session.turns and session.turns[-1] is prepared.turn
        what = "the partial reply is kept in the history" if kept else "nothing was generated; the message is dropped"
        console.print(f"\n[reply interrupted: {what}]", style="yellow", markup=False)

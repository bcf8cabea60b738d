"""`specllm chat` as a user runs it: the real process on a pseudo-terminal (prompt_toolkit's line
editor, Rich's live view, Ctrl-C as SIGINT from the terminal), on the tiny models."""

from __future__ import annotations

import json
import os
import re
import stat
import subprocess
import sys
from pathlib import Path

import pytest
from terminal import Terminal

PROMPT = r"(?:^|\n)>"  # the line editor draws the prompt's space as a cursor move
# This pseudo-terminal is no terminal emulator: it answers no cursor position requests, which
# prompt_toolkit would otherwise wait for and then warn about.
CHAT_ENV = {"PROMPT_TOOLKIT_NO_CPR": "1"}
SUMMARY = r"prompt\s+tokens\s+in\s+[\d.]+s"  # the end of a reply's summary line (the reply may hold "> ")
# A frame of the live view while a reply streams: its status line, at least 10 tokens in. The summary
# after a reply says "tok/s" too, but after its "[stop reason]": waiting for this, not for "tok/s",
# is what makes sure a reply is still under way.
STREAMING = r"\n[\d.]+ tok/s · [1-9]\d+ tokens"
# Replies a signal or Ctrl-C can land in, whatever the model's speed: the tiny models write the
# first 1,000 tokens in ~0.2 s but a whole 4,000-token reply (attention over a growing context) in
# ~4 s; a reply that ends first (a 1,000-token one did, under load) would make the tests below fail.
LONG = dict(ctx_size=4096, max_tokens=4000)  # a reply to the interrupted message
ENDLESS = dict(ctx_size=65536, max_tokens=60000)  # minutes; for tests whose chat ends mid-reply


class ChatTerminal(Terminal):
    """`specllm chat` on a pseudo-terminal, spoken to a line at a time."""

    def say(self, line: str, until: str | None = None) -> str:
        """Type a line at the prompt; return the output up to the next prompt (after `until`)."""
        start = self.pos
        self.send(line + "\r")
        if until:
            self.expect(until)
        end = self.expect(PROMPT).start()
        return self.text[start:end]

    def ask(self, message: str) -> str:
        """Send a message; return the reply and its summary line, Rich's wrapping undone."""
        return flat(self.say(message, until=SUMMARY))


@pytest.fixture
def chat(tiny_models):
    terminals = []

    def start(*args, ctx_size=512, max_tokens=16, env=None):
        base = ["-m", tiny_models.target, "-md", tiny_models.draft, "--threads", "1", "--temperature", "0"]
        args = ["chat", *base, "--ctx-size", ctx_size, "-n", max_tokens, *args]
        term = ChatTerminal(args, env={**CHAT_ENV, **(env or {})})
        terminals.append(term)
        term.expect("/help for commands")
        term.expect(PROMPT)
        return term

    yield start
    for term in terminals:
        term.kill()


def flat(text: str) -> str:
    """Output with Rich's line wrapping undone."""
    return re.sub(r"\s+", " ", text)


def test_turns_slash_commands_multiline_and_eof(chat, tmp_path):
    term = chat("--system", "You are terse.", "--drafter", "model")
    assert "target.gguf + draft.gguf · drafter model · gamma 4 · temperature 0 · context 512 tokens" in term.text
    for message in ("Hello world", "def add(a, b):"):
        out = term.ask(message)
        per_turn = r"\[max_tokens\] [\d.]+ tok/s · 16 tokens · acceptance \d+% · [\d.]+ tokens/target call"
        assert re.search(per_turn, out)
    assert re.search(r"prefill (\d+) of (\d+) prompt tokens", out)
    prefill, prompt = map(int, re.search(r"prefill (\d+) of (\d+) prompt tokens", out).groups())
    assert prefill < prompt / 2  # the second turn reused the first from the KV cache
    stats = term.say("/stats")
    assert "turns 2 (0 interrupted, 0 dropped to fit)" in stats and "generated 32 tokens" in stats
    assert "/drafter NAME    auto | model | mtp | ngram | none" in term.say("/help")
    assert "gamma 2" in term.say("/gamma 2")
    assert "drafter ngram" in term.say("/drafter ngram")
    assert "temperature 0.5" in term.say("/temp 0.5")
    assert "temperature 0 (greedy)" in term.say("/temp 0")
    assert "error: usage: /gamma N" in term.say("/gamma many")
    assert "error: unknown command /frobnicate: /help lists them" in term.say("/frobnicate")
    assert "system prompt set" in term.say("/system Be brief.")
    assert "system prompt: 'Be brief.'" in term.say("/system")
    assert "gamma 2" in term.say("\x1b[A\x1b[A\x1b[A\x1b[A\x1b[A\x1b[A\x1b[A\x1b[A")  # history: 8 lines up
    assert "temperature 0.5" in term.say("/temp 0.7\x7f\x7f\x7f0.5")  # line editing (backspace)
    assert "temperature 0 (greedy)" in term.say("/temp 0")
    # A line ending in a backslash continues on the next; a bracketed paste arrives whole.
    term.send("first line\\\r")
    term.expect(r"\n\.")
    assert "[max_tokens]" in term.ask("second line")
    assert "[max_tokens]" in term.ask("\x1b[200~pasted one\npasted two\x1b[201~")
    assert "[max_tokens]" in term.ask("alpha\rbeta")  # lines arriving at once (a paste, unbracketed)
    assert "[max_tokens]" in term.ask("//slash is text")
    path = tmp_path / "chat.json"
    assert f"saved 6 turns to {path}" in flat(term.say(f"/save {path}"))
    saved = json.loads(path.read_text())
    users = [t["user"] for t in saved["turns"]]
    assert users == [
        "Hello world",
        "def add(a, b):",
        "first line\nsecond line",
        "pasted one\npasted two",
        "alpha\nbeta",
        "/slash is text",
    ]
    assert saved["system"] == "Be brief." and saved["settings"]["drafter"] == "ngram"
    assert saved["settings"]["gamma"] == 2 and saved["session"]["turns"] == 6
    assert "conversation cleared" in term.say("/reset")
    term.send("\x04")  # Ctrl-D at the prompt
    assert term.wait() == 0
    assert "Traceback" not in term.text


def test_ctrl_c_stops_a_reply_and_twice_at_an_empty_prompt_quits(chat, tmp_path):
    term = chat(**LONG)  # the reply after it ends in seconds, not minutes
    term.send("Once upon a time\r")
    term.expect(STREAMING)  # the live view is streaming the reply, seconds from its end
    term.send("\x03")
    term.expect(r"\[reply interrupted: the partial reply is kept in the history\]")
    term.expect(PROMPT)
    term.send("\x03")  # at an empty prompt: asks first
    term.expect(r"\(press Ctrl-C again or type /exit to quit\)")
    term.expect(PROMPT)
    out = term.ask("Hello world")  # the chat goes on; the history is consistent
    assert re.search(r"\[(max_tokens|context_full)\]", out)
    path = tmp_path / "chat.json"
    term.say(f"/save {path}")
    first, second = json.loads(path.read_text())["turns"]
    assert first["interrupted"] and first["stop_reason"] == "interrupted" and first["reply"]
    assert first["stats"]["generated_tokens"] < LONG["max_tokens"] and not second["interrupted"]
    assert "turns 2 (1 interrupted" in term.say("/stats")
    term.send("typed, then discarded")
    term.expect("typed, then discarded")  # in the line editor (echoed), not merely sent
    term.send("\x03")  # a typed line is discarded without the question ...
    term.expect(PROMPT)
    term.send("\x03")  # ... the first Ctrl-C at an empty prompt asks ...
    term.expect(r"press Ctrl-C again")
    term.expect(PROMPT)
    term.send("\x03")  # ... the second quits
    assert term.wait() == 0
    assert "Traceback" not in term.text
    assert term.text.count("press Ctrl-C again") == 2


def test_context_overflow_and_a_message_too_long(chat):
    term = chat("--system", "You are terse.", ctx_size=256, max_tokens=16)
    notices = 0
    for i in range(10):
        out = term.ask(f"Hello world number {i}")
        assert "[max_tokens]" in out
        notices += "note: context full: dropped the" in out
    assert notices >= 1
    out = flat(term.say("the name of the class is " * 50))
    refusal = r"error: this message is \d+ tokens with the system prompt but the context holds 256: shorten it or raise"
    assert re.search(refusal, out)
    assert "[max_tokens]" in term.ask("still here")
    assert re.search(r"turns 11 \(0 interrupted, \d+ dropped to fit\)", term.say("/stats"))
    term.send("/exit\r")
    assert term.wait() == 0
    assert "Traceback" not in term.text


def test_a_system_prompt_longer_than_the_context_is_named_with_how_to_change_it(tiny_models):
    """Every message is refused while the system prompt alone fills the context: the error says
    so (not "shorten it", of a two-word message), and /system with a shorter one lets the chat go on."""
    args = ["chat", "-m", tiny_models.target, "--drafter", "none", "--threads", "1", "-n", "4", "--ctx-size", "256"]
    messages = f"/system {'You are terse. ' * 100}\nHello world\n/system You are terse.\nHello world\n"
    proc = subprocess.run(
        [sys.executable, "-m", "specllm", *args], input=messages, capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 0 and "Traceback" not in proc.stderr, proc.stderr
    refusal = r"error: the system prompt is \d+ tokens but the context holds 256: /system TEXT sets a shorter one, or"
    assert re.search(refusal, proc.stdout), proc.stdout
    assert proc.stderr.count("[max_tokens] ") == 1  # the chat went on with the shorter one


def test_piped_input_without_a_terminal(tiny_models):
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "specllm",
            "chat",
            "-m",
            tiny_models.target,
            "--drafter",
            "ngram",
            "--threads",
            "1",
            "--temperature",
            "0",
            "-n",
            "8",
            "--ctx-size",
            "512",
        ],
        input="Hello world\nsecond\\\nline\n/stats\n",
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    assert "turns 2 (0 interrupted" in proc.stdout and "Traceback" not in proc.stderr
    assert proc.stderr.count("[max_tokens] ") == 2  # the per-turn summary, on stderr in plain mode


def test_piped_input_that_ends_in_a_continued_message_sends_it(tiny_models):
    """A file whose last line ends in a backslash: the message is sent, not dropped unsaid."""
    args = ["chat", "-m", tiny_models.target, "--drafter", "none", "--threads", "1", "-n", "4", "--ctx-size", "256"]
    proc = subprocess.run(
        [sys.executable, "-m", "specllm", *args], input="first\\\nlast\\", capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 0 and "Traceback" not in proc.stderr, proc.stderr
    assert proc.stderr.count("[max_tokens] ") == 1  # the reply's summary, on stderr in plain mode


def test_piped_output_keeps_each_line_whole(tiny_models):
    """Off a terminal there is no width to wrap to: an error, /help and /stats come one line each,
    not broken at 80 columns."""
    args = ["chat", "-m", tiny_models.target, "--drafter", "none", "--threads", "1", "--ctx-size", "512"]
    proc = subprocess.run(
        [sys.executable, "-m", "specllm", *args],
        input="/gamma 99999\n/help\n",
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert any(
        line.startswith("> error: gamma (draft length) 99999 is too long") and line.endswith("511") for line in lines
    )
    assert "/gamma N|auto    draft length (with auto: the longest draft; auto: let it choose)" in lines
    assert any(line.startswith("target.gguf · drafter none") and line.endswith("context 512 tokens") for line in lines)


def test_errors_that_quote_a_file_name_or_a_template_cannot_drive_the_terminal(tmp_path):
    """In the chat, an error quoting a file name or the text a model's template raised shows its
    control characters as symbols: the terminal must not obey them (OSC 52 writes the clipboard)."""
    import tiny_models as tm

    boom = "{% if messages[-1]['content'] == 'boom' %}{{ raise_exception('bad\x1b[2J\x07') }}{% endif %}"
    path = tm.write_model(tmp_path / "templated.gguf", chat_template=boom + tm.CHATML_TEMPLATE)
    args = ["chat", "-m", path, "--drafter", "none", "--threads", "1", "-n", "4", "--ctx-size", "256"]
    messages = "/load x\x1b]52;c;aGk=\x07.json\nboom\n/save /no/such/\x1b[2J/x.json\n"
    proc = subprocess.run(
        [sys.executable, "-m", "specllm", *map(str, args)], input=messages, capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 0 and "Traceback" not in proc.stderr, proc.stderr
    assert "error: cannot read x␛]52;c;aGk=␇.json" in proc.stdout
    assert "failed: bad␛[2J␇" in flat(proc.stdout) and "cannot save to /no/such/␛[2J/x.json" in proc.stdout
    assert "\x1b" not in proc.stdout + proc.stderr and "\x07" not in proc.stdout + proc.stderr


@pytest.mark.parametrize(
    "args, fragment",
    [
        (["--gamma", "0"], "gamma (draft length) must be >= 1"),
        (["--temperature", "-1"], "temperature must be >= 0"),
        (["--drafter", "model"], "drafter 'model' needs a draft model"),
        (["--drafter", "magic"], "unknown drafter 'magic'"),
    ],
)
def test_bad_options_give_one_line(tiny_models, args, fragment):
    proc = subprocess.run(
        [sys.executable, "-m", "specllm", "chat", "-m", tiny_models.target, "--threads", "1", *args],
        input="",
        capture_output=True,
        text=True,
        timeout=120,
    )
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 1 and len(lines) == 1, proc.stderr
    assert lines[0].startswith("error: ") and fragment in lines[0], proc.stderr


def test_the_default_drafter_is_auto_and_says_what_it_drafted_with(chat):
    term = chat()
    assert "draft.gguf (loaded when it pays) · drafter auto · gamma auto" in flat(term.text)
    out = flat(term.ask("Hello world"))
    assert re.search(r"auto: n-gram \d+%, model \d+%, none \d+% of steps", out), out


def test_a_message_that_is_not_utf8_is_one_line_and_the_chat_goes_on(tiny_models):
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "specllm",
            "chat",
            "-m",
            tiny_models.target,
            "--drafter",
            "none",
            "--threads",
            "1",
            "--temperature",
            "0",
            "-n",
            "4",
            "--ctx-size",
            "256",
        ],
        input=b"caf\xe9 au lait\nHello world\n",
        capture_output=True,
        timeout=120,
    )
    out, err = proc.stdout.decode(), proc.stderr.decode()
    assert proc.returncode == 0 and "Traceback" not in err, err
    # the position counts into what was typed ("caf\xe9": the 4th character), not the rendered template
    assert "error: the message is not valid UTF-8 text (at character 4)" in out
    assert err.count("[max_tokens] ") == 1  # the next message got its reply


def test_sigterm_during_a_reply_restores_the_cursor_and_exits_143(chat):
    import signal

    term = chat(**ENDLESS)
    term.send("Once upon a time\r")
    term.expect(STREAMING)  # the live view is up, the cursor hidden
    term.proc.send_signal(signal.SIGTERM)
    assert term.wait() == 143
    raw = term.raw.decode("utf-8", errors="replace")
    assert raw.rfind("\x1b[?25h") > raw.rfind("\x1b[?25l") >= 0  # shown again after it was last hidden
    assert "terminated" in term.text and "Traceback" not in term.text
    assert not re.search(SUMMARY, term.text)  # it came mid-reply: the reply never ended


def test_history_survives_a_restart_and_is_private(chat):
    term = chat()
    assert "temperature 0.5" in term.say("/temp 0.5")
    assert "gamma 3" in term.say("/gamma 3")
    term.send("\x04")
    assert term.wait() == 0
    history = Path(os.environ["XDG_STATE_HOME"]) / "specllm" / "history"  # conftest gives each test its own
    assert "/temp 0.5" in history.read_text()
    assert history.stat().st_mode & 0o777 == 0o600  # private, as shells keep theirs: every message typed
    term = chat()
    assert "temperature 0.5" in term.say("\x1b[A\x1b[A")  # two lines up, typed in the last session
    assert "gamma 3" in term.say("\x1b[A\x1b[A")  # the line just sent is history too
    term.send("\x04")
    assert term.wait() == 0


def test_a_backslash_continues_wherever_the_cursor_is_and_alt_enter_starts_a_line(chat, tmp_path):
    term = chat()
    term.send("one\\\x1b[D\x1b[D\r")  # the cursor two to the left: Enter still continues the message
    term.expect(r"\n\.")
    assert "[max_tokens]" in term.ask("two")
    assert "[max_tokens]" in term.ask("three\x1b\rfour")  # Alt-Enter (Esc Enter), then Enter sends
    assert [t["user"] for t in saved_turns(term, tmp_path / "chat.json")] == ["one\ntwo", "three\nfour"]


@pytest.mark.parametrize("problem", ["folder is a file", "history unreadable"])
def test_a_history_that_cannot_be_kept_costs_the_history_not_the_chat(chat, tmp_path, problem):
    if problem == "folder is a file":
        (tmp_path / "specllm").write_text("")
    else:
        (tmp_path / "specllm").mkdir()
        (tmp_path / "specllm" / "history").mkdir()  # opening it as a file fails
    term = chat(env={"XDG_STATE_HOME": str(tmp_path)})
    if problem == "folder is a file":
        assert "note: history is not kept: cannot create" in flat(term.text)
    assert "temperature 0.5" in term.say("/temp 0.5")
    assert "temperature 0.5" in term.say("\x1b[A")  # this session's history still works
    term.send("/exit\r")
    assert term.wait() == 0 and "Traceback" not in term.text and "exception" not in term.text.lower()


def test_a_typed_message_that_is_not_utf8_is_one_line_in_the_line_editor_too(chat):
    """A Latin-1 terminal sends "é" as one byte: the message is refused in one line, not with
    prompt_toolkit's traceback from writing it to the history file, and the chat goes on."""
    term = chat()
    os.write(term.fd, b"caf\xe9 au lait\r")
    term.expect(r"error: the message is not valid UTF-8 text \(at character 4\)")
    term.expect(PROMPT)
    assert "[max_tokens]" in term.ask("Hello world")
    term.send("/exit\r")
    assert term.wait() == 0
    assert "Traceback" not in term.text and "exception" not in term.text.lower()
    history = Path(os.environ["XDG_STATE_HOME"]) / "specllm" / "history"  # conftest gives each test its own
    assert "+Hello world" in history.read_text()


def saved_turns(term, path):
    term.say(f"/save {path}")
    return json.loads(path.read_text())["turns"]


def test_resume_and_load_continue_a_conversation_as_the_original_would(chat, tmp_path):
    first, second, third = "Hello world", "def add(a, b):", "print the value"
    original = chat("--drafter", "none", "--system", "You are terse.")
    original.ask(first)
    original.ask(second)
    saved = tmp_path / "two.json"
    original.say(f"/save {saved}")
    original.ask(third)
    expected = saved_turns(original, tmp_path / "three.json")
    assert len(expected) == 3

    resumed = chat("--drafter", "none", "--resume", saved)
    assert f"loaded 2 turns from {saved}" in flat(resumed.text)
    out = resumed.ask(third)
    prefill, prompt = map(int, re.search(r"prefill (\d+) of (\d+) prompt tokens", out).groups())
    assert prefill == prompt - 1  # the whole conversation at once (its last token goes with the first step)
    turns = saved_turns(resumed, tmp_path / "resumed.json")
    assert [(t["user"], t["reply"]) for t in turns] == [(t["user"], t["reply"]) for t in expected]
    assert json.loads((tmp_path / "resumed.json").read_text())["system"] == "You are terse."

    replaced = chat("--drafter", "none", "--resume", saved, "--system", "Be brief.")  # --system wins
    assert "system prompt: 'Be brief.'" in replaced.say("/system")

    running = chat("--drafter", "none")
    running.ask("Once upon a time")  # a conversation of its own, replaced by /load
    assert f"loaded 2 turns from {saved}" in flat(running.say(f"/load {saved}"))
    running.ask(third)
    turns = saved_turns(running, tmp_path / "loaded.json")
    assert [(t["user"], t["reply"]) for t in turns] == [(t["user"], t["reply"]) for t in expected]
    assert "error: cannot read" in flat(running.say(f"/load {tmp_path / 'missing.json'}"))
    running.send("/exit\r")
    assert running.wait() == 0 and "Traceback" not in running.text


def test_a_message_saved_with_no_reply_is_left_out_and_waits_at_the_prompt(chat, tmp_path):
    """A chat saved as llama.cpp ended it (an RPC server gone) holds the message it was answering,
    interrupted before a token: resumed, it is no turn (an empty reply in the template) but is
    typed in already, and Enter sends it."""
    saved = tmp_path / "crashed.json"
    turns = [{"user": "Hello world", "reply": " and more", "stop_reason": "max_tokens"}]
    turns.append({"user": "def add(a, b):", "reply": "", "stop_reason": "interrupted"})
    saved.write_text(json.dumps({"turns": turns}))
    term = chat("--drafter", "none", "--resume", saved)
    assert f"loaded 1 turn from {saved}" in flat(term.text) and "its last message got no reply" in flat(term.text)
    term.ask("")  # Enter: the message typed in already
    assert [t["user"] for t in saved_turns(term, tmp_path / "after.json")] == ["Hello world", "def add(a, b):"]


def test_resume_from_a_file_that_is_no_saved_chat_is_one_line_before_any_model_loads(tmp_path):
    bad = tmp_path / "notes.json"
    bad.write_text("[1, 2, 3]")
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)  # opened for reading, it waited for ever for a writer
    for path, fragment in (
        (tmp_path / "missing.json", "cannot read"),
        (bad, "is not a conversation saved with /save"),
        (fifo, f"cannot read {fifo}: it is a FIFO, not a regular file"),
        ("/dev/null", "cannot read /dev/null: it is a device, not a regular file"),  # /dev/zero never ended
    ):
        proc = subprocess.run(
            [sys.executable, "-m", "specllm", "chat", "-m", tmp_path / "no-such-model.gguf", "--resume", path],
            input="",
            capture_output=True,
            text=True,
            timeout=120,
        )
        lines = proc.stderr.strip().splitlines()
        assert proc.returncode == 1 and len(lines) == 1 and lines[0].startswith("error: "), proc.stderr
        assert fragment in lines[0] and "no-such-model" not in lines[0]


def chat_piped(model, commands: list[str]) -> subprocess.CompletedProcess:
    """`specllm chat` with `commands` as its input, one a line, and no terminal."""
    args = ["chat", "-m", model, "--drafter", "none", "--threads", "1", "-n", "4", "--ctx-size", "256"]
    proc = subprocess.run(
        [sys.executable, "-m", "specllm", *map(str, args)],
        input="\n".join(commands) + "\n",
        capture_output=True,
        text=True,
        timeout=120,  # a command that waits for ever fails the test instead of hanging it
    )
    assert proc.returncode == 0 and "Traceback" not in proc.stderr, proc.stderr
    return proc


def test_load_of_what_is_no_regular_file_is_one_line_and_the_chat_goes_on(tiny_models, tmp_path):
    """/load of a FIFO waited for ever for a writer, and of /dev/zero read until memory ran out."""
    fifo, saved = tmp_path / "pipe", tmp_path / "saved.json"
    os.mkfifo(fifo)
    commands = [f"/load {fifo}", "/load /dev/null", f"/load {tmp_path}", f"/save {fifo}", "Hello", f"/save {saved}"]
    out = flat(chat_piped(tiny_models.target, commands).stdout)
    assert f"error: cannot read {fifo}: it is a FIFO, not a regular file" in out
    assert "error: cannot read /dev/null: it is a device, not a regular file" in out
    assert f"error: cannot read {tmp_path}: it is a folder, not a regular file" in out
    assert f"error: cannot save to {fifo}: it is a FIFO, not a regular file" in out
    assert stat.S_ISFIFO(fifo.stat().st_mode)
    assert [t["user"] for t in json.loads(saved.read_text())["turns"]] == ["Hello"]


def test_save_over_a_read_only_file_is_one_line_keeps_it_and_the_chat_goes_on(tiny_models, tmp_path):
    """/save replaced a file made read-only to keep it (the rename needs only the folder's
    permission), even as root."""
    kept, saved = tmp_path / "kept.json", tmp_path / "saved.json"
    kept.write_text("mine\n")
    kept.chmod(0o444)
    out = flat(chat_piped(tiny_models.target, [f"/save {kept}", "Hello", f"/save {saved}"]).stdout)
    assert f"error: cannot save to {kept}: the file is read-only" in out
    assert kept.read_text() == "mine\n" and stat.S_IMODE(kept.stat().st_mode) == 0o444
    assert [t["user"] for t in json.loads(saved.read_text())["turns"]] == ["Hello"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["kept.json", "saved.json"]


@pytest.mark.parametrize("signum, code", [("SIGHUP", 129), ("SIGTERM", 143)])
def test_a_closed_terminal_or_sigterm_saves_the_conversation_for_resume(chat, signum, code):
    """SIGHUP (the terminal closed) or SIGTERM during a reply: the conversation, the message being
    answered with its partial reply, is written to the state folder, as when llama.cpp aborts."""
    import signal

    term = chat(**ENDLESS)
    term.send("Hello world\r")
    term.expect(STREAMING)  # mid-reply
    term.proc.send_signal(getattr(signal, signum))
    assert term.wait() == code
    saved = list((Path(os.environ["XDG_STATE_HOME"]) / "specllm").glob("chat-*.json"))
    assert len(saved) == 1 and f"specllm chat --resume {saved[0]}" in flat(term.text)
    turns = json.loads(saved[0].read_text())["turns"]
    assert [(t["user"], t["stop_reason"]) for t in turns] == [("Hello world", "interrupted")] and turns[0]["reply"]
    assert "Traceback" not in term.text


def test_a_message_far_longer_than_the_context_is_refused_as_such_and_the_chat_goes_on(tiny_models):
    """A 40 MB message (a file piped in by mistake) is refused for not fitting, from the tokens of
    its start, not as the chat template's failure on its size."""
    huge = "hello world " * 3_400_000
    proc = chat_piped(tiny_models.target, [huge, "Hello"])
    out = flat(proc.stdout + proc.stderr)
    assert f"error: the message is 2050 tokens in its first 4096 of {len(huge)} characters" in out, out[-500:]
    assert "shorten it or raise --ctx-size" in out and out.count("[max_tokens]") == 1  # "Hello" got its reply


def _chat_ended_by_sigterm(tiny_models, env: dict, preexec_fn=None) -> str:
    """A piped chat, ended by SIGTERM after its first reply: its stderr."""
    import signal

    args = ["chat", "-m", tiny_models.target, "--drafter", "none", "--threads", "1", "-n", "4", "--temperature", "0"]
    proc = subprocess.Popen(
        [sys.executable, "-m", "specllm", *map(str, args)],
        stdin=subprocess.PIPE,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, **env},
        preexec_fn=preexec_fn,
    )
    proc.stdin.write("Hello\n")
    proc.stdin.flush()
    lines = []
    while not lines or not lines[-1].startswith("[max_tokens]"):  # the reply's summary
        lines.append(proc.stderr.readline())
        assert lines[-1], "".join(lines)
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(60) == 143
    return proc.stderr.read()


def test_a_chat_ended_where_its_state_folder_cannot_be_written_is_saved_elsewhere_or_said_lost(tiny_models, tmp_path):
    """SIGTERM saves the conversation for --resume: in the temporary folder when the state folder
    cannot take it (here under a file; a full disk, a read-only home alike), and where neither
    can, the user is told it is lost (it was lost without a word)."""
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    spare = tmp_path / "tmp"
    spare.mkdir()
    rest = _chat_ended_by_sigterm(tiny_models, {"XDG_STATE_HOME": str(blocker / "state"), "TMPDIR": str(spare)})
    [saved] = spare.glob("chat-*.json")
    assert rest.splitlines() == [f"specllm: the conversation is saved: specllm chat --resume {saved}", "terminated"]
    assert [turn["user"] for turn in json.loads(saved.read_text())["turns"]] == ["Hello"]

    def no_file_can_grow():  # a full disk everywhere (Python ignores SIGXFSZ: a write fails with EFBIG)
        import resource

        resource.setrlimit(resource.RLIMIT_FSIZE, (0, 0))

    state = tmp_path / "state"
    rest = _chat_ended_by_sigterm(tiny_models, {"XDG_STATE_HOME": str(state), "TMPDIR": str(spare)}, no_file_can_grow)
    lost, ended = rest.splitlines()
    in_state = re.escape(str(state / "specllm")) + r"/chat-[0-9-]+\.json: File too large"
    in_temporary = r"No usable temporary directory found in \[" + re.escape(repr(str(spare)))
    assert re.match(f"specllm: the conversation is lost: cannot save to {in_state}; {in_temporary}", lost), lost
    assert ended == "terminated"
    assert list(spare.glob("*")) == [saved] and list((state / "specllm").glob("*")) == []  # nothing half-written

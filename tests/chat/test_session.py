"""ChatSession on the tiny real GGUF models: KV reuse across turns, fallbacks, overflow trimming,
interrupts and slash commands. (tests/chat/test_repl.py drives the real `specllm chat` process.)"""

from __future__ import annotations

import dataclasses
import gc
import json
import random
import signal
import threading
import time
import weakref

import llama_cpp
import pytest
import tiny_models as tm
from slowed import closed_from_another_thread, slowed

import specllm
from specllm.chat import session as chat
from specllm.chat.repl import command, is_command, stats_lines
from specllm.chat.session import ChatSession, read_transcript
from specllm.engine.loop import make_config
from specllm.errors import ContextFull
from specllm.llama.model import common_prefix

SYSTEM = "You are terse."
MESSAGES = ["Hello world", "def add(a, b):", "print the value", "return self.data", "Once upon a time"]


def load(path_target, path_draft=None, n_ctx=512):
    return specllm.load(str(path_target), str(path_draft) if path_draft else None, n_ctx=n_ctx, n_threads=1)


def greedy(**kw):
    return make_config(**{"max_tokens": 16, "temperature": 0.0, "drafter": "model", "gamma": 4, **kw})


def turn(session, message):
    """One whole turn: (prepared, result)."""
    prepared = session.prepare(message)
    result = session.stream(prepared).run()
    return prepared, result


NEAR_TIE = 0.02  # llama.cpp logits depend on batch shape by up to ~7e-3 here (tests/tiny_models.py)


def assert_fresh_reply(engine, tokens, reply, **kw):
    """`reply` is what target-only greedy decoding of `tokens` from empty KV caches gives, or
    differs from it first where the target's top two logits are a near-tie (the chat evaluated the
    same positions in other batch shapes; README, Fidelity: such flips are expected, large-gap ones are bugs)."""
    engine.target.truncate(0)
    fresh = engine.generate(tokens, config=greedy(drafter="none", **kw)).tokens
    if fresh == reply:
        return
    j = next((k for k, (a, b) in enumerate(zip(fresh, reply)) if a != b), None)
    assert j is not None, f"lengths differ: {len(fresh)} vs {len(reply)}"
    engine.target.truncate(0)
    logits = engine.target.sync(tokens + fresh[:j], n_logits=1)[0]
    # evaluated here in yet another batch shape, the two may even swap order: a near-tie either way
    gap = float(logits[fresh[j]] - logits[reply[j]])
    assert abs(gap) < NEAR_TIE, f"reply differs from a fresh run at token {j} with a logit gap of {gap}"


def prompt_length(engine, message):
    text = engine.target.render_chat([{"role": "system", "content": SYSTEM}, {"role": "user", "content": message}])
    return len(engine.prompt_tokens(text))


def kv_matches_record(model) -> bool:
    """llama.cpp's KV cache holds exactly the positions Model.tokens says it does."""
    pos_max = llama_cpp.llama_memory_seq_pos_max(llama_cpp.llama_get_memory(model._ctx), 0)
    return pos_max == len(model.tokens) - 1


@pytest.fixture
def engines(tiny_models):
    chat_engine = load(tiny_models.target, tiny_models.draft)
    reference = load(tiny_models.target)
    yield chat_engine, reference
    chat_engine.close()
    reference.close()


def test_later_turns_prefill_only_their_new_tokens(engines):
    engine, _ = engines
    session = ChatSession(engine, greedy(), system=SYSTEM)
    prefills = []
    last_text, last_tokens = "", []
    for i, message in enumerate(MESSAGES + ["Hello world"] * 3):
        prepared, result = turn(session, message)
        assert result.stop_reason == "max_tokens"  # so the last reply token is not in the KV cache
        if i == 0:
            assert not prepared.extended and result.stats.prefill_tokens == len(prepared.tokens) - 1
        else:
            # The rendered text extends the previous turn's: its tokens are reused as generated,
            # and only the template's tail (end of reply, next user message, header) is new.
            assert prepared.extended and prepared.reused == len(last_tokens)
            assert prepared.tokens[: prepared.reused] == last_tokens
            tail = prepared.text[len(last_text) :]
            assert tail.startswith("<|im_end|>") and tail.endswith(f"{message}<|im_end|>\n<|im_start|>assistant\n")
            assert len(prepared.tokens) - prepared.reused == len(engine.target.tokenize(tail, add_special=False))
            # The last reply token was never evaluated, so it is prefilled with the new ones.
            assert result.stats.prefill_tokens == len(prepared.tokens) - prepared.reused
            prefills.append(result.stats.prefill_tokens)
        last_text, last_tokens = prepared.text + result.text, prepared.tokens + result.tokens
    # The same message costs the same prefill at turns 6, 7 and 8: it does not grow with history.
    assert prefills[-3:] == [prefills[-3]] * 3 and len(prepared.tokens) > 10 * prefills[-1]


def test_multi_turn_greedy_replies_equal_fresh_runs(engines):
    engine, reference = engines
    session = ChatSession(engine, greedy(), system=SYSTEM)
    for message in MESSAGES:
        prepared, result = turn(session, message)
        # The chat (speculative, KV reused) equals target-only decoding of the same tokens from
        # empty caches ...
        assert_fresh_reply(reference, prepared.tokens, result.tokens)
        # ... and the reply goes into the history as generated.
        assert session.turns[-1].reply == result.text
        if message == MESSAGES[0]:
            first_tokens = prepared.tokens
    # The first turn's tokens are the rendered text's, as a fresh `run` of it would tokenize them.
    messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": MESSAGES[0]}]
    assert reference.prompt_tokens(engine.target.render_chat(messages)) == first_tokens
    assert reference.prompt_tokens(MESSAGES[0], chat=True, system=SYSTEM) == first_tokens


def test_retokenizing_the_transcript_would_reprefill_replies(engines):
    """Why the extension path exists: on these models a reply's text often tokenizes differently
    from how it was generated (byte tokens -> U+FFFD), so whole-text tokenization would re-prefill it."""
    engine, _ = engines
    session = ChatSession(engine, greedy(), system=SYSTEM)
    lost = []
    for message in MESSAGES:
        last = session.cache.tokens
        prepared, _ = turn(session, message)
        if last is not None:
            lost.append(len(last) - common_prefix(last, engine.prompt_tokens(prepared.text)))
    assert sum(n > 0 for n in lost) >= len(lost) // 2


def test_a_reply_cut_by_a_stop_string_is_not_reused_as_text(engines):
    """A stop string cuts a reply's text, not its tokens: the KV cache holds the token that
    completed the stop string, which the conversation's text no longer has. The next turn must
    tokenize the conversation whole (engine/prompt_cache.py) rather than extend the cut reply's
    tokens, or the model would see a stop string the transcript does not hold."""
    engine, _ = engines
    session = ChatSession(engine, greedy(drafter="none", max_tokens=32), system=SYSTEM)
    _, full = turn(session, MESSAGES[0])
    stop = full.text[8:12]
    session.reset()
    session.config = dataclasses.replace(session.config, stop=(stop,))
    _, cut = turn(session, MESSAGES[0])
    assert cut.stop_reason == "stop" and cut.text == full.text[: full.text.index(stop)]
    assert session.cache.tokens is None
    prepared = session.prepare(MESSAGES[1])
    assert not prepared.extended and prepared.tokens == engine.prompt_tokens(prepared.text)
    assert prepared.reused > 0  # the common token prefix still came from the KV cache


def test_template_that_rewrites_history_falls_back_to_common_prefix(tmp_path, tiny_models):
    # This template upper-cases the assistant's replies, so the history is not rendered as
    # generated: the text does not extend the previous turn's.
    template = tm.CHATML_TEMPLATE.replace(
        "message['content']", "(message['content'] | upper if message['role'] == 'assistant' else message['content'])"
    )
    path = tm.write_model(tmp_path / "upper.gguf", chat_template=template)
    engine, reference = load(path), load(path)
    session = ChatSession(engine, greedy(drafter="ngram"))
    last_prompt = 0
    for i, message in enumerate(MESSAGES[:4]):
        before = list(engine.target.tokens)
        prepared, result = turn(session, message)
        if i:
            full = engine.prompt_tokens(prepared.text)
            assert not prepared.extended and prepared.tokens == full
            assert prepared.reused == common_prefix(before, full) >= last_prompt  # up to the last reply
            assert result.stats.prefill_tokens == len(full) - 1 - prepared.reused
        assert_fresh_reply(reference, prepared.tokens, result.tokens)
        last_prompt = len(prepared.tokens)


def test_system_prompt_and_reset(engines):
    engine, _ = engines
    session = ChatSession(engine, greedy(), system=SYSTEM)
    turn(session, "Hello world")
    assert command(session, "/system").text == f"system prompt: {SYSTEM!r}"
    command(session, "/system You are verbose.")
    prepared, result = turn(session, "def add(a, b):")
    assert not prepared.extended
    assert session.messages()[0] == {"role": "system", "content": "You are verbose."}
    assert "You are verbose." in prepared.text and SYSTEM not in prepared.text
    assert result.stats.prefill_tokens > len(prepared.tokens) // 2  # the history had to be redone
    assert "system prompt stays" in command(session, "/reset").text
    assert session.turns == [] and session.messages() == [{"role": "system", "content": "You are verbose."}]
    prepared, _ = turn(session, "x")
    assert prepared.text.count("<|im_start|>user") == 1


def test_model_without_template_falls_back_to_chatml_with_a_notice(tiny_models):
    engine = load(tiny_models.no_template)
    session = ChatSession(engine, greedy(drafter="none"))
    assert session.notices == ["no_template.gguf has no chat template: using ChatML"]
    prepared, result = turn(session, "Hello world")
    assert prepared.text == "<|im_start|>user\nHello world<|im_end|>\n<|im_start|>assistant\n"
    assert result.tokens and ChatSession(load(tiny_models.target), greedy()).notices == []


def test_context_overflow_drops_oldest_turns_but_never_the_system_prompt(engines, tiny_models):
    engine = load(tiny_models.target, tiny_models.draft, n_ctx=256)  # llama.cpp's smallest
    _, reference = engines
    session = ChatSession(engine, greedy(), system=SYSTEM)
    n_ctx, reserve = session.n_ctx, 16
    drops = 0
    for i in range(16):
        prepared, result = turn(session, MESSAGES[i % len(MESSAGES)])
        assert len(prepared.tokens) + reserve <= n_ctx
        assert_fresh_reply(reference, prepared.tokens, result.tokens)
        if prepared.dropped:
            drops += 1
            assert prepared.notices[0].startswith("context full: dropped the ")
            # dropped with a quarter of the context to spare, so the next turns fit too
            assert not prepared.extended and len(prepared.tokens) <= n_ctx - reserve - n_ctx // 4
            assert all(not t.in_context for t in prepared.dropped)
            assert result.stats.prefill_tokens > len(prepared.tokens) // 2  # prefilled again
    assert drops >= 2 and session.dropped > drops
    live = [t for t in session.turns if t.in_context]
    assert session.messages()[0] == {"role": "system", "content": SYSTEM}
    assert session.messages()[1]["content"] == live[0].user and len(live) < len(session.turns) == 16


def test_a_long_loaded_conversation_drops_its_oldest_turns_in_a_few_renders(tiny_models, tmp_path):
    """Dropping rendered the whole conversation once per turn it tried to drop: a saved
    conversation of thousands of turns resumed in a smaller context took minutes to send a message."""
    engine = load(tiny_models.target, n_ctx=256)
    session = ChatSession(engine, greedy(drafter="none"), system=SYSTEM)
    turns = tuple(chat.Turn(f"question {i}", f"answer {i}", "eos") for i in range(400))
    session.restore(chat.SavedChat(tmp_path / "long.json", SYSTEM, turns, None))
    renders, render_chat = [], engine.target.render_chat
    engine.target.render_chat = lambda messages, **kw: renders.append(1) or render_chat(messages, **kw)
    prepared = session.prepare("Hello")
    assert len(renders) <= 12  # 1 + log2(400) + 1, not hundreds
    goal = session.n_ctx - session._reserve() - session.n_ctx // 4
    fewest = next(
        n for n in range(len(turns)) if len(session._render(list(turns[n:]), chat.Turn("Hello")).tokens) <= goal
    )
    assert len(prepared.dropped) == fewest and len(prepared.tokens) <= goal
    assert prepared.tokens == session._render(list(turns[fewest:]), chat.Turn("Hello")).tokens


def test_a_message_longer_than_the_context_is_refused(tiny_models):
    engine = load(tiny_models.target, tiny_models.draft, n_ctx=256)
    session = ChatSession(engine, greedy(), system=SYSTEM)
    turn(session, "Hello")
    refusal = r"^this message is \d+ tokens with the system prompt but the context holds 256$"
    with pytest.raises(ContextFull, match=refusal):  # the library names no flag: the REPL adds its hint
        session.prepare("the name of the class is " * 50)
    assert len(session.turns) == 1 and session.turns[0].in_context  # nothing dropped for it
    # A message that fits alone, with less room than a reply wants (16 tokens):
    candidates = ["the name of the class is " * k for k in range(30, 50)]
    fits = max(candidates, key=lambda m: (prompt_length(engine, m) < 250, len(m)))
    assert 244 <= prompt_length(engine, fits) < 250
    prepared, result = turn(session, fits)
    assert result.stop_reason == "context_full" and session.turns[-1].reply == result.text
    assert "context 256 of 256 tokens in use" in stats_lines(session)  # not the 257 of its transcript
    assert [t.in_context for t in session.turns] == [False, True] and prepared.dropped
    assert prepared.notices[0].startswith("context full: dropped the 1 oldest turn;")
    assert prepared.notices[1] == f"only {256 - len(prepared.tokens)} tokens of context left for the reply"
    alone = ChatSession(engine, greedy(), system=SYSTEM).prepare(fits)  # nothing to drop: no such notice
    assert alone.tokens == prepared.tokens and not alone.dropped and alone.notices == prepared.notices[1:]


def test_stopping_a_reply_keeps_the_partial_reply_and_the_next_turn_is_exact(engines):
    engine, reference = engines
    session = ChatSession(engine, greedy(max_tokens=64), system=SYSTEM)
    turn(session, "Hello world")
    events = session.stream(session.prepare("def add(a, b):"))
    steps = [next(events) for _ in range(4)]
    events.close()  # what the terminal does on Ctrl-C
    partial = session.turns[-1]
    assert len(session.turns) == 2 and partial.user == "def add(a, b):"
    assert partial.stop_reason == "interrupted" and partial.to_dict()["interrupted"]
    assert partial.reply == "".join(s.accepted_text + s.token_text for s in steps) != ""
    prepared, result = turn(session, "print the value")
    assert not prepared.extended  # the partial reply is rendered from its text and tokenized anew
    assert {"role": "assistant", "content": partial.reply} in session.messages()
    assert prepared.reused > len(partial.reply) // 8  # most of the history still came from the cache
    assert_fresh_reply(reference, prepared.tokens, result.tokens, max_tokens=64)
    assert kv_matches_record(engine.target) and kv_matches_record(engine.draft)
    assert session.totals()["interrupted"] == 1


def test_a_reply_cancelled_from_another_thread_is_kept_as_an_interrupted_turn(engines):
    """A reply is a Generation, whose cancel() (any thread: a UI's stop button) did nothing: the
    reply went on to its max_tokens. It now stops after the step under way, as close() does."""
    engine, _ = engines
    session = ChatSession(engine, greedy(max_tokens=64), system=SYSTEM)
    early = session.stream(session.prepare("Hello world"))
    early.cancel()  # before its first step: nothing generated, the message dropped
    assert list(early) == [] and not early.finished and session.turns == []
    reply = session.stream(session.prepare("def add(a, b):"))
    first = next(reply)
    canceller = threading.Thread(target=reply.cancel)
    canceller.start()
    canceller.join(5)
    assert list(reply) == [] and not reply.finished
    [partial] = session.turns
    assert (partial.stop_reason, partial.reply) == ("interrupted", first.accepted_text + first.token_text)
    assert session.totals()["interrupted"] == 2
    assert turn(session, "print the value")[1].stats.generated_tokens == 64


def test_a_reply_closed_from_another_thread_stops_after_the_step_under_way(engines, monkeypatch):
    """A reply's close() from another thread (as an engine generation's may be) raised "generator
    already executing" while the consumer was in a step."""
    engine, _ = engines
    session = ChatSession(engine, greedy(max_tokens=200, drafter="none"), system=SYSTEM)
    slowed(monkeypatch, "llama_decode")  # each step spends most of its time inside llama.cpp
    reply = session.stream(session.prepare("def add(a, b):"))
    steps = closed_from_another_thread(reply)
    assert not reply.finished and len(steps) < 50
    [partial] = session.turns
    assert partial.stop_reason == "interrupted" and not session.generating


def test_a_reply_closed_before_it_started_leaves_no_trace(engines):
    engine, _ = engines
    session = ChatSession(engine, greedy(), system=SYSTEM)
    turn(session, "Hello world")
    events = session.stream(session.prepare("def add(a, b):"))
    events.close()  # nothing generated (Ctrl-C inside the prefill: see the test below)
    assert [t.user for t in session.turns] == ["Hello world"] and session.totals()["turns"] == 1
    assert turn(session, "x")[0].extended  # the previous turn's transcript still stands


def test_a_reply_that_stops_before_its_first_token_leaves_no_turn(tiny_models):
    # A failure inside the engine before any token takes the same path as a Ctrl-C in the prefill.
    session = ChatSession(load(tiny_models.target), greedy(drafter="ngram"), system=SYSTEM)
    turn(session, "Hello world")
    session.config = greedy(drafter="model")  # no draft model loaded: the engine refuses
    with pytest.raises(specllm.SpecllmError, match="needs a draft model"):
        turn(session, "def add(a, b):")
    assert [t.user for t in session.turns] == ["Hello world"] and session.totals()["interrupted"] == 1
    assert session.messages()[-1]["role"] == "assistant"  # roles still alternate


def test_keyboard_interrupts_anywhere_leave_the_kv_caches_consistent(engines):
    """Ctrl-C lands wherever the engine happens to be (inside a decode, a truncate, a draft):
    raise KeyboardInterrupt from a timer at random moments, then check the next turn."""
    engine, reference = engines
    long_replies, short_replies = greedy(max_tokens=200), greedy(max_tokens=8)
    session = ChatSession(engine, long_replies, system=SYSTEM)
    rng = random.Random(0)
    armed = False

    def interrupt(*_):
        if armed:
            raise KeyboardInterrupt

    old = signal.signal(signal.SIGALRM, interrupt)
    interrupted = 0
    # Timers within the length of a whole long turn, as measured here: a fixed window would race the
    # model's speed (the tiny models finish a 200-token turn in ~40 ms, and a faster machine sooner).
    window = 0.15
    try:
        for i in range(40):  # until 6 interrupts landed mid-turn (a reply may finish before its timer)
            if interrupted >= 6:
                break
            n_turns = len(session.turns)
            session.config = long_replies
            armed = True
            signal.setitimer(signal.ITIMER_REAL, rng.uniform(0.001, window))
            started = time.perf_counter()
            try:
                turn(session, MESSAGES[i % len(MESSAGES)])
                armed = False
                window = time.perf_counter() - started  # it finished before its timer
            except KeyboardInterrupt:
                armed = False
                interrupted += 1
            assert len(session.turns) - n_turns in (0, 1)
            session.config = short_replies
            prepared, result = turn(session, "x")
            assert_fresh_reply(reference, prepared.tokens, result.tokens, max_tokens=8)
            assert kv_matches_record(engine.target) and kv_matches_record(engine.draft)
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)
    # (an interrupt that lands in prepare(), before the reply started, leaves no turn behind)
    assert interrupted >= 6 and interrupted >= session.totals()["interrupted"] >= interrupted // 2


def test_each_slash_command_changes_the_session_or_says_what_is_wrong(tmp_path, engines):
    engine, _ = engines
    session = ChatSession(engine, greedy(seed=7), system=SYSTEM)
    assert is_command("/help") and not is_command("//not a command") and not is_command("hi /x")
    help_text = command(session, "/help").text
    for name in ("/help", "/reset", "/stats", "/gamma", "/drafter", "/temp", "/system", "/save", "/exit"):
        assert name in help_text
    assert command(session, "/gamma 2").text == "gamma 2" and session.config.gamma == 2
    assert command(session, "/drafter ngram").text == "drafter ngram" and session.config.drafter == "ngram"
    assert command(session, "/temp 0.5").text == "temperature 0.5" and session.config.sampler.temperature == 0.5
    assert command(session, "/temp 0").text == "temperature 0 (greedy)"
    for bad, why in [
        ("/gamma x", "usage: /gamma N"),
        ("/gamma 0", "gamma"),
        ("/temp -1", "temperature"),
        ("/temp warm", "usage: /temp T"),
        ("/drafter magic", "usage: /drafter"),
        ("/bogus", "unknown command /bogus"),
        ("/save", "usage: /save FILE"),
        (f"/save {tmp_path}", "cannot save to"),
        ("/reset all", "/reset takes no argument"),
        ("/exit now", "/exit takes no argument"),
        ("/stats full", "/stats takes no argument"),
        ("/help gamma", "/help takes no argument"),
    ]:
        with pytest.raises(specllm.SpecllmError, match=why):
            command(session, bad)
    assert session.config.gamma == 2 and session.config.sampler.temperature == 0  # bad input changed nothing
    assert command(session, "/exit").exit and command(session, "/quit").exit and not command(session, "/stats").exit


def test_drafter_model_needs_a_draft(tiny_models):
    session = ChatSession(load(tiny_models.target), greedy(drafter="ngram"))
    with pytest.raises(specllm.SpecllmError, match="needs a draft model"):
        command(session, "/drafter model")
    assert session.config.drafter == "ngram"


def test_drafter_model_loads_a_deferred_draft_and_auto_is_a_drafter(tiny_models):
    engine = specllm.load(str(tiny_models.target), str(tiny_models.draft), n_ctx=512, n_threads=1, defer_draft=True)
    session = ChatSession(engine, greedy(drafter="auto", gamma=None))
    session.send(MESSAGES[0])
    assert any(line.startswith("auto: n-gram ") for line in stats_lines(session))
    assert command(session, "/gamma 3").text == "gamma 3" and session.config.gamma == 3
    assert command(session, "/gamma auto").text == "gamma auto" and session.config.gamma is None
    command(session, "/gamma 4")
    command(session, "/drafter model")
    assert engine.draft is not None and session.config.drafter == "model"
    assert session.send(MESSAGES[1]).stats.n_drafted > 0
    command(session, "/drafter auto")
    assert session.config.drafter == "auto"
    assert not any(line.startswith("auto: ") for line in stats_lines(ChatSession(engine, greedy(drafter="none"))))


def test_totals_add_up_the_turns_and_a_saved_session_loads_back(tmp_path, engines):
    engine, _ = engines
    session = ChatSession(engine, greedy(seed=7), system=SYSTEM)
    results = [session.send(m) for m in MESSAGES[:3]]
    totals = session.totals()
    assert totals["turns"] == 3 and totals["generated_tokens"] == sum(len(r.tokens) for r in results)
    assert totals["drafted"] == sum(r.stats.n_drafted for r in results) > 0
    assert totals["prefill_tokens"] < totals["prompt_tokens"] / 2  # KV reuse across turns
    lines = "\n".join(stats_lines(session))
    assert f"generated {totals['generated_tokens']} tokens" in lines and "turns 3 (0 interrupted" in lines
    assert f"context {len(engine.target.tokens) + 1} of 512" in lines
    path = tmp_path / "chat.json"
    assert command(session, f"/save {path}").text == f"saved 3 turns to {path}"
    saved = json.loads(path.read_text())
    assert [t["user"] for t in saved["turns"]] == MESSAGES[:3]
    assert [t["reply"] for t in saved["turns"]] == [r.text for r in results]
    assert saved["messages"][0] == {"role": "system", "content": SYSTEM} and len(saved["messages"]) == 7
    assert saved["settings"]["seed"] == 7 and saved["settings"]["drafter"] == "model"
    assert saved["session"]["generated_tokens"] == totals["generated_tokens"]


def test_a_long_session_keeps_only_the_totals_of_the_turns_it_forgot(engines):
    """/stats adds up every turn of the session, /reset or not: the session kept each turn's Stats
    for it (its policy report included), a list that grew with every turn for as long as the chat
    ran, however often the conversation was reset."""
    engine, _ = engines
    session = ChatSession(engine, greedy(max_tokens=4, drafter="auto", gamma=None), system=SYSTEM)
    results = [session.send(MESSAGES[i % len(MESSAGES)]) for i in range(3)]
    for i in range(21):
        if i % 3 == 0:
            command(session, "/reset")
        results.append(session.send(MESSAGES[i % len(MESSAGES)]))
    totals = session.totals()
    assert totals["turns"] == 24 and totals["generated_tokens"] == sum(len(r.tokens) for r in results)
    assert totals["target_calls"] == sum(r.stats.target_calls for r in results)
    assert any(line.startswith("auto: ") for line in stats_lines(session))
    kept = [weakref.ref(r.stats) for r in results]
    del results
    gc.collect()
    assert sum(ref() is not None for ref in kept) == len(session.turns) == 3  # those of the turns since /reset


def sampled(**kw):
    return make_config(**{"max_tokens": 16, "temperature": 1.0, "drafter": "model", "gamma": 3, **kw})


def replay_session(engine, seed):
    """One scripted session at temperature 1: the same message twice, /reset, the same message."""
    session = ChatSession(engine, sampled(seed=seed), system=SYSTEM)
    assert engine.target.tokens == engine.draft.tokens == []
    replies = [session.send("Hello world").tokens, session.send("Hello world").tokens]
    command(session, "/reset")
    replies.append(session.send("Hello world").tokens)
    return session, replies


def test_each_reply_continues_the_sessions_random_stream(engines, tmp_path):
    engine, _ = engines
    session, replies = replay_session(engine, seed=11)
    first, second, after_reset = replies
    assert second != first
    # Same prompt tokens as the first turn (the same message after /reset), yet its own draws.
    assert after_reset != first
    assert [t.seed for t in session.turns] == [chat.turn_seed(11, 2)] and chat.turn_seed(11, 0) != chat.turn_seed(11, 1)
    # The whole session replayed with its seed, from empty KV caches as the first, replays every reply.
    engine.target.truncate(0)
    engine.draft.truncate(0)
    assert replay_session(engine, seed=11)[1] == replies
    # The session's one seed is what /stats and /save show.
    assert "seed 11" in command(session, "/stats").text
    command(session, f"/save {tmp_path / 's.json'}")
    saved = json.loads((tmp_path / "s.json").read_text())
    assert saved["settings"]["seed"] == 11 and saved["turns"][0]["seed"] == chat.turn_seed(11, 2)


def test_a_session_without_a_seed_gets_one_and_shows_it(engines):
    engine, _ = engines
    session = ChatSession(engine, sampled())
    seed = session.config.sampler.seed
    assert isinstance(seed, int) and f"seed {seed}" in command(session, "/stats").text


# --- /load and chat --resume (issue 12, item 4) -----------------------------------------------------


def save(session, path):
    assert "saved" in command(session, f"/save {path}").text
    return path


def test_a_loaded_conversation_continues_with_the_tokens_the_saved_one_had(tiny_models, tmp_path):
    config = greedy(drafter="none")
    original = ChatSession(load(tiny_models.target), config, SYSTEM)
    for message in MESSAGES[:2]:
        turn(original, message)
    path = save(original, tmp_path / "chat.json")
    expected, expected_reply = turn(original, MESSAGES[2])

    resumed = ChatSession(load(tiny_models.target), config)
    assert command(resumed, f"/load {path}").text.startswith(f"loaded 2 turns from {path}")
    assert resumed.system == SYSTEM and [t.reply for t in resumed.turns] == [t.reply for t in original.turns[:2]]
    prepared, reply = turn(resumed, MESSAGES[2])
    # the saved generated tokens are reused as they were: re-tokenizing the replies' text would
    # give other tokens here (tests/chat/test_session.py::test_retokenizing_the_transcript_would_reprefill_replies)
    assert prepared.extended and prepared.tokens == expected.tokens
    assert reply.stats.prefill_tokens == len(prepared.tokens) - 1  # the whole conversation, at once
    assert_fresh_reply(resumed.engine, prepared.tokens, reply.tokens)
    assert_fresh_reply(original.engine, expected.tokens, expected_reply.tokens)
    resumed.engine.close()
    original.engine.close()


@pytest.mark.parametrize("tamper", ["edited_reply", "other_tokens", "outside_the_vocabulary", "none"])
def test_saved_tokens_that_do_not_spell_the_conversation_are_not_used(engines, tmp_path, tamper):
    engine, _ = engines
    original = ChatSession(engine, greedy(drafter="none"))
    for message in MESSAGES[:2]:
        turn(original, message)
    data = json.loads(save(original, tmp_path / "chat.json").read_text())
    tokens = data["context_tokens"]
    if tamper == "edited_reply":
        data["turns"][-1]["reply"] += " (edited)"
    elif tamper == "other_tokens":
        tokens[-1] = (tokens[-1] + 1) % engine.target.n_vocab
    elif tamper == "outside_the_vocabulary":
        tokens[-1] = engine.target.n_vocab + 5
    else:
        data["context_tokens"] = None
    (tmp_path / "chat.json").write_text(json.dumps(data))
    resumed = ChatSession(engine, greedy(drafter="none"))
    command(resumed, f"/load {tmp_path / 'chat.json'}")
    prepared, reply = turn(resumed, MESSAGES[2])
    assert not prepared.extended  # the conversation's text, tokenized afresh
    assert prepared.tokens == engine.prompt_tokens(prepared.text)
    assert_fresh_reply(engine, prepared.tokens, reply.tokens)


@pytest.mark.parametrize("tamper", [None, "edited_reasoning"])
def test_a_thinking_models_saved_tokens_are_reused_and_saved_again(tmp_path, tamper):
    """A reply that is reasoning is not the turn's answer text: its tokens spell the reasoning.
    The restored conversation kept them, and a second /save wrote them again (it wrote none)."""
    import tool_templates

    engine = load(tm.write_model(tmp_path / "qwen35_templated.gguf", seed=0, chat_template=tool_templates.QWEN35))
    config = make_config(max_tokens=6, temperature=0.0, drafter="none")
    try:
        original = ChatSession(engine, config)
        original.send("Hello")
        assert original.turns[0].reasoning and not original.turns[0].reply
        data = json.loads(save(original, tmp_path / "chat.json").read_text())
        if tamper:
            data["turns"][0]["reasoning"] += " (edited)"
            (tmp_path / "chat.json").write_text(json.dumps(data))
        resumed = ChatSession(engine, config)
        command(resumed, f"/load {tmp_path / 'chat.json'}")
        again = json.loads(save(resumed, tmp_path / "again.json").read_text())
        assert again["context_tokens"] == (None if tamper else data["context_tokens"])
        if not tamper:  # the next turn's prompt as the saved session would have made it
            expected, prepared = original.prepare("Thanks"), resumed.prepare("Thanks")
            assert (prepared.text, prepared.tokens) == (expected.text, expected.tokens)
    finally:
        engine.close()


@pytest.mark.parametrize("partial", ["", "Hel"])
def test_a_last_message_interrupted_before_its_reply_began_is_left_out_when_loaded(engines, tmp_path, partial):
    """As the live session drops such a message (the template would get an empty reply); one cut
    short after some text stays, as a Ctrl-C mid-reply leaves it."""
    saved = tmp_path / "chat.json"
    turns = [{"user": MESSAGES[0], "reply": "Hi", "stop_reason": "eos"}]
    turns.append({"user": MESSAGES[1], "reply": partial, "stop_reason": "interrupted"})
    saved.write_text(json.dumps({"turns": turns}))
    session = ChatSession(engines[0], greedy(drafter="none"))
    said = command(session, f"/load {saved}").text
    assert [t.user for t in session.turns] == [MESSAGES[0]] + ([MESSAGES[1]] if partial else [])
    assert session.unanswered == (None if partial else MESSAGES[1])
    assert ("its last message got no reply and is left out" in said) == (not partial)


def test_dropped_and_interrupted_turns_are_restored_as_they_were(engines, tmp_path):
    engine, _ = engines
    session = ChatSession(engine, greedy(drafter="none"))
    turn(session, MESSAGES[0])
    session.turns[0].in_context = False  # as after a context overflow
    prepared = session.prepare(MESSAGES[1])
    events = session.stream(prepared)
    next(events)
    events.close()  # interrupted after its first step
    data = json.loads(save(session, tmp_path / "chat.json").read_text())
    assert data["context_tokens"] is None
    resumed = ChatSession(engine, greedy(drafter="none"))
    command(resumed, f"/load {tmp_path / 'chat.json'}")
    assert [(t.user, t.reply, t.stop_reason, t.in_context) for t in resumed.turns] == [
        (t.user, t.reply, t.stop_reason, t.in_context) for t in session.turns
    ]
    assert resumed.turns[1].stop_reason == "interrupted" and resumed.turns[0].stats.generated_tokens == 16
    assert resumed.transcript()["turns"] == data["turns"]  # saving again loses nothing


@pytest.mark.parametrize(
    "content, fragment",
    [
        (None, "cannot read"),
        ("{not json", "not JSON"),
        ('{"system": null}', "no list of turns"),
        ('{"turns": [{"reply": "hi"}]}', "a turn has no 'user'"),
        ('{"turns": [{"user": 3, "reply": "hi"}]}', "turn 1's user message is not text"),
        ('{"turns": [], "context_tokens": ["a"]}', "context_tokens is not a list of token ids"),
        ('{"turns": [{"user": "a\\ud800", "reply": "hi"}]}', "turn 1's user message is not valid UTF-8 text"),
        ('{"system": "\\udcff", "turns": []}', "the system prompt is not valid UTF-8 text"),
        ('{"turns": [{"user": "a", "reply": "b", "stats": {"n_drafted": "x"}}]}', "stats field 'n_drafted'"),
        ('{"turns": [{"user": "a", "reply": "b", "stats": {"sources": [1]}}]}', "stats field 'sources'"),
        (
            '{"turns": [{"user": "a", "reply": "b", "stats": {"drafted_per_position": [null]}}]}',
            "stats field 'drafted_per_position'",
        ),
        ('{"turns": [{"user": "a", "reply": "b", "stats": [1]}]}', "turn 1's stats are not an object"),
        ('{"turns": [{"user": "a", "reply": "b", "dropped_from_context": "no"}]}', "is not true or false"),
        ('{"turns": [{"user": "a", "reply": "b", "seed": -1}]}', "turn 1's seed is not a seed"),
        pytest.param("[" * 100_000 + "]" * 100_000, "nested too deeply", id="nested-too-deeply"),
    ],
)
def test_a_file_that_is_no_saved_conversation_is_one_clear_error(engines, tmp_path, content, fragment):
    path = tmp_path / "chat.json"
    if content is not None:
        path.write_text(content)
    session = ChatSession(engines[0], greedy())
    with pytest.raises(specllm.SpecllmError, match="^(cannot read|.* is not a conversation saved with /save)") as e:
        command(session, f"/load {path}")
    assert fragment in str(e.value)
    assert "usage: /load FILE" in str(pytest.raises(specllm.SpecllmError, command, session, "/load").value)


def test_a_saved_conversation_edited_in_an_editor_that_writes_a_bom_loads(engines, tmp_path):
    """Windows Notepad wrote UTF-8 with a byte order mark: /load said "not JSON"."""
    session = ChatSession(engines[0], greedy(drafter="none"), system=SYSTEM)
    session.send("Hello world")
    path = tmp_path / "chat.json"
    session.save(path)
    path.write_bytes(b"\xef\xbb\xbf" + path.read_bytes().replace(b"Hello world", "Hello wörld".encode()))
    saved = read_transcript(path)
    assert saved.system == SYSTEM and [t.user for t in saved.turns] == ["Hello wörld"]


def test_a_system_prompt_that_is_not_utf8_is_refused_and_the_chat_can_still_be_saved(engines, tmp_path):
    session = ChatSession(engines[0], greedy(drafter="none"))
    turn(session, MESSAGES[0])
    with pytest.raises(specllm.SpecllmError, match="^the system prompt is not valid UTF-8 text"):
        command(session, "/system abc\udcffdef")
    assert session.system is None
    assert command(session, f"/save {tmp_path / 'chat.json'}").text.startswith("saved 1 turn to")
    assert read_transcript(tmp_path / "chat.json").turns[0].user == MESSAGES[0]


def test_a_message_that_is_not_utf8_is_refused_at_its_own_position(engines):
    """The position is the message's own, not the rendered conversation's (after the system
    prompt and the template's markup), and nothing joins the history."""
    session = ChatSession(engines[0], greedy(drafter="none"), system="Be brief.")
    turn(session, MESSAGES[0])
    with pytest.raises(specllm.SpecllmError, match=r"^the message is not valid UTF-8 text \(at character 5\)$"):
        session.prepare("abcd\udcffef")
    assert [t.user for t in session.turns] == [MESSAGES[0]]


def test_a_thinking_models_reasoning_is_kept_apart_for_its_template(tmp_path):
    """Qwen3.5's template opens a think block, which the tiny model never closes: the turn's
    reply is empty and its reasoning goes to the template as reasoning_content (and into /save).
    Without thinking (its enable_thinking false) the template closes the block: all reply."""
    import tool_templates

    engine = load(tm.write_model(tmp_path / "qwen35_templated.gguf", seed=0, chat_template=tool_templates.QWEN35))
    config = make_config(max_tokens=6, temperature=0.0, drafter="none")
    try:
        session = ChatSession(engine, config)
        reasoning = session.send("Hello").text.strip()
        assert reasoning and (session.turns[0].reply, session.turns[0].reasoning) == ("", reasoning)
        assert session.messages()[-1] == {"role": "assistant", "content": "", "reasoning_content": reasoning}
        session.save(tmp_path / "chat.json")
        assert read_transcript(tmp_path / "chat.json").turns[0].reasoning == reasoning
        off = ChatSession(engine, config, template_variables={"enable_thinking": False})
        assert off.prepare("Hello").text.endswith("<|im_start|>assistant\n<think>\n\n</think>\n\n")
        text = off.send("Hello").text
        assert (off.turns[0].reply, off.turns[0].reasoning) == (text, "")
        # An answer that writes "</think>" (with no reasoning) goes back whole: given no
        # reasoning_content, the template took the part before it for reasoning, and dropped it.
        answer = "Write </think> after the reasoning, then answer."
        saved = tmp_path / "tag.json"
        saved.write_text(json.dumps({"turns": [{"user": "How does a think block end?", "reply": answer}]}))
        off.restore(read_transcript(saved))
        assert f"<|im_start|>assistant\n{answer}<|im_end|>" in off.prepare("Thanks").text
    finally:
        engine.close()


# (a thinking_templates.py template, its variables that open the think block in the prompt, the
# marker that closes it)
OPENED_BY_PROMPT = [
    ("APRIEL16", None, "[BEGIN FINAL RESPONSE]"),  # the opening is a sentence of text
    ("HY3", {"reasoning_effort": "high"}, "</think:opensource>"),
    ("MINIMAX_M3", {"thinking_mode": "enabled"}, "</mm:think>"),
    ("KIMI_K3", None, "<|close|>think<|sep|>"),
]


@pytest.mark.parametrize("template,variables,closing", OPENED_BY_PROMPT, ids=[t[0] for t in OPENED_BY_PROMPT])
def test_a_reply_is_reasoning_where_the_prompt_opens_a_think_block_of_its_own_kind(
    tmp_path, template, variables, closing
):
    """Apriel 1.6's, Hunyuan 3's, MiniMax M3's and Kimi K3's think blocks, which their templates open in
    the generation prompt and the tiny model never closes: the reply is the turn's reasoning, not
    its answer (it was all answer), goes back to the template as reasoning_content, and survives
    /save and /load with the tokens that spell it."""
    import thinking_templates

    source = getattr(thinking_templates, template)
    engine = load(tm.write_model(tmp_path / "thinker.gguf", seed=0, chat_template=source))
    config = make_config(max_tokens=6, temperature=0.0, drafter="none")
    try:
        session = ChatSession(engine, config, template_variables=variables)
        text = session.send("Hello").text
        assert text.strip() and closing not in text
        assert (session.turns[0].reply, session.turns[0].reasoning) == ("", text.strip())
        assert session.messages()[-1] == {"role": "assistant", "content": "", "reasoning_content": text.strip()}
        data = json.loads(save(session, tmp_path / "chat.json").read_text())
        resumed = ChatSession(engine, config, template_variables=variables)
        command(resumed, f"/load {tmp_path / 'chat.json'}")
        assert resumed.turns[0].reasoning == text.strip()
        again = json.loads(save(resumed, tmp_path / "again.json").read_text())
        assert again["context_tokens"] == data["context_tokens"]
    finally:
        engine.close()


def assert_loaded_reply_extended(tmp_path, session: ChatSession, prompt: str, reply: str, turn: dict) -> None:
    """A conversation saved with its tokens (prompt, then the reply as the model wrote it) and
    /loaded: the next prompt extends that reply, and its tokens are reused."""
    tokens = session.engine.prompt_tokens(prompt + reply)  # the conversation's tokens, as /save writes them
    (tmp_path / "chat.json").write_text(json.dumps({"turns": [turn], "context_tokens": tokens}))
    command(session, f"/load {tmp_path / 'chat.json'}")
    prepared = session.prepare("Thanks")
    assert prepared.text.startswith(prompt + reply)
    assert prepared.extended and prepared.tokens[: len(tokens)] == tokens


# (a thinking_templates.py template, its variables, a reply as the model writes it: reasoning,
# then answer)
GIVEN_BACK = [
    ("MINISTRAL3", None, "[THINK]Some thought.[/THINK]An answer."),  # as a "thinking" block
    ("LFM25", {"preserve_thinking": True}, "<think>Some thought.</think>An answer."),  # as `thinking`
]


@pytest.mark.parametrize("template,variables,reply", GIVEN_BACK, ids=[t[0] for t in GIVEN_BACK])
def test_an_earlier_turns_reasoning_goes_back_where_its_template_reads_it(tmp_path, template, variables, reply):
    """Ministral 3's template reads an assistant's reasoning from a "thinking" block of its
    content, LFM2.5's from `thinking`, as llama-server passes them: given reasoning_content alone,
    they wrote the answer without it, so the next prompt no longer extended the reply as the model
    wrote it and its tokens (saved with the conversation) could not be reused."""
    import thinking_templates

    source = getattr(thinking_templates, template)
    engine = load(tm.write_model(tmp_path / "thinker.gguf", seed=0, chat_template=source))
    config = make_config(max_tokens=6, temperature=0.0, drafter="none")
    try:
        prompt = ChatSession(engine, config, template_variables=variables).prepare("Hello").text
        turn = {"user": "Hello", "reply": "An answer.", "reasoning": "Some thought.", "stop_reason": "eos"}
        assert_loaded_reply_extended(
            tmp_path, ChatSession(engine, config, template_variables=variables), prompt, reply, turn
        )
    finally:
        engine.close()


def test_functionarys_reply_is_its_text_and_its_tokens_are_reused(tmp_path):
    """functionary v3.2's prompt ends with ">>>", so a reply begins with its recipient: "all\\n"
    was kept in the turn's reply, which the template writes after its own ">>>all\\n", so the next
    prompt no longer extended the reply as the model wrote it and its tokens were not reused."""
    import tool_templates

    # its turns end with "<|eot_id|>", a control token in functionary's vocabulary: the tiny one's is "<|im_end|>"
    template = tool_templates.FUNCTIONARY_V32.replace("<|eot_id|>", "<|im_end|>")
    path = tm.write_model(tmp_path / "functionary.gguf", seed=0, chat_template=template)
    engine = load(path, n_ctx=1024)  # its system prompt alone takes 440 tokens
    config = make_config(max_tokens=6, temperature=0.0, drafter="none")
    reply = "all\nAn answer."
    try:
        prompt = ChatSession(engine, config).prepare("Hello").text
        assert prompt.endswith(">>>")
        ended = chat._ended(chat.Turn("Hello"), prompt, reply, None, None)  # as a live turn ends
        assert (ended.reasoning, ended.reply) == ("", "An answer.")
        turn = {"user": "Hello", "reply": "An answer.", "stop_reason": "eos"}
        assert_loaded_reply_extended(tmp_path, ChatSession(engine, config), prompt, reply, turn)
    finally:
        engine.close()


def test_ling3s_reply_stops_where_it_spells_its_turns_end(tmp_path, ling3_turn_end):
    """ "<|role_end|>" in text tokens ends no generation: a stop string of every reply, as
    llama-server adds it. It ran on to max_tokens."""
    import tool_templates

    engine = load(tm.write_model(tmp_path / "ling3.gguf", seed=0, chat_template=tool_templates.LING3), n_ctx=1024)
    config = make_config(max_tokens=12, temperature=0.0, drafter="none")
    try:
        raw = ChatSession(engine, config).send("Hello").text
        at = len(raw) // 2
        ling3_turn_end(raw[at : at + 3])
        assert raw.find(raw[at : at + 3]) == at
        result = ChatSession(engine, config).send("Hello")
        assert (result.text, result.stop_reason) == (raw[:at], "stop")
    finally:
        engine.close()


def test_an_answer_that_writes_minimax_m3s_closing_marker_goes_back_whole(tmp_path):
    """As an answer that writes "</think>" to Qwen3.5's: given no reasoning_content, MiniMax M3's
    template takes the answer up to "</mm:think>" for reasoning, and writes only the rest."""
    import thinking_templates

    engine = load(tm.write_model(tmp_path / "m3.gguf", seed=0, chat_template=thinking_templates.MINIMAX_M3))
    try:
        session = ChatSession(engine, make_config(max_tokens=6, temperature=0.0, drafter="none"))
        answer = "Write </mm:think> after the reasoning, then answer."
        saved = tmp_path / "tag.json"
        saved.write_text(json.dumps({"turns": [{"user": "How does a think block end?", "reply": answer}]}))
        session.restore(read_transcript(saved))
        assert f"]~b]ai\n</mm:think>{answer}[e~[" in session.prepare("Thanks").text
    finally:
        engine.close()

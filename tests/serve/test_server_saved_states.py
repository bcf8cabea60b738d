"""Other conversations' KV caches kept in memory (engine/saved_states.py, serve --cache-ram): a
conversation cut back by another request's prompt is restored for its next turn instead of being
prefilled again, target and draft, and the reply is the one a fresh server gives; the budget and
least-recently-used order; recurrent models are not saved; a client is told no reuse it could not
know of."""

import pytest
from serving import CTX, Server

import specllm
from specllm.engine.saved_states import SavedStates
from specllm.llama.model import Model
from specllm.llama.options import ModelOptions

GREEDY = dict(temperature=0, max_tokens=8, extra_body={"drafter": "model"})
SYSTEM = "You answer questions about the code base. " * 40  # about 400 tokens of the tiny vocabulary


def conversation(first: str) -> list[dict]:
    return [{"role": "system", "content": SYSTEM}, {"role": "user", "content": first}]


def other_request() -> list[dict]:
    return [{"role": "system", "content": "Write a title."}, {"role": "user", "content": "the chat so far"}]


def next_turn(srv, evaluated) -> tuple[list[dict], object, int, int]:
    """A conversation's first turn, another client's request, then the conversation's second turn:
    (its messages, the second reply, the target's and the draft's tokens evaluated for it)."""
    client = srv.client()
    first = client.chat.completions.create(model="x", messages=conversation("hi"), **GREEDY)
    client.chat.completions.create(model="x", messages=other_request(), **GREEDY)
    second = [*conversation("hi"), {"role": "assistant", "content": first.choices[0].message.content}]
    second.append({"role": "user", "content": "and then?"})
    before = evaluated()
    reply = client.chat.completions.create(model="x", messages=second, **GREEDY)
    after = evaluated()
    return second, reply, after[0] - before[0], after[1] - before[1]


@pytest.fixture
def engine(tiny_models):
    engine = specllm.load(str(tiny_models.target), str(tiny_models.draft), n_ctx=CTX, n_threads=1)
    yield engine
    engine.close()


def counts(engine):
    def evaluated() -> tuple[int, int]:
        draft = engine.draft.n_evaluated if engine.draft is not None else 0
        return engine.target.n_evaluated, draft

    return evaluated


@pytest.mark.parametrize("cache_ram", [0, 2**30])
def test_a_conversation_cut_back_by_another_request_goes_on_from_its_saved_state(engine, tiny_models, cache_ram):
    srv = Server(engine, cache_ram=cache_ram)
    try:
        second, reply, target_evaluated, draft_evaluated = next_turn(srv, counts(engine))
        told = reply.usage.prompt_tokens_details.cached_tokens
    finally:
        srv.stop()
    fresh_engine = specllm.load(str(tiny_models.target), str(tiny_models.draft), n_ctx=CTX, n_threads=1)
    fresh = Server(fresh_engine, cache_ram=0)
    try:
        alone = fresh.client().chat.completions.create(model="x", messages=second, **GREEDY)
    finally:
        fresh.stop()
        fresh_engine.close()
    assert reply.choices[0].message.content == alone.choices[0].message.content
    assert told == 0  # another request came between: no reuse is told (test_server.py's secret test)
    prompt = reply.usage.prompt_tokens
    if cache_ram:  # the system prompt and the first turn come back from memory, the draft's too
        assert target_evaluated < prompt // 4 + GREEDY["max_tokens"] and draft_evaluated < prompt // 4, (
            target_evaluated,
            draft_evaluated,
            prompt,
        )
    else:
        assert target_evaluated >= prompt - 1 and draft_evaluated >= prompt // 2


def test_the_budget_keeps_the_latest_states_that_fit(tiny_models):
    model = Model(str(tiny_models.target), ModelOptions(n_ctx=CTX, n_threads=1))
    try:
        texts = [f"conversation {i}: " + "word " * 200 for i in range(4)]
        model.sync(model.tokenize(texts[0]))
        one = model.saved_state()
        assert one is not None
        states = SavedStates(budget=2 * one.size + one.size // 2)  # room for two

        def go_to(text: str) -> int:
            restored = states.switch(model.tokenize(text), model, [])
            model.sync(model.tokenize(text))
            return restored

        assert [go_to(texts[i]) for i in (1, 2, 3)] == [0, 0, 0]  # 0, 1 and 2 saved in turn: 0 evicted
        assert len(states) == 2 and states.size <= states.budget
        assert go_to(texts[0]) == 0  # prefilled again; 3 saved, 1 evicted: 2 and 3 kept
        assert go_to(texts[2] + " more") == len(model.tokenize(texts[2]))  # restored; 0 saved
        assert go_to(texts[1]) == 0  # prefilled again (evicted above); 2 saved, 3 evicted: 0 and 2 kept
        assert go_to(texts[0]) == len(model.tokenize(texts[0]))  # restored; 1 saved: 2 and 1 kept
        assert go_to(texts[3]) == 0  # evicted
        small = SavedStates(budget=one.size - 1)
        small.switch([], model, [])
        assert len(small) == 0  # a state larger than the budget is not kept
    finally:
        model.close()


def test_a_restored_state_gives_the_logits_of_a_fresh_evaluation(tiny_models):
    model = Model(str(tiny_models.target), ModelOptions(n_ctx=CTX, n_threads=1))
    try:
        tokens = model.tokenize("def total(values):\n" * 30)
        model.sync(tokens[:-1])
        state = model.saved_state()
        assert state is not None and model.saved_state(limit=state.size) is not None
        assert model.saved_state(limit=state.size - 1) is None  # not copied past its limit
        expected = model.eval(tokens[-1:]).copy()  # in a call of its own, as after the restore
        model.sync(model.tokenize("something else"))
        assert state is not None and model.restore(state)
        assert model.tokens == tokens[:-1]
        assert (model.eval(tokens[-1:]) == expected).all()
    finally:
        model.close()


def test_a_recurrent_model_is_not_saved(tiny_recurrent_models):
    model = Model(str(tiny_recurrent_models.qwen35), ModelOptions(n_ctx=CTX, n_threads=1))
    try:
        model.sync(model.tokenize("word " * 100))
        assert model.saved_state() is None
        states = SavedStates(budget=2**30)
        assert states.switch(model.tokenize("other"), model, []) == 0 and len(states) == 0
    finally:
        model.close()

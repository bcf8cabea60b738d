"""Structured output beside tools (GenerationConfig.call_opening): the answer is the grammar's
text or a tool call, the call's opening and then anything. Greedy output is the argmax over the
tokens that combined language allows (each row masked by asking it about every token), with
every drafter; once the opening is written nothing is masked.

The tiny models write noise: with "[TOOL_CALLS]" as the opening, some prompts' greedy replies
begin a call and others answer JSON, so both branches are taken. The thinking model is the one of
test_structured_thinking.py: free reasoning, [/THINK], then the answer or a call."""

import json

import numpy as np
import pytest
import tiny_models as tm
import tool_templates
from grammar_reference import brute_force_mask, greedy_by_brute_force

import specllm
from specllm.engine.constrained import Phase, where_it_applies
from specllm.engine.loop import GenerationConfig
from specllm.errors import CallLikeAnswer, SpecllmError
from specllm.llama.grammar import schema_grammar
from specllm.llama.model import Model
from specllm.llama.options import ModelOptions
from specllm.serve.tool_calls import ToolCall, parse_tool_calls

OPTIONS = ModelOptions(n_ctx=512, n_threads=1)
SCHEMA = {
    "type": "object",
    "properties": {"ok": {"type": "boolean"}, "tag": {"enum": ["red", "green"]}},
    "required": ["ok", "tag"],
}
OPENING = "[TOOL_CALLS]"
# (the last answers JSON: the others' greedy replies begin a call, some after whitespace)
PROMPTS = [
    "Hello world",
    "def f(x): return",
    "the cat is in the house and the cat is in the",
    "hello class value weather",
]
THINK_TEMPLATE = (
    "{% for m in messages %}[INST]{{ m['content'] }}[/INST]{% endfor %}{% if add_generation_prompt %}[THINK]{% endif %}"
)
QUESTIONS = ["Hello", "What is the weather", "import os"]
MAX_TOKENS = 60


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    d = tmp_path_factory.mktemp("calls")
    target = tm.write_model(d / "target.gguf", seed=0)
    draft = tm.write_model(d / "draft.gguf", seed=0, noise=tm.DRAFT_NOISE)
    engine = specllm.load(str(target), str(draft), n_ctx=512, n_threads=1)
    yield target, engine
    engine.close()


@pytest.fixture(scope="module")
def thinker(tmp_path_factory):
    """Magistral's markers as control tokens, written often: the reasoning closes with [/THINK]."""
    d = tmp_path_factory.mktemp("thinking-calls")
    both = dict(chat_template=THINK_TEMPLATE, vocab="markup", extra_scale=1.5, seed=2)
    target = tm.write_model(d / "thinker.gguf", **both)
    draft = tm.write_model(d / "thinker-draft.gguf", noise=tm.DRAFT_NOISE, **both)
    engine = specllm.load(str(target), str(draft), n_ctx=512, n_threads=1)
    yield target, engine
    engine.close()


@pytest.fixture(scope="module")
def qwen35_model(tmp_path_factory):
    path = tm.write_model(tmp_path_factory.mktemp("qwen35") / "qwen35.gguf", chat_template=tool_templates.QWEN35)
    model = Model(path, OPTIONS)
    yield model
    model.close()


def reference(path, ids: list[int], opening: str, in_reasoning: tuple[str, ...] = (), names=()) -> list[int]:
    """Target-only greedy under the combined language, by brute force, on a model of its own."""
    model = Model(path, OPTIONS)
    prompt_end = model.detokenize(ids[-64:]).decode("utf-8", errors="replace")
    grammar = where_it_applies(model, schema_grammar(SCHEMA), prompt_end, opening, in_reasoning, names)
    out = greedy_by_brute_force(model, ids, grammar, MAX_TOKENS)
    grammar.close()
    model.close()
    return out


def greedy(engine, ids, drafter="none", gamma=None, opening=OPENING, in_reasoning=(), names=()):
    return engine.generate(
        ids,
        max_tokens=MAX_TOKENS,
        temperature=0,
        drafter=drafter,
        gamma=gamma,
        json_schema=SCHEMA,
        call_opening=opening,
        calls_in_reasoning=in_reasoning,
        call_names=names,
    )


def branch(answer: str) -> str:
    """ "call" or "answer" (checked to follow the schema)."""
    answer = answer.lstrip()
    if answer.startswith(OPENING):
        return "call"
    value = json.loads(answer)
    assert set(value) == {"ok", "tag"} and isinstance(value["ok"], bool) and value["tag"] in ("red", "green")
    return "answer"


def check_every_drafter(
    path, engine, prompts: list[list[int]], opening=OPENING, in_reasoning=(), names=()
) -> list[str]:
    """Greedy output equal to the reference with every drafter; the branch each prompt took."""
    taken = []
    for ids in prompts:
        expected = greedy(engine, ids, opening=opening, in_reasoning=in_reasoning, names=names)
        assert expected.tokens == reference(path, ids, opening, in_reasoning, names)
        for drafter in ("model", "ngram", "auto"):
            for gamma in (1, 3):
                again = greedy(engine, ids, drafter, gamma, opening, in_reasoning, names)
                assert again.tokens == expected.tokens, (drafter, gamma)
        taken.append(expected.text)
    return taken


def test_greedy_answer_or_call_is_the_reference_with_every_drafter(pair):
    path, engine = pair
    texts = check_every_drafter(path, engine, [engine.prompt_tokens(p) for p in PROMPTS])
    assert sorted({branch(text) for text in texts}) == ["answer", "call"]


def test_a_thinking_models_answer_or_call_comes_after_its_reasoning(thinker):
    path, engine = thinker
    prompts = [engine.target.tokenize(engine.target.render_chat([{"role": "user", "content": q}])) for q in QUESTIONS]
    texts = check_every_drafter(path, engine, prompts)
    answers = [text.partition("[/THINK]") for text in texts]
    assert all(closing and reasoning.strip() for reasoning, closing, _ in answers)
    assert sorted({branch(answer) for _, _, answer in answers}) == ["answer", "call"]


def test_a_call_begun_inside_the_reasoning_ends_it(thinker):
    """Where the model may call before it closes its think block (calls_in_reasoning, as Qwen3.5's
    reply reader reads "<tool_call>"), the opening written inside the reasoning makes the rest a
    free call, as after the block: the closing marker written after it no longer brings the
    schema. Here the opening is "[ARGS]", which this model's reasoning writes often; of the
    prompts, one answers JSON, one calls after its block, two call inside it."""
    path, engine = thinker
    asked = ["print", "Hello", "Paris", "What time is it"]
    prompts = [engine.target.tokenize(engine.target.render_chat([{"role": "user", "content": q}])) for q in asked]
    texts = check_every_drafter(path, engine, prompts, "[ARGS]", ("[ARGS]",))
    within = [text.partition("[ARGS]")[0] for text in texts]
    assert ["[/THINK]" in before for before in within] == [True, True, False, False]
    branch_taken = [text.partition("[/THINK]")[2].lstrip()[:6] for text in texts[:2]]
    assert branch_taken[0].startswith("{") and branch_taken[1] == "[ARGS]"
    assert all(text.count("[/THINK]") and text.index("[/THINK]") > text.index("[ARGS]") for text in texts[2:])
    # Without them, the same reasoning is held to the schema after its closing marker
    held = greedy(engine, prompts[2], opening="[ARGS]")
    assert (
        held.text.partition("[/THINK]")[2].lstrip().startswith("{")
        and held.tokens != greedy(engine, prompts[2], opening="[ARGS]", in_reasoning=("[ARGS]",)).tokens
    )


@pytest.mark.parametrize("in_reasoning", [("<tool_call>",), ("<x>", "<tool_call>")])
def test_a_call_in_the_reasoning_token_by_token(qwen35_model, in_reasoning):
    """Qwen3.5's prompt opens "<think>\\n": inside the reasoning, no end of generation until
    "<tool_call>" is whole; from then on nothing is masked, "</think>" and the end included, and
    a clone made before keeps reasoning."""
    model = qwen35_model
    byte = {model.piece(t): t for t in range(model.n_vocab) if len(model.piece(t)) == 1}
    grammar = where_it_applies(model, schema_grammar(SCHEMA), "<think>\n", "<tool_call>", in_reasoning)
    everything = np.arange(model.n_vocab)
    for c in b"I will check. <tool_call":
        assert grammar.phase is Phase.REASONING and not grammar.allowed(np.array([tm.EOS_ID]))[0]
        grammar.accept(byte[bytes([c])])
    reasoning = grammar.clone()
    grammar.accept(byte[b">"])
    assert grammar.phase is Phase.CALL and grammar.allowed(everything).all()
    for c in b"\n<function=get_weather>\n</think>\n\n":
        grammar.accept(byte[bytes([c])])
    assert grammar.phase is Phase.CALL and grammar.allowed(everything).all()
    assert reasoning.phase is Phase.REASONING and not reasoning.allowed(np.array([tm.EOS_ID]))[0]
    for state in (grammar, reasoning):
        state.close()
    # Without calls in reasoning, "<tool_call>" is reasoning text: the end is refused still
    grammar = where_it_applies(model, schema_grammar(SCHEMA), "<think>\n", "<tool_call>")
    for c in b"I will check. <tool_call>":
        grammar.accept(byte[bytes([c])])
    assert grammar.phase is Phase.REASONING and not grammar.allowed(np.array([tm.EOS_ID]))[0]
    grammar.close()


def test_once_the_opening_is_written_nothing_is_masked(pair):
    """An opening the model writes anyway: the reply is the one it writes with no grammar at all."""
    _, engine = pair
    ids = engine.prompt_tokens(PROMPTS[2])
    free = engine.generate(ids, max_tokens=MAX_TOKENS, temperature=0, drafter="none")
    opening = free.text[0]
    assert not free.text.startswith("{") and opening.strip()
    for drafter in ("none", "model", "ngram"):
        assert greedy(engine, ids, drafter, 3, opening=opening).tokens == free.tokens


@pytest.mark.parametrize(("prompt_end", "before"), [("", b"<tool_call"), ("<think>\n", b"so</think>\n <tool_call")])
def test_the_grammar_token_by_token(pair, prompt_end, before):
    """Bytes of "<tool_call>" (after the reasoning and whitespace where the prompt opened a think
    block) take the answer into a call: free from then on, its end allowed, a clone made before
    keeping its own state; a "{" makes it an answer, which the opening then no longer frees."""
    path, _ = pair
    model = Model(path, OPTIONS)
    byte = {model.piece(t): t for t in range(model.n_vocab) if len(model.piece(t)) == 1}
    grammar = where_it_applies(model, schema_grammar(SCHEMA), prompt_end, "<tool_call>")
    everything = np.arange(model.n_vocab)
    for c in before:
        grammar.accept(byte[bytes([c])])
    assert grammar.phase is Phase.ANSWER and not grammar.allowed(np.array([tm.EOS_ID, byte[b"{"]])).any()
    answer = grammar.clone()
    grammar.accept(byte[b">"])
    assert grammar.phase is Phase.CALL and grammar.free and grammar.allowed(everything).all()
    assert answer.phase is Phase.ANSWER and answer.allowed(everything).sum() < model.n_vocab
    grammar.close()
    grammar = where_it_applies(model, schema_grammar(SCHEMA), prompt_end, "<tool_call>")
    for c in before[: before.rindex(b"<")] + b"{":
        grammar.accept(byte[bytes([c])])
    assert grammar.call is None and not grammar.allowed(np.array([byte[b"<"]]))[0]
    for state in (grammar, answer):
        state.close()
    model.close()


def test_a_call_may_begin_with_whitespace(pair):
    """Templates whose calls begin on a new line (Bielik's "\n<tool_call>", DeepSeek V4's,
    MiniMax M2's, Reka's " <tool_call>"): the whitespace a model writes before the opening is the
    call's, as llama.cpp's triggers read it; the schema's answer still begins with no whitespace."""
    path, _ = pair
    model = Model(path, OPTIONS)
    byte = {model.piece(t): t for t in range(model.n_vocab) if len(model.piece(t)) == 1}
    grammar = where_it_applies(model, schema_grammar(SCHEMA), "", "<tool_call>")
    for c in b"\n <tool_call":
        assert grammar.allowed(np.array([byte[bytes([c])]]))[0], bytes([c])
        grammar.accept(byte[bytes([c])])
    assert grammar.phase is Phase.ANSWER and not grammar.allowed(np.array([byte[b"{"]]))[0]
    grammar.accept(byte[b">"])
    assert grammar.phase is Phase.CALL and grammar.free
    grammar.close()
    model.close()


def test_a_token_may_run_past_the_opening(pair):
    """A token that completes the opening and goes on ("return" after "re") is the call's."""
    path, _ = pair
    model = Model(path, OPTIONS)
    token = next(t for t in range(model.n_vocab) if model.piece(t) == b"return")
    grammar = where_it_applies(model, schema_grammar(SCHEMA), "", "re")
    assert grammar.allowed(np.array([token]))[0]
    grammar.accept(token)
    assert grammar.phase is Phase.CALL
    grammar.close()
    model.close()


def fed(grammar, text: bytes, byte: dict[bytes, int]) -> bool:
    """Advance the grammar over `text`'s bytes while it allows them: whether it took them all."""
    for c in text:
        if not grammar.allowed(np.array([byte[bytes([c])]]))[0]:
            return False
        grammar.accept(byte[bytes([c])])
    return True


FENCED = '```json\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n```'


def test_a_fenced_call_naming_a_tool_is_a_call(pair):
    """Beside the tools' names a call may also begin as the reply reader reads a fenced one: "```"
    or "```json", JSON whitespace, and an object whose "name" is an offered tool's. Every byte of
    one is allowed (the mask each time the one asked token by token), and from its name's closing
    quote nothing is masked; a clone made before stays the answer's or a call's."""
    path, _ = pair
    model = Model(path, OPTIONS)
    byte = {model.piece(t): t for t in range(model.n_vocab) if len(model.piece(t)) == 1}
    everything = np.arange(model.n_vocab)
    grammar = where_it_applies(model, schema_grammar(SCHEMA), "", "<tool_call>", call_names=("get_weather", "f"))
    opening = FENCED[: FENCED.index("get_weather") + len("get_weather")]
    for c in opening.encode():
        assert grammar.phase is Phase.ANSWER
        assert (grammar.allowed(everything) == brute_force_mask(grammar, model.n_vocab)).all()
        assert grammar.allowed(np.array([byte[bytes([c])]]))[0], bytes([c])
        grammar.accept(byte[bytes([c])])
    before = grammar.clone()
    grammar.accept(byte[b'"'])
    assert grammar.phase is Phase.CALL and grammar.allowed(everything).all()
    assert before.phase is Phase.ANSWER and not before.allowed(np.array([byte[b"x"], tm.EOS_ID])).any()
    for state in (grammar, before):
        state.close()
    allowed = ['```{ "name" :"f"', ' ```\n\t{\n"name":\n "get_weather"']
    refused = ["```python", '```json\n{"name": "get_time', '```json {"arguments"', "```json\n\n\n[", "`{"]
    for text, phase in [(t, Phase.CALL) for t in allowed] + [(t, Phase.ANSWER) for t in refused]:
        grammar = where_it_applies(model, schema_grammar(SCHEMA), "", "<tool_call>", call_names=("get_weather", "f"))
        taken = fed(grammar, text.encode(), byte)
        assert taken == (phase is Phase.CALL) and grammar.phase is phase, text
        grammar.close()
    model.close()


def test_a_fenced_calls_name_is_written_as_json_writes_it(pair):
    """A tool's name in a fenced call is its one JSON spelling (json.dumps, non-ASCII as itself),
    as llama.cpp's grammars write a tool's name: written with a \\u escape (which the reply reader
    would read as the name) it is refused at the backslash, and the answer stays the structure's."""
    path, _ = pair
    model = Model(path, OPTIONS)
    byte = {model.piece(t): t for t in range(model.n_vocab) if len(model.piece(t)) == 1}
    for text, names, escaped in [
        ('```json\n{"name": "get\\u005fweather"', ("get_weather",), True),
        ('```{"name": "caf\\u00e9"', ("café",), True),
        ('```{"name": "café"', ("café",), False),
    ]:
        grammar = where_it_applies(model, schema_grammar(SCHEMA), "", "<tool_call>", call_names=names)
        written = text.encode()
        before = written[: written.index(b"\\")] if escaped else written
        assert fed(grammar, before, byte) and fed(grammar, written[len(before) :], byte) is not escaped, text
        assert grammar.phase is (Phase.ANSWER if escaped else Phase.CALL), text
        grammar.close()
    model.close()
    escaped_call = '```json\n{"name": "get\\u005fweather", "arguments": {}}\n```'
    assert parse_tool_calls(escaped_call, ["get_weather"]).calls == [ToolCall("get_weather", "{}")]


def test_no_fenced_call_without_names_or_where_the_structure_takes_a_fence(pair):
    """Without the tools' names a fence is the structure's to refuse; a grammar whose answer may
    begin with one keeps its answers (the fence is no call's)."""
    path, _ = pair
    model = Model(path, OPTIONS)
    byte = {model.piece(t): t for t in range(model.n_vocab) if len(model.piece(t)) == 1}
    grammar = where_it_applies(model, schema_grammar(SCHEMA), "", "<tool_call>")
    assert not grammar.allowed(np.array([byte[b"`"]]))[0]
    grammar.close()
    fences = 'root ::= "```" [a-z]* "\n" [a-z ]+'
    grammar = where_it_applies(model, fences, "", "<tool_call>", call_names=("get_weather",))
    assert fed(grammar, b"```json\n", byte) and not fed(grammar, b"{", byte)
    grammar.close()
    model.close()


def test_a_fenced_call_written_whole_may_end_and_is_read_as_tool_calls(pair):
    """A fenced call written whole under the schema beside the tool (as GenerationConfig's
    call_names ask): every token allowed, then the end of generation, and the reply reader reads
    it as the call."""
    path, engine = pair
    model = engine.target
    grammar = where_it_applies(model, schema_grammar(SCHEMA), "", "<tool_call>", call_names=("get_weather",))
    for token in model.tokenize(FENCED, add_special=False):
        assert grammar.allowed(np.array([token]))[0]
        grammar.accept(token)
    assert grammar.allowed(np.array([tm.EOS_ID]))[0]
    grammar.close()
    parsed = parse_tool_calls(FENCED, ["get_weather"])
    assert parsed.content is None and parsed.calls == [ToolCall("get_weather", '{"city": "Paris"}')]


def test_greedy_beside_call_names_is_the_reference_with_every_drafter(pair):
    """The combined language with the fenced form too: greedy equal to brute force, every drafter.
    Two of the prompts whose replies began "[TOOL_CALLS]" now begin a fenced call (of noise, one
    free after its name, the other still in its whitespace), the third still answers JSON."""
    path, engine = pair
    prompts = [engine.prompt_tokens(p) for p in PROMPTS[1:]]
    texts = check_every_drafter(path, engine, prompts, names=("get_weather", "print"))
    assert [text.lstrip()[:3] for text in texts] == ["```", "```", '{"o']
    assert '"get_weather"' in texts[0]  # the call's name written, and free after it


def test_a_call_opening_an_answer_may_begin_with_is_refused(pair):
    _, engine = pair
    schema = {"type": "object", "properties": {"name": {"type": "string"}}}
    with pytest.raises(CallLikeAnswer, match='a tool call begins with \'{"name": "\', which the grammar also takes'):
        engine.generate("Hello", max_tokens=4, json_schema=schema, call_opening='{"name": "')
    for bad, message in [
        ({"json_schema": SCHEMA, "call_opening": " "}, "the text a tool call begins with"),
        ({"call_opening": "<tool_call>"}, "beside a grammar or a JSON schema"),
        ({"json_schema": SCHEMA, "calls_in_reasoning": ("<tool_call>",)}, "beside a call opening, not alone"),
        ({"json_schema": SCHEMA, "call_opening": "<tool_call>", "calls_in_reasoning": [""]}, "texts a tool call"),
        ({"json_schema": SCHEMA, "call_names": ("get_weather",)}, "beside a call opening, not alone"),
        ({"json_schema": SCHEMA, "call_opening": "<tool_call>", "call_names": [""]}, "the offered tools' names"),
    ]:
        with pytest.raises(SpecllmError, match=message):
            GenerationConfig(**bad)

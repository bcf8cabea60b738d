"""Grammar.allowed narrows a large set of ids by their first bytes (grammar._Prefixes: a token is
refused where the token spelling its first bytes is) before it asks llama.cpp about the rest. The
answer must be llama.cpp's own for every token in every state: checked against the ids asked one at
a time (or all at once, unnarrowed), with the narrowing turned on for the tiny vocabularies (it
starts at thousands of ids)."""

import json

import numpy as np
import pytest
import tiny_models as tm
from grammar_reference import brute_force_mask, greedy_by_brute_force

from specllm.engine.loop import Engine
from specllm.llama import grammar as grammars
from specllm.llama.grammar import Grammar, schema_grammar
from specllm.llama.model import Model
from specllm.llama.options import ModelOptions

OPTIONS = ModelOptions(n_ctx=256, n_threads=1)
SCHEMA = {
    "type": "object",
    "properties": {"name": {"type": "string", "maxLength": 8}, "n": {"type": "integer"}, "ok": {"type": "boolean"}},
    "required": ["name", "n", "ok"],
}
# Each grammar with texts it takes, fed one token at a time: the states checked are those after
# every token (byte tokens too, so states inside a character's bytes)
GRAMMARS = [
    (schema_grammar(SCHEMA), ['{"name": "the dog", "n": -12, "ok": true}', '{ "name":"é中","n":0,"ok":false}']),
    ('root ::= "def" [ ]+ [a-z_]+ "(" [a-z, ]* "):"', ["def  import_os(self, x):"]),
    ('root ::= ([\\u00e0-\\u00ff] | "中文" | "x")+ "."', ["àé中文x."]),
    ('root ::= "<|im_end|>" | "<|" [a-z]+', ["<|im_end|>", "<|abc"]),  # markup spelled as text
    ('root ::= [^"\\\\\\x00-\\x1f]* "!"', ["a b c€!"]),
    ('root ::= "a" | "ab" | "abc"', ["abc"]),  # ends: the end of generation comes and goes
]


@pytest.fixture(autouse=True)
def narrowed(monkeypatch):
    monkeypatch.setattr(grammars, "_NARROWED_FROM", 2)


@pytest.fixture(scope="module", params=["standard", "code", "harmony"])
def model(request, tmp_path_factory):
    path = tm.write_model(tmp_path_factory.mktemp("narrowing") / "m.gguf", seed=0, vocab=request.param)
    loaded = Model(path, OPTIONS)
    yield loaded
    loaded.close()


def longest_first(model: Model, text: str) -> list[int]:
    """`text` as tokens, each the longest piece of the vocabulary that it goes on with (a byte token
    where none does): multi-byte tokens whatever the tokenizer would add."""
    spelling = {model.piece(t): t for t in range(model.n_vocab) if model.piece(t) and not model.is_eog(t)}
    data, tokens = text.encode(), []
    while data:
        size = max(n for n in range(1, len(data) + 1) if n == 1 or data[:n] in spelling)
        tokens.append(spelling.get(data[:size], tm.byte_token_id(data[0])))
        data = data[size:]
    return tokens


def states(model: Model, grammar: Grammar, text: str):
    """The grammar before and after each token of `text`, in long tokens and byte by byte (each a
    clone)."""
    for tokens in (longest_first(model, text), [tm.byte_token_id(b) for b in text.encode()]):
        state = grammar.clone()
        for token in tokens:
            yield state.clone()
            state.accept(token)
        yield state


@pytest.mark.parametrize(("gbnf", "texts"), GRAMMARS)
def test_narrowed_answer_is_llama_cpps_own_in_every_state(model, gbnf, texts):
    everything = np.arange(model.n_vocab)
    grammar = Grammar(model, gbnf)
    assert grammar.by_text
    checked = 0
    for text in texts:
        for state in states(model, grammar, text):
            expected = state._allowed(everything)  # llama.cpp asked about every token
            assert (state.allowed(everything) == expected).all(), (
                text,
                np.flatnonzero(state.allowed(everything) != expected),
            )
            # the heads sampling.masked asks about, and the ids after them
            for part in (everything[::-1][:300], everything[7::3]):
                assert (state.allowed(part) == expected[part]).all()
            checked += 1
    assert checked >= sum(len(text.encode()) + 1 for text in texts)


def test_narrowing_rules_out_most_tokens_where_few_are_allowed(model):
    """Guards against a narrowing that rules out nothing (the equality above would still hold)."""
    prefixes = grammars._prefixes(model)
    grammar = Grammar(model, schema_grammar(SCHEMA))  # a JSON object's first token: "{" and few more
    possible = grammar._possible_probes(prefixes)
    probed = prefixes.deepest[: model.n_vocab] < model.n_vocab  # tokens of more than one byte
    kept = possible[prefixes.deepest[: model.n_vocab]]
    assert probed.sum() > 100
    assert kept[probed].sum() < probed.sum() / 10
    assert grammar.allowed(np.arange(model.n_vocab)).sum() >= 1


def test_a_grammar_naming_tokens_is_not_narrowed(model):
    """<[id]> is allowed by id, whatever its text: token 5's text begins with a byte the grammar
    refuses as text, and it is still allowed."""
    named = model.tokenize("the", add_special=False)[0]
    grammar = Grammar(model, f'root ::= <[{named}]> "x" | "y"')
    assert not grammar.by_text and not grammar.clone().by_text
    allowed = grammar.allowed(np.arange(model.n_vocab))
    assert allowed[named]
    assert (allowed == brute_force_mask(grammar, model.n_vocab)).all()


def test_greedy_under_a_schema_with_narrowing_is_the_brute_force_greedy(tmp_path):
    """End to end: the engine's masks (sampling.masked asks about every token where few are
    allowed) with narrowing give the brute-force greedy tokens, with and without a draft model."""
    target = tm.write_model(tmp_path / "t.gguf", seed=3)
    draft = tm.write_model(tmp_path / "d.gguf", seed=3, noise=tm.DRAFT_NOISE, noise_seed=1)
    engine = Engine(Model(target, OPTIONS), Model(draft, OPTIONS))
    reference = Model(target, OPTIONS)
    try:
        for prompt in ("Hello world", "def f(x): return"):
            ids = engine.prompt_tokens(prompt)
            expected = greedy_by_brute_force(reference, ids, Grammar(reference, schema_grammar(SCHEMA)), 40)
            for drafter in ("none", "model", "ngram"):
                result = engine.generate(ids, max_tokens=40, temperature=0, drafter=drafter, json_schema=SCHEMA)
                assert result.tokens == expected, (prompt, drafter)
            sampled = engine.generate(ids, max_tokens=200, temperature=1.0, top_k=0, seed=1, json_schema=SCHEMA)
            assert sampled.stop_reason == "eos"  # every token came from a row whose mask was narrowed
            assert json.loads(sampled.text).keys() == SCHEMA["properties"].keys()
    finally:
        engine.close()
        reference.close()

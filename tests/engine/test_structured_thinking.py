"""Structured output with thinking models: where the prompt opened a think block, the reasoning is
free (but for an end of generation) and the grammar applies after the block's closing marker;
where the model opens one itself, an optional block comes first; with the block closed in the
prompt, the grammar applies from the first token. Exact under speculation, as without reasoning.

The model whose reasoning closes: a tiny one with Magistral's [THINK] and [/THINK] as control
tokens it writes often (vocab "markup"), its prompt opening the block. Qwen3.5's template on the
standard vocabulary opens "<think>\\n", whose closing marker the tiny models' noise never writes:
its grammar is checked token by token on a fixed text."""

import itertools
import json
import time

import numpy as np
import pytest
import tiny_models as tm
import tool_templates
from grammar_reference import brute_force_mask, greedy_by_brute_force

import specllm
from specllm.engine.constrained import OutputGrammar, Phase, where_it_applies
from specllm.engine.reasoning import split_reasoning
from specllm.engine.sampling import SamplerSettings, distribution
from specllm.llama.grammar import Grammar, schema_grammar
from specllm.llama.model import Model
from specllm.llama.options import ModelOptions

OPTIONS = ModelOptions(n_ctx=512, n_threads=1)
SCHEMA = {
    "type": "object",
    "properties": {"ok": {"type": "boolean"}, "tag": {"enum": ["red", "green"]}},
    "required": ["ok", "tag"],
}
ASK = [{"role": "user", "content": "Hello"}]
# Magistral's way: the generation prompt opens the think block with [THINK], a control token
THINK_CONTROL_TEMPLATE = (
    "{% for m in messages %}[INST]{{ m['content'] }}[/INST]{% endfor %}{% if add_generation_prompt %}[THINK]{% endif %}"
)
QUESTIONS = ["Hello", "What is the weather", "def f(x): return"]
MARKUP = dict(vocab="markup", extra_scale=1.5, seed=2)  # a seed whose reasoning closes within 40 tokens


@pytest.fixture(scope="module")
def thinker(tmp_path_factory):
    """A target that writes [/THINK] and then JSON, with a draft model that agrees with it ~80%."""
    d = tmp_path_factory.mktemp("thinking")
    both = dict(chat_template=THINK_CONTROL_TEMPLATE, **MARKUP)
    target = tm.write_model(d / "thinker.gguf", **both)
    draft = tm.write_model(d / "thinker-draft.gguf", noise=tm.DRAFT_NOISE, **both)
    engine = specllm.load(str(target), str(draft), n_ctx=512, n_threads=1)
    yield engine
    engine.close()


@pytest.fixture(scope="module")
def qwen35(tmp_path_factory):
    path = tm.write_model(tmp_path_factory.mktemp("qwen35") / "qwen35.gguf", chat_template=tool_templates.QWEN35)
    model = Model(path, OPTIONS)
    yield model
    model.close()


def greedy(engine, prompt, drafter="none", gamma=None, **kwargs):
    kwargs = dict(max_tokens=80, temperature=0, drafter=drafter, gamma=gamma, json_schema=SCHEMA) | kwargs
    return engine.generate(prompt, **kwargs)


def check_answer(text: str, closing: str) -> None:
    """The reply reasons, closes its block, and answers JSON of SCHEMA."""
    split = split_reasoning(text, closing)
    assert split.reasoning and closing in text
    value = json.loads(split.answer)
    assert set(value) == {"ok", "tag"} and isinstance(value["ok"], bool) and value["tag"] in ("red", "green")


def byte_tokens(model: Model) -> dict[str, int]:
    return {model.piece(t).decode("latin-1"): t for t in range(model.n_vocab) if len(model.piece(t)) == 1}


def test_the_grammar_applies_after_the_closing_marker_the_prompt_opened(qwen35):
    """Qwen3.5's prompt ends with "<think>\\n": anything but an end may be reasoning ("{" and
    "}" too), then "</think>", whitespace, and nothing but the schema's JSON, then the end; each
    character read by a clone of the state before it."""
    prompt = qwen35.render_chat(ASK)
    assert prompt.endswith("<think>\n")
    grammar = where_it_applies(qwen35, schema_grammar(SCHEMA), prompt)
    assert grammar.phase is Phase.REASONING
    chars, everything = byte_tokens(qwen35), np.arange(qwen35.n_vocab)
    eog = [t for t in range(qwen35.n_vocab) if qwen35.is_eog(t)]
    reasoning, answer = 'a {"x": 1} b</think>', '\n\n{"ok": true, "tag": "red"}'
    for char in reasoning:
        assert not grammar.allowed(np.array(eog)).any()  # the answer is still to come
        assert grammar.allowed(everything).sum() == qwen35.n_vocab - len(eog)
        grammar.accept(chars[char])
        grammar = grammar.clone()  # a verify row's clone goes on where its grammar was, mid-marker too
    assert grammar.phase is Phase.ANSWER
    assert not grammar.allowed(np.array([chars["a"], chars["}"]])).any()
    for char in answer:
        assert not grammar.allowed(np.array(eog)).any()
        grammar.accept(chars[char])
    allowed = set(everything[grammar.allowed(everything)].tolist())
    assert set(eog) <= allowed  # complete: the end, or the whitespace JSON may end with
    assert all(qwen35.piece(t).isspace() for t in allowed - set(eog))


def test_with_the_block_closed_in_the_prompt_the_grammar_applies_from_the_first_token(qwen35):
    prompt = qwen35.render_chat(ASK, variables={"enable_thinking": False})
    assert prompt.rstrip().endswith("</think>")
    grammar = where_it_applies(qwen35, schema_grammar(SCHEMA), prompt)
    plain = Grammar(qwen35, schema_grammar(SCHEMA))
    assert grammar.phase is Phase.ANSWER
    assert np.array_equal(brute_force_mask(grammar, qwen35.n_vocab), brute_force_mask(plain, qwen35.n_vocab))


def test_a_token_running_from_the_marker_into_the_answer_is_the_grammars_to_allow(qwen35):
    """A token whose text completes the closing marker and goes on is allowed where the grammar
    takes the rest, fed to it byte by byte (here the marker is "self", and "self." a token; or
    "aself", its "a" already written)."""
    [self_dot] = [t for t in range(qwen35.n_vocab) if qwen35.piece(t) == b"self."]
    chars = byte_tokens(qwen35)
    for (answer, allowed), marker in itertools.product((('"." [a-z]+', True), ("[a-z]+", False)), (b"self", b"aself")):
        grammar = OutputGrammar(Grammar(qwen35, f"root ::= [ ]* {answer}"), Phase.REASONING, marker)
        if marker == b"aself":
            assert grammar.allowed(np.array([self_dot]))[0]  # "self." alone does not end the block
            grammar.accept(chars["a"])
        assert grammar.allowed(np.array([self_dot]))[0] == allowed
        row = np.zeros(qwen35.n_vocab, dtype=np.float32)
        assert (grammar.masked(row, SamplerSettings(temperature=0))[self_dot] == 0) == allowed
        if allowed:
            grammar.accept(self_dot)
            assert grammar.phase is Phase.ANSWER
            assert grammar.allowed(np.array([chars["a"], chars["."]])).tolist() == [True, False]


def test_a_model_that_opens_its_own_block_may_think_first(tmp_path):
    """The markup vocabulary holds [THINK] as one token and ChatML opens no block: the reply may
    begin with [THINK] (then reason freely up to [/THINK]) or with the answer."""
    model = Model(tm.write_model(tmp_path / "own.gguf", **MARKUP), OPTIONS)
    [opening] = model.tokenize("[THINK]", add_special=False)
    [closing] = model.tokenize("[/THINK]", add_special=False)
    chars = byte_tokens(model)
    grammar = where_it_applies(model, schema_grammar(SCHEMA), model.render_chat(ASK))
    assert grammar.phase is Phase.OPTIONAL
    first = np.array([opening, chars["{"], chars["a"], chars[" "]])
    assert grammar.allowed(first).tolist() == [True, True, False, False]
    answer_first = grammar.clone()
    answer_first.accept(chars["{"])
    assert answer_first.phase is Phase.ANSWER and not answer_first.allowed(np.array([opening]))[0]
    grammar.accept(opening)
    assert grammar.phase is Phase.REASONING and grammar.allowed(np.array([chars["a"], chars["}"]])).all()
    grammar.accept(closing)
    assert grammar.phase is Phase.ANSWER
    assert grammar.allowed(np.array([chars[" "], chars["{"], chars["a"]])).tolist() == [True, True, False]
    model.close()


def test_greedy_json_after_reasoning_is_the_same_with_every_drafter(thinker):
    """The reasoning closes inside drafts and steps: each row masked by its own clone's phase.
    (The tiny model indents its JSON as llama-server's grammar lets it: 160 tokens to end it.)"""
    for question in QUESTIONS:
        prompt = thinker.target.render_chat([{"role": "user", "content": question}])
        expected = greedy(thinker, prompt, max_tokens=160)
        assert expected.stop_reason == "eos"  # the end came after the JSON
        check_answer(expected.text, "[/THINK]")
        for drafter in ("model", "ngram", "auto"):
            for gamma in (1, 3, 5):
                result = greedy(thinker, prompt, drafter, gamma, max_tokens=160)
                assert result.tokens == expected.tokens, (question, drafter, gamma)


def test_mtp_drafting_of_json_after_reasoning_on_a_hybrid(tmp_path):
    """The MTP layers' drafts cross the closing marker too (a hybrid's rejections taken back)."""
    both = dict(arch="qwen35", n_nextn=1, mtp_mimic=True, chat_template=THINK_CONTROL_TEMPLATE)
    path = tm.write_model(tmp_path / "mtp-thinker.gguf", **(MARKUP | both | {"seed": 3}))
    engine = specllm.load(str(path), n_ctx=512, n_threads=1, snapshots=16)
    accepted = 0
    for question in QUESTIONS[:2]:
        prompt = engine.target.render_chat([{"role": "user", "content": question}])
        expected = greedy(engine, prompt)
        assert expected.stop_reason == "eos"
        check_answer(expected.text, "[/THINK]")
        for gamma in (1, 3, 5):
            result = greedy(engine, prompt, "mtp", gamma)
            assert result.tokens == expected.tokens, (question, gamma)
            accepted += result.stats.n_accepted
    assert accepted > 20
    engine.close()


def test_greedy_after_reasoning_is_the_argmax_over_a_brute_force_mask(thinker):
    """Target-only greedy decoding by the definition: each row masked by trying every token."""
    target = thinker.target
    prompt = thinker.prompt_tokens(target.render_chat(ASK))
    grammar = where_it_applies(target, schema_grammar(SCHEMA), target.render_chat(ASK))
    out = greedy_by_brute_force(target, prompt, grammar, 80)
    target.truncate(0)
    for drafter in ("none", "model"):
        assert greedy(thinker, prompt, drafter, 4).tokens == out


@pytest.mark.parametrize(
    "sampler",
    [SamplerSettings(temperature=0.8, top_k=40, top_p=0.95, min_p=0.05), SamplerSettings(temperature=1.0, top_k=0)],
)
def test_a_free_row_matches_a_brute_force_mask(thinker, sampler):
    target = thinker.target
    prompt = target.render_chat(ASK)
    grammar = where_it_applies(target, schema_grammar(SCHEMA), prompt)
    row = target.sync(thinker.prompt_tokens(prompt), n_logits=1)[0]
    reference = row.copy()
    reference[~brute_force_mask(grammar, target.n_vocab)] = -np.inf
    assert np.array_equal(distribution(grammar.masked(row, sampler), sampler), distribution(reference, sampler))
    target.truncate(0)


def test_a_reply_cut_in_its_reasoning_is_just_cut(thinker):
    """max_tokens inside the reasoning: the same tokens as without the grammar (none was refused)."""
    prompt = thinker.target.render_chat([{"role": "user", "content": "def f(x): return"}])
    constrained = greedy(thinker, prompt, max_tokens=12)
    assert constrained.stop_reason == "max_tokens" and "[/THINK]" not in constrained.text
    assert constrained.tokens == greedy(thinker, prompt, max_tokens=12, json_schema=None).tokens


def test_free_reasoning_asks_the_grammar_about_no_token(thinker, monkeypatch):
    """While the reasoning is free, a row's mask is its ends of generation and the tokens that
    would complete the closing marker: llama.cpp's grammar is asked about none of the vocabulary
    (without top-k, a row under the grammar is checked whole)."""
    asked = []
    check = Grammar.allowed
    monkeypatch.setattr(Grammar, "allowed", lambda self, ids: asked.append(len(ids)) or check(self, ids))
    target, sampler = thinker.target, SamplerSettings(temperature=1.0, top_k=0)
    prompt = target.render_chat(ASK)
    grammar = where_it_applies(target, schema_grammar(SCHEMA), prompt)
    row = target.sync(thinker.prompt_tokens(prompt), n_logits=1)[0]
    grammar.masked(row, sampler)  # finds the marker's tokens once, for the model
    free = timed(lambda: grammar.masked(row, sampler))
    assert asked == []
    answer = where_it_applies(target, schema_grammar(SCHEMA), target.render_chat(ASK) + "[/THINK]")
    strict = timed(lambda: answer.masked(row, sampler))
    assert asked and asked[-1] == target.n_vocab  # the answer's row: every token checked
    assert free < strict
    target.truncate(0)


def timed(work) -> float:
    start = time.perf_counter()
    for _ in range(20):
        work()
    return (time.perf_counter() - start) / 20

"""Structured output with gpt-oss (harmony): its analysis messages are free up to their <|end|>,
each message's header is the grammar's, and the final channel's message follows the schema, as
llama-server's grammar for gpt-oss with a response format has it. Exact under speculation.

The model: a tiny one with gpt-oss's markup tokens and its whole chat template (tool_templates'),
its markup's output rows scaled up so that it ends an analysis message within a few dozen tokens."""

import json
import re

import numpy as np
import pytest
import tiny_models as tm
import tool_templates
from grammar_reference import brute_force_mask, greedy_by_brute_force

import specllm
from specllm.engine.constrained import Phase, where_it_applies
from specllm.engine.loop import PROMPT_END_TOKENS, GenerationConfig, output_grammar, prompt_end
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
QUESTIONS = ["Hello", "What is the weather", "def f(x): return"]
EXPECTED = [("eos", False), ("eos", True), ("max_tokens", True)]  # (stop reason, reasons) for each
# The markup's rows scaled up (the harmony vocabulary scales them down), and a seed whose greedy
# replies under SCHEMA to QUESTIONS answer at once, after an analysis message, and reason on in two
# analysis messages up to MAX_TOKENS
HARMONY = dict(vocab="harmony", chat_template=tool_templates.GPT_OSS, extra_scale=10.0, seed=3)
MAX_TOKENS = 120
MARKUP = re.compile(r"(<\|[a-z]+\|>)")
ANALYSIS, FINAL = "<|channel|>analysis<|message|>", "<|start|>assistant<|channel|>final<|message|>"


@pytest.fixture(scope="module")
def gpt_oss(tmp_path_factory):
    """A tiny gpt-oss target, with a draft model that agrees with it ~80%."""
    d = tmp_path_factory.mktemp("gpt-oss")
    target = tm.write_model(d / "gpt-oss.gguf", **HARMONY)
    draft = tm.write_model(d / "gpt-oss-draft.gguf", noise=tm.DRAFT_NOISE, **HARMONY)
    engine = specllm.load(str(target), str(draft), n_ctx=1024, n_threads=1)
    yield engine
    engine.close()


@pytest.fixture(scope="module")
def model(gpt_oss):
    return gpt_oss.target


def greedy(engine, prompt, drafter="none", gamma=None, **kwargs):
    kwargs = dict(max_tokens=MAX_TOKENS, temperature=0, drafter=drafter, gamma=gamma, json_schema=SCHEMA) | kwargs
    return engine.generate(prompt, **kwargs)


def tokens_of(model: Model, text: str) -> list[int]:
    """`text` as tokens: each markup its own, the rest a byte token a byte (the tiny vocabulary's
    words after markup would begin with a space)."""
    chars = {model.piece(t): t for t in range(model.n_vocab) if len(model.piece(t)) == 1}
    tokens = []
    for part in MARKUP.split(text):
        if MARKUP.fullmatch(part):
            tokens += model.tokenize(part, add_special=False)
        else:
            tokens += [chars[bytes([b])] for b in part.encode()]
    return tokens


def eog_tokens(model: Model) -> list[int]:
    return [t for t in range(model.n_vocab) if model.is_eog(t)]


def check_reply(result, stop_reason: str, reasons: bool) -> None:
    """The reply reasons in its analysis channel or not, as said, and, where it ended, answers
    JSON of SCHEMA in its final channel."""
    split = split_reasoning(result.text)
    assert (result.stop_reason, bool(split.reasoning)) == (stop_reason, reasons), result.text
    assert result.text.startswith(ANALYSIS) == reasons
    if stop_reason == "eos":
        assert ("<|end|><|start|>assistant<|channel|>final" in result.text) == reasons
        value = json.loads(split.answer)
        assert set(value) == {"ok", "tag"} and isinstance(value["ok"], bool) and value["tag"] in ("red", "green")


def test_the_analysis_is_free_and_the_final_message_follows_the_grammar(model):
    """After gpt-oss's "<|start|>assistant": a header (only the grammar's text), an analysis
    message free but for an end of generation ("{", "}" and markup too), another, then the final
    channel's header and nothing but the schema's JSON, then the end; each token read by a clone
    of the state before it."""
    prompt = model.render_chat(ASK)
    assert prompt.endswith("<|start|>assistant")
    grammar = where_it_applies(model, schema_grammar(SCHEMA), prompt)
    assert grammar.phase is Phase.HEADER
    everything, eog = np.arange(model.n_vocab), eog_tokens(model)
    [channel], [letter_a] = tokens_of(model, "<|channel|>"), tokens_of(model, "a")
    assert grammar.allowed(np.array([channel, letter_a])).tolist() == [True, False]
    reasoning = ['a {"x": 1} <|start|>assistant b', "more<|message|>"]
    header, answer = ANALYSIS, '{"ok": true, "tag": "red"}'
    for body in reasoning:
        for token in tokens_of(model, header):
            assert grammar.phase is Phase.HEADER and not grammar.allowed(np.array(eog)).any()
            grammar.accept(token)
            grammar = grammar.clone()
        for token in tokens_of(model, body):
            assert grammar.phase is Phase.REASONING and not grammar.allowed(np.array(eog)).any()
            assert grammar.allowed(everything).sum() == model.n_vocab - len(eog)
            grammar.accept(token)
            grammar = grammar.clone()  # a verify row's clone goes on where its grammar was
        grammar.accept(tokens_of(model, "<|end|>")[0])
        header = "<|start|>assistant" + ANALYSIS
    assert grammar.phase is Phase.HEADER
    assert not grammar.allowed(np.array([channel, letter_a])).any()  # "<|start|>assistant" first
    for token in tokens_of(model, FINAL):
        grammar.accept(token)
    assert grammar.phase is Phase.ANSWER
    assert grammar.allowed(np.array([letter_a, tokens_of(model, "{")[0]])).tolist() == [False, True]
    for token in tokens_of(model, answer):
        assert not grammar.allowed(np.array(eog)).any()
        grammar.accept(token)
    allowed = set(everything[grammar.allowed(everything)].tolist())
    assert set(eog) <= allowed  # complete: the end, or the whitespace JSON may end with
    assert all(model.piece(t).isspace() for t in allowed - set(eog))


def test_a_reply_may_answer_at_once_and_name_a_constraint(model):
    """No analysis at all, and the final header with the constraint llama.cpp's grammar allows."""
    prompt = model.render_chat(ASK)
    for header in ("<|channel|>final<|message|>", "<|channel|>final <|constrain|>json<|message|>"):
        grammar = where_it_applies(model, schema_grammar(SCHEMA), prompt)
        for token in tokens_of(model, header):
            assert grammar.phase is Phase.HEADER
            grammar.accept(token)
        assert grammar.phase is Phase.ANSWER
        for token in tokens_of(model, '{"ok": false, "tag": "green"}'):
            grammar.accept(token)
        assert grammar.allowed(np.array(eog_tokens(model))).all()


def test_a_header_holds_no_new_line(model):
    """harmony.py reads a header with a new line in it as text (a final answer would keep its
    header in the content): the grammar writes none, where llama.cpp's lets a constraint follow one."""
    grammar = where_it_applies(model, schema_grammar(SCHEMA), model.render_chat(ASK))
    for token in tokens_of(model, "<|channel|>final"):
        grammar.accept(token)
    newline = model.tokenize("\n", add_special=False)[-1]
    assert model.piece(newline) == b"\n"
    assert not grammar.allowed(np.array([newline]))[0]
    assert grammar.allowed(np.array(model.tokenize(" ", add_special=False)[-1:]))[0]


def test_the_phase_comes_from_the_prompts_tail(model, tmp_path):
    """A prompt that opened the analysis channel begins in its free body; one that opened the
    final channel's body is the grammar's from the first token; a prompt ending "<|start|>assistant"
    on a vocabulary without harmony's tokens (Muse Glimmer's messages) is as before."""
    prompt, text = model.render_chat(ASK), schema_grammar(SCHEMA)
    opened = where_it_applies(model, text, prompt + ANALYSIS)
    assert opened.phase is Phase.REASONING
    opened.accept(tokens_of(model, "<|end|>")[0])
    assert opened.phase is Phase.HEADER
    plain = Grammar(model, text)
    for final in ("<|channel|>final<|message|>", "<|channel|>final <|constrain|>json<|message|>"):
        answer = where_it_applies(model, text, prompt + final)
        assert answer.phase is Phase.ANSWER
        assert np.array_equal(brute_force_mask(answer, model.n_vocab), brute_force_mask(plain, model.n_vocab))
    standard = Model(tm.write_model(tmp_path / "standard.gguf"), OPTIONS)
    assert where_it_applies(standard, text, "<|start|>assistant").phase is Phase.ANSWER
    standard.close()


def test_a_prompt_that_began_the_analysis_goes_on_with_it(gpt_oss):
    """A prompt that wrote the start of the analysis for the model goes on in its free body, and
    one that ended an analysis message has the next header the grammar's: the JSON comes in the
    final message (the JSON was written from the first token, inside the analysis)."""
    model, text = gpt_oss.target, schema_grammar(SCHEMA)
    prompt = model.render_chat(ASK) + ANALYSIS + "Let me think"
    [start], [channel], [end] = (
        tokens_of(model, "<|start|>"),
        tokens_of(model, "<|channel|>"),
        tokens_of(model, "<|end|>"),
    )
    begun = where_it_applies(model, text, prompt)
    assert begun.phase is Phase.REASONING
    begun.accept(end)
    for grammar in (begun, where_it_applies(model, text, prompt + "<|end|>")):
        assert grammar.phase is Phase.HEADER
        assert grammar.allowed(np.array([start, channel])).tolist() == [True, False]
        for token in tokens_of(model, FINAL):
            grammar.accept(token)
        assert grammar.phase is Phase.ANSWER
    result = greedy(gpt_oss, prompt)
    assert "<|end|><|start|>assistant<|channel|>final" in result.text, result.text
    assert set(json.loads(result.text.rpartition("<|message|>")[2])) == {"ok", "tag"}


# Messages a prompt opened that are not the final one: a call's body (its recipient after the channel
# or in the role header), a commentary message's (a preamble), and an analysis longer than the
# prompt's last PROMPT_END_TOKENS tokens
CALL_OPENED = "<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>"
OPENED = {
    "call": CALL_OPENED,
    "call in the role header": " to=functions.get_weather<|channel|>commentary json<|message|>",
    "preamble": "<|channel|>commentary<|message|>",
    "long analysis": ANALYSIS + "Let me think about it. " * 12,
}


@pytest.mark.parametrize("opened", OPENED)
def test_a_message_the_prompt_opened_goes_on_free(model, opened):
    """A prompt that opened a call's body goes on in it free, its end of generation (<|call|>)
    too; one that opened a preamble or an analysis (however long) goes on free but for an end of
    generation, as the answer is yet to come. After the message's <|end|> (the model's or the
    prompt's) the next header is the grammar's, then the final message the schema's JSON."""
    prompt, text = model.render_chat(ASK) + OPENED[opened], schema_grammar(SCHEMA)
    everything, eog = np.arange(model.n_vocab), eog_tokens(model)
    tokens = tokens_of(model, model.render_chat(ASK)) + tokens_of(model, OPENED[opened])
    if opened == "long analysis":  # its header is further back than the tokens read by count
        assert len(tokens_of(model, OPENED[opened])) > PROMPT_END_TOKENS
    grammar = output_grammar(model, GenerationConfig(json_schema=SCHEMA), tokens)
    assert grammar is not None
    call = opened.startswith("call")
    assert grammar.phase is (Phase.CALL_MESSAGE if call else Phase.REASONING)
    allowed = grammar.allowed(everything)
    assert allowed.sum() == model.n_vocab - (0 if call else len(eog)) and allowed[eog].all() == call
    for token in tokens_of(model, '{"city": "Paris"}'):
        grammar.accept(token)
        assert grammar.free
    grammar.accept(tokens_of(model, "<|end|>")[0])
    for after in (grammar, where_it_applies(model, text, prompt + "Some text.<|end|>")):
        assert after.phase is Phase.HEADER and not after.allowed(np.array(eog)).any()
        for token in tokens_of(model, FINAL + '{"ok": true, "tag": "red"}'):
            after.accept(token)
        assert after.phase is Phase.ANSWER and after.allowed(np.array(eog)).all()
        after.close()


def test_a_call_the_prompt_ended_is_no_open_message(model):
    """A raw prompt whose last message is a call it ended (<|call|>, a call's end) is not in the
    call's body: the reply is not free, as it was not before commentary messages were read (a
    chat's prompt goes on with the tool's result)."""
    prompt = model.render_chat(ASK) + CALL_OPENED + '{"city": "Paris"}<|call|>'
    grammar = where_it_applies(model, schema_grammar(SCHEMA), prompt)
    assert grammar.phase is not Phase.CALL_MESSAGE and not grammar.free
    grammar.close()


def test_the_prompts_end_goes_back_to_its_last_message_start(model, tmp_path):
    """The phase is read from the prompt's end: on gpt-oss's vocabulary it goes back to the last
    "<|start|>" (the message the prompt ends in), however far; on another, PROMPT_END_TOKENS."""
    tokens = tokens_of(model, model.render_chat(ASK) + OPENED["long analysis"])
    start = len(tokens) - 1 - tokens[::-1].index(tokens_of(model, "<|start|>")[0])
    assert len(tokens) - start > PROMPT_END_TOKENS
    assert prompt_end(model, tokens) == model.detokenize(tokens[start:]).decode()
    assert prompt_end(model, tokens[start + 1 :]).startswith(ANALYSIS)  # no start: its last channel
    short = tokens_of(model, model.render_chat(ASK))
    assert prompt_end(model, short) == model.detokenize(short[-PROMPT_END_TOKENS:]).decode()
    standard = Model(tm.write_model(tmp_path / "standard.gguf"), OPTIONS)
    words = standard.tokenize("hello world " * 100, add_special=False)
    assert prompt_end(standard, words) == standard.detokenize(words[-PROMPT_END_TOKENS:]).decode()
    standard.close()


# Questions a test asks until the tiny model's greedy reply takes the path it checks: which one
# does depends on the CPU's kernels (the last bits of a random model's logits), not on specllm
CANDIDATES = QUESTIONS + ["Paris", "What is the weather in Paris?", "Hi", "Tell me a joke", "2+2"]
CANDIDATES += [f"Question {i}" for i in range(20)]


def first_reply(engine, text_after, takes_the_path, **kwargs):
    """The first candidate question whose target-only greedy reply (to its chat prompt plus
    `text_after`) takes the path: (prompt tokens, prompt text, reply). Fails, saying what each did,
    where none does. Each prompt is evaluated whole: its rows evaluated after a cached prefix of
    another prompt's differ in their last bits (a half-precision KV cache), enough to turn the
    argmax of a random model's near-ties."""
    seen = []
    for question in CANDIDATES:
        text = engine.target.render_chat([{"role": "user", "content": question}]) + text_after
        prompt = engine.prompt_tokens(text)
        engine.target.truncate(0)  # the prompt's cache rows as a drafter's run will read them
        reply = greedy(engine, prompt, **kwargs)
        if takes_the_path(reply):
            return prompt, text, reply
        seen.append(f"{question!r}: {reply.stop_reason} {reply.text[:60]!r}")
    pytest.fail("no candidate takes the path:\n" + "\n".join(seen))


def ends_then_answers(reply) -> bool:
    return reply.stop_reason == "eos" and "<|end|><|start|>assistant<|channel|>final" in reply.text


# (message the prompt opened, the path its greedy reply is to take)
GOING_ON = [
    ("long analysis", ends_then_answers),  # the analysis ends, then the final message's JSON
    ("preamble", ends_then_answers),  # the preamble ends, then the final message's JSON
    ("call", lambda reply: reply.stop_reason == "eos" and "<|end|>" not in reply.text),  # <|call|>
    ("call", lambda reply: "<|end|>" in reply.text),  # the call's <|end|>, then the grammar's headers
]


@pytest.mark.parametrize(("opened", "takes_the_path"), GOING_ON)
def test_greedy_after_a_message_the_prompt_opened_is_the_same_with_every_drafter(gpt_oss, opened, takes_the_path):
    """The free body, its end and the headers after it inside drafts and steps: greedy equal to
    target-only with every drafter and to the brute-force mask; no JSON before a final message."""
    target = gpt_oss.target
    prompt, text, expected = first_reply(gpt_oss, OPENED[opened], takes_the_path)
    assert not expected.text.startswith("{")
    if opened != "call":  # the final message holds the JSON (a final header may name a constraint)
        assert set(json.loads(expected.text.rpartition("<|message|>")[2])) == {"ok", "tag"}
    grammar = where_it_applies(target, schema_grammar(SCHEMA), text)
    assert greedy_by_brute_force(target, prompt, grammar, MAX_TOKENS) == expected.tokens
    grammar.close()
    target.truncate(0)
    for drafter in ("model", "ngram", "auto"):
        for gamma in (1, 3):
            result = greedy(gpt_oss, prompt, drafter, gamma)
            assert result.tokens == expected.tokens, (text, drafter, gamma)


def test_greedy_json_after_analysis_is_the_same_with_every_drafter(gpt_oss):
    """The analysis ends and the headers pass inside drafts and steps: each row masked by its own
    clone's phase."""
    for question, (stop_reason, reasons) in zip(QUESTIONS, EXPECTED):
        prompt = gpt_oss.target.render_chat([{"role": "user", "content": question}])
        expected = greedy(gpt_oss, prompt)
        check_reply(expected, stop_reason, reasons)
        for drafter in ("model", "ngram", "auto"):
            for gamma in (1, 3, 5):
                result = greedy(gpt_oss, prompt, drafter, gamma)
                assert result.tokens == expected.tokens, (question, drafter, gamma)


def test_greedy_after_analysis_is_the_argmax_over_a_brute_force_mask(gpt_oss):
    """Target-only greedy decoding by the definition: each row masked by trying every token."""
    target = gpt_oss.target
    text = target.render_chat([{"role": "user", "content": QUESTIONS[1]}])
    prompt = gpt_oss.prompt_tokens(text)
    out = greedy_by_brute_force(target, prompt, where_it_applies(target, schema_grammar(SCHEMA), text), MAX_TOKENS)
    target.truncate(0)
    assert split_reasoning(target.detokenize(out).decode()).reasoning
    for drafter in ("none", "model"):
        result = greedy(gpt_oss, prompt, drafter, 4)
        assert result.tokens == out
        check_reply(result, "eos", reasons=True)


@pytest.mark.parametrize("where", ["header", "analysis"])
def test_a_row_matches_a_brute_force_mask(gpt_oss, where):
    target, sampler = gpt_oss.target, SamplerSettings(temperature=1.0, top_k=0)
    prompt = target.render_chat(ASK) + (ANALYSIS + "It is" if where == "analysis" else "")
    grammar = where_it_applies(target, schema_grammar(SCHEMA), target.render_chat(ASK))
    for token in tokens_of(target, prompt[len(target.render_chat(ASK)) :]):
        grammar.accept(token)
    row = target.sync(gpt_oss.prompt_tokens(prompt), n_logits=1)[0]
    reference = row.copy()
    reference[~brute_force_mask(grammar, target.n_vocab)] = -np.inf
    assert np.array_equal(distribution(grammar.masked(row, sampler), sampler), distribution(reference, sampler))
    target.truncate(0)


CALL_HEADER = "<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>"


def test_beside_tools_a_header_may_be_a_calls(model):
    """With a call opening (tools offered), a header may also be a commentary call's, as
    harmony.py reads a call: its body is free, its end of generation too (<|call|>); after its
    <|end|> the next header is the grammar's, and the final message still the schema's JSON.
    Without one, "commentary" is refused."""
    prompt, text = model.render_chat(ASK), schema_grammar(SCHEMA)
    everything, eog = np.arange(model.n_vocab), eog_tokens(model)
    [commentary_c] = tokens_of(model, "c")
    plain = where_it_applies(model, text, prompt)
    plain.accept(tokens_of(model, "<|channel|>")[0])
    assert not plain.allowed(np.array([commentary_c]))[0]
    plain.close()
    grammar = where_it_applies(model, text, prompt, "to=functions.")
    for token in tokens_of(model, CALL_HEADER):
        assert grammar.phase is Phase.HEADER and not grammar.allowed(np.array(eog)).any()
        grammar.accept(token)
    for token in tokens_of(model, '{"city": "Paris"}'):
        assert grammar.phase is Phase.CALL_MESSAGE and grammar.allowed(everything).all()
        grammar.accept(token)
    assert grammar.allowed(np.array(eog)).all()
    ended = grammar.clone()
    grammar.close()
    ended.accept(tokens_of(model, "<|end|>")[0])
    assert ended.phase is Phase.HEADER and not ended.allowed(np.array(eog)).any()
    for token in tokens_of(model, FINAL):
        ended.accept(token)
    assert ended.phase is Phase.ANSWER
    for token in tokens_of(model, '{"ok": true, "tag": "red"}'):
        assert not ended.allowed(np.array(eog)).any()
        ended.accept(token)
    assert ended.allowed(np.array(eog)).all()
    ended.close()


# The calls a tiny model's greedy reply beside tools may make: the recipient in the role header,
# after a commentary channel, and a call after an analysis message
CALL_PATHS = [
    lambda text: text.startswith(" to=functions.") or "<|start|>assistant to=functions." in text,
    lambda text: "<|channel|>commentary to=functions." in text,
    lambda text: text.startswith(ANALYSIS) and " to=functions." in text,
]


@pytest.mark.parametrize("takes_the_path", CALL_PATHS)
def test_greedy_calls_beside_the_schema_are_the_reference_with_every_drafter(gpt_oss, takes_the_path):
    """The tiny model's greedy replies, with a call opening, are calls (the name is noise): the
    same with every drafter and by the brute-force mask, ended by the model. Any opening allows a
    harmony call: another one's reply is the same."""
    target = gpt_oss.target
    prompt, text, expected = first_reply(
        gpt_oss,
        "",
        lambda reply: reply.stop_reason == "eos" and takes_the_path(reply.text),
        call_opening="to=functions.",
    )
    grammar = where_it_applies(target, schema_grammar(SCHEMA), text, "to=functions.")
    assert greedy_by_brute_force(target, prompt, grammar, MAX_TOKENS) == expected.tokens
    grammar.close()
    target.truncate(0)
    for drafter in ("model", "ngram", "auto"):
        for gamma in (1, 3):
            result = greedy(gpt_oss, prompt, drafter, gamma, call_opening="to=functions.")
            assert result.tokens == expected.tokens, (text, drafter, gamma)
    assert greedy(gpt_oss, prompt, call_opening="x").tokens == expected.tokens


# The other call headers llama.cpp's gpt-oss parser reads (common/parsers/gpt-oss.cpp), as harmony.py
# reads them: the recipient in the role header, and a call on the analysis channel
OTHER_CALL_HEADERS = [
    " to=functions.get_weather<|channel|>commentary <|constrain|>json<|message|>",
    " to=functions.get_weather<|channel|>analysis<|message|>",
    "<|channel|>analysis to=functions.get_weather json<|message|>",
]


@pytest.mark.parametrize("header", OTHER_CALL_HEADERS)
def test_beside_tools_a_call_header_may_name_its_recipient_as_llama_cpp_reads_it(model, header):
    """A call's header with its recipient in the role header, or on the analysis channel, is a
    call's too: its body free up to its <|end|>, after an analysis message as first."""
    prompt, text = model.render_chat(ASK), schema_grammar(SCHEMA)
    everything = np.arange(model.n_vocab)
    for before in ("", ANALYSIS + "Think.<|end|><|start|>assistant"):
        grammar = where_it_applies(model, text, prompt, "to=functions.")
        for token in tokens_of(model, before + header):
            assert grammar.allowed(np.array([token]))[0], (before, header)
            grammar.accept(token)
        assert grammar.phase is Phase.CALL_MESSAGE
        for token in tokens_of(model, '{"city": "Paris"}'):
            assert grammar.allowed(everything).all()
            grammar.accept(token)
        grammar.accept(tokens_of(model, "<|end|>")[0])
        for token in tokens_of(model, FINAL + '{"ok": true, "tag": "red"}'):
            grammar.accept(token)
        assert grammar.phase is Phase.ANSWER and grammar.allowed(np.array(eog_tokens(model))).all()
        grammar.close()

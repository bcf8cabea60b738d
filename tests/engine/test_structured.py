"""Structured output (a GBNF grammar, a JSON schema) on real tiny models: the target's distribution
at each position is the sampler chain over the logits with every token the grammar forbids there
set to -inf, and speculation gives exactly that distribution."""

import functools
import json
import subprocess
import sys

import numpy as np
import pytest
import tiny_models as tm
from grammar_reference import brute_force_mask, greedy_by_brute_force
from stats import SAMPLER, chi_square_pvalue

import specllm
from specllm.engine.drafters import Draft, NoDrafter
from specllm.engine.loop import Engine, GenerationConfig
from specllm.engine.sampling import SamplerSettings, distribution, greedy_token, masked
from specllm.errors import GrammarInvalid, SpecllmError
from specllm.llama.grammar import Grammar, schema_grammar
from specllm.llama.model import Model
from specllm.llama.options import ModelOptions

OPTIONS = ModelOptions(n_ctx=256, n_threads=1)
# A schema whose every value is short, so the tiny models' JSON ends well within max_tokens
SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 6},
        "age": {"type": "integer"},
        "ok": {"type": "boolean"},
        "tag": {"enum": ["red", "green", "blue"]},
    },
    "required": ["name", "age", "ok", "tag"],
    "additionalProperties": False,
}
WORDS = 'root ::= [a-z ]+ "."'  # lower-case words: most of a tiny model's likely tokens fit
DIGITS = "root ::= [0-9]+"
RULE_CHAIN = "root ::= r0\n" + "".join(f"r{i} ::= r{i + 1}\n" for i in range(10000))  # r10000 undefined
DEEP_SCHEMA = functools.reduce(
    lambda inner, _: {"type": "array", "items": inner}, range(3000), {}
)  # past Python's stack
PROMPTS = ["Hello world", "def f(x): return", "the cat is in the house and the cat is in the", "import os"]


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    """Targets of two seeds, each with a draft that agrees with it about 80% of the time."""
    d = tmp_path_factory.mktemp("structured")
    pairs = []
    for seed in (0, 3):
        target = tm.write_model(d / f"target{seed}.gguf", seed=seed)
        draft = tm.write_model(d / f"draft{seed}.gguf", seed=seed, noise=tm.DRAFT_NOISE, noise_seed=1)
        pairs.append((target, draft))
    return pairs


@pytest.fixture(scope="module")
def engines(models):
    loaded = [Engine(Model(t, OPTIONS), Model(d, OPTIONS)) for t, d in models]
    yield loaded
    for e in loaded:
        e.close()


def reference_greedy(target_path, prompt_ids, grammar_text, max_tokens):
    """Target-only greedy decoding under the definition, on a model of its own."""
    model = Model(target_path, OPTIONS)
    out = greedy_by_brute_force(model, prompt_ids, Grammar(model, grammar_text), max_tokens)
    model.close()
    return out


def check_schema(text: str) -> None:
    value = json.loads(text)
    assert set(value) == {"name", "age", "ok", "tag"}
    assert isinstance(value["name"], str)  # at most 6 characters to llama.cpp, which takes stray bytes as some
    assert isinstance(value["age"], int) and not isinstance(value["age"], bool)
    assert isinstance(value["ok"], bool) and value["tag"] in ("red", "green", "blue")


def greedy(engine, prompt, drafter, gamma=4, **kwargs):
    return engine.generate(prompt, max_tokens=80, temperature=0, drafter=drafter, gamma=gamma, **kwargs)


@pytest.mark.parametrize("gamma", [1, 3, 5])
def test_greedy_json_schema_is_the_same_with_every_drafter(engines, gamma):
    for engine in engines:
        for prompt in PROMPTS:
            expected = greedy(engine, prompt, "none", json_schema=SCHEMA)
            assert expected.stop_reason == "eos"  # the grammar ended it: the tiny models never do
            check_schema(expected.text)
            for drafter in ("model", "ngram", "auto"):
                result = greedy(engine, prompt, drafter, gamma, json_schema=SCHEMA)
                assert result.tokens == expected.tokens, (prompt, drafter)


def test_greedy_json_is_laid_out_as_llama_server_lets_it(engines):
    """The tiny models indent their JSON with the new lines and tabs llama-server's grammar allows
    (llama-cpp-python's took one space at most), and every drafter keeps it: still JSON of SCHEMA,
    no whitespace after it nor before a comma."""
    texts = []
    for engine in engines:
        for prompt in PROMPTS:
            expected = greedy(engine, prompt, "none", json_schema=SCHEMA)
            check_schema(expected.text)
            assert expected.text == expected.text.strip() and " ," not in expected.text
            assert greedy(engine, prompt, "model", 4, json_schema=SCHEMA).tokens == expected.tokens
            texts.append(expected.text)
    assert sum("\n" in text for text in texts) >= 4 and any("\t" in text for text in texts)


def test_greedy_speculation_under_a_grammar_really_drafts_and_rejects(engines):
    """Guard against a vacuous equality: draft tokens were accepted, and some were rejected."""
    stats = [greedy(e, p, "model", 4, grammar=WORDS).stats for e in engines for p in PROMPTS]
    assert sum(s.n_accepted for s in stats) > 20
    assert sum(s.n_drafted - s.n_accepted for s in stats) > 5


def test_greedy_under_a_grammar_is_the_argmax_over_the_allowed_tokens(models, engines):
    for (target, _), engine in zip(models, engines):
        for prompt in PROMPTS[:2]:
            ids = engine.prompt_tokens(prompt)
            for grammar in (WORDS, schema_grammar(SCHEMA)):
                expected = reference_greedy(target, ids, grammar, 40)
                for drafter in ("none", "model"):
                    result = engine.generate(ids, max_tokens=40, temperature=0, drafter=drafter, grammar=grammar)
                    assert result.tokens == expected, (prompt, drafter)


@pytest.mark.parametrize(
    "sampler",
    [
        SamplerSettings(temperature=0),
        SamplerSettings(temperature=0.8, top_k=40, top_p=0.95, min_p=0.05),
        SamplerSettings(temperature=1.0, top_k=4, top_p=1.0, min_p=0.0),
        SamplerSettings(temperature=0.7, top_k=0, top_p=0.9, min_p=0.02),
        SamplerSettings(temperature=1.0, top_k=0, top_p=1.0, min_p=0.0),
    ],
)
def test_masked_row_matches_a_brute_force_mask(models, sampler):
    """One row's masked distribution, checked against the mask found by trying each token: the
    cheap path (the best tokens checked first) keeps the same tokens with the same probabilities.
    Digits are few and far down a row: the head checked first has to widen. A row rounded to
    whole numbers has ties at every head's edge."""
    model = Model(models[0][0], OPTIONS)
    cases = [("Hello", WORDS, 0), ("x", schema_grammar(SCHEMA), 2), ("Hello", DIGITS, 0), ("Hello", DIGITS, 1)]
    for prompt, grammar_text, advance in cases:
        ids = model.tokenize(prompt)
        grammar = Grammar(model, grammar_text)
        for _ in range(advance):  # into the middle of the text: another state
            row = model.sync(ids, n_logits=1)[0]
            token = greedy_token(masked(row, grammar.allowed, SamplerSettings(temperature=0)))
            grammar.accept(token)
            ids = ids + [token]
        row = model.sync(ids, n_logits=1)[0]
        allowed = brute_force_mask(grammar, model.n_vocab)
        for logits in (row, np.round(row * 2).astype(np.float32)):
            reference = logits.copy()
            reference[~allowed] = -np.inf
            got = masked(logits, grammar.allowed, sampler)
            assert np.array_equal(distribution(got, sampler), distribution(reference, sampler))
    model.close()


def test_end_of_generation_only_where_the_grammar_can_end(models):
    model = Model(models[0][0], OPTIONS)
    eog = [t for t in range(model.n_vocab) if model.is_eog(t)]
    grammar = Grammar(model, 'root ::= "ab" "c"?')
    everything = np.arange(model.n_vocab)
    assert not grammar.allowed(np.array(eog)).any()
    for piece in "ab":
        grammar.accept(piece_token(model, piece))
    assert grammar.allowed(np.array(eog)).all()  # "ab" is a whole match, "abc" one too
    grammar.accept(piece_token(model, "c"))
    allowed = everything[grammar.allowed(everything)]
    assert sorted(allowed) == eog  # complete: nothing but the end
    model.close()


def piece_token(model: Model, text: str) -> int:
    return next(t for t in range(model.n_vocab) if model.piece(t) == text.encode())


def test_the_grammar_ends_the_generation(engines):
    for drafter in ("none", "model", "ngram"):
        r = engines[0].generate("Hello", max_tokens=50, temperature=0, drafter=drafter, grammar='root ::= "no" "."')
        assert (r.text, r.stop_reason) == ("no.", "eos")


@pytest.mark.parametrize(
    "drafter, prompt",
    [("model", "the cat is in the house and the cat is in the"), ("ngram", " ".join("abc" * 5))],
)
def test_sampled_first_tokens_follow_the_masked_target_distribution(models, engines, drafter, prompt):
    """The joint distribution of the first three tokens under a grammar, sampled with three-token
    drafts (the draft model's, n-gram copies), against target-only's exact one (brute-force masks)."""
    engine = engines[0]
    ids = engine.prompt_tokens(prompt)
    joint = masked_joint_distribution(models[0][0], ids, WORDS)
    cells = sorted(joint)
    counts, drafted, accepted, n = dict.fromkeys(cells, 0), 0, 0, 3000
    for seed in range(n):
        kwargs = SAMPLER.__dict__ | {"seed": seed}
        r = engine.generate(ids, max_tokens=4, gamma=3, drafter=drafter, grammar=WORDS, **kwargs)
        counts[tuple(r.tokens[:3])] += 1  # a KeyError: a sequence the masked target cannot produce
        drafted += r.stats.n_drafted
        accepted += r.stats.n_accepted
    assert drafted > n  # drafts were made, and the draft model's often accepted (n-gram copies are not)
    assert accepted > n / 20 or drafter == "ngram"
    observed = np.array([counts[c] for c in cells])
    assert chi_square_pvalue(observed, np.array([joint[c] for c in cells])) > 1e-3


def masked_joint_distribution(target_path, prompt_ids, grammar_text, depth=3):
    """P(t_1..t_depth) of target-only sampling with SAMPLER under the grammar, exactly."""
    model = Model(target_path, OPTIONS)
    joint = {(): (1.0, Grammar(model, grammar_text))}
    for _ in range(depth):
        grown = {}
        for prefix, (prob, grammar) in joint.items():
            row = model.sync(prompt_ids + list(prefix), n_logits=1)[0].copy()
            row[~brute_force_mask(grammar, model.n_vocab)] = -np.inf
            p = distribution(row, SAMPLER)
            for t in np.flatnonzero(p):
                after = grammar.clone()
                after.accept(int(t))
                grown[prefix + (int(t),)] = (prob * p[t], after)
        joint = grown
    model.close()
    return {prefix: prob for prefix, (prob, _) in joint.items()}


@pytest.mark.parametrize(
    "options, message",
    [
        ({"grammar": "root ::= foo"}, "the grammar does not parse: Undefined rule identifier 'foo'"),
        ({"grammar": 'root ::= "x'}, "the grammar does not parse: unexpected end of input"),
        ({"grammar": 'start ::= "x"'}, "the grammar does not parse: grammar does not contain a 'root' symbol"),
        ({"grammar": "  "}, "the grammar is empty"),
        ({"grammar": 'root ::= root "a" | "a"'}, "the grammar does not parse: unsupported grammar, left recursion"),
        ({"grammar": 'root ::= "a"\0 junk'}, "the grammar holds a NUL character"),
        # deeper than llama.cpp's recursive C code can go (30000 groups, a chain of 100000 rules
        # overflowed its stack); these are past the limits, within what it could take
        ({"grammar": "root ::= " + "(" * 6000 + '"a"' + ")" * 6000}, "the grammar nests groups 6000 deep, more than"),
        ({"grammar": RULE_CHAIN}, "the grammar has 10001 rules"),
        # llama.cpp's parser took the maximum below the minimum as 2^64 copies: out of memory, killed
        ({"grammar": 'root ::= "a" ( "b" ){3,2}'}, "the grammar repeats {3,2}: a maximum below its minimum"),
        ({"json_schema": "{"}, "the JSON schema is not JSON: "),
        ({"json_schema": [1]}, "a JSON schema is a JSON object, not list"),
        ({"json_schema": '{"items": ' * 3000 + "{}" + "}" * 3000}, "the JSON schema nests too deep to read"),
        ({"json_schema": DEEP_SCHEMA}, "the JSON schema nests too deep to read"),
        ({"json_schema": {"type": "nonsense"}}, 'the JSON schema\'s /type "nonsense" is no JSON type'),
        ({"json_schema": {}, "grammar": 'root ::= "x"'}, "give a grammar or a JSON schema, not both"),
        # llama-cpp-python's converter writes each repetition out (10**9 characters took all memory,
        # 10**5 optional items nested that deep overflowed the C parser's stack): past llama.cpp's
        # own limit they are refused, as llama-server refuses them
        ({"json_schema": {"type": "array", "minItems": 100000}}, "the JSON schema's /minItems 100000 is past the 2000"),
        (
            {"json_schema": {"anyOf": [{"type": "string", "maxLength": 3000}]}},
            "the JSON schema's /anyOf/0/maxLength 3000 is",
        ),
        ({"json_schema": {"type": "string", "pattern": "^x{1,5000}$"}}, "the JSON schema's /pattern repeats {1,5000}"),
        ({"json_schema": {"$ref": "https://127.0.0.1:9/s.json"}}, "the JSON schema's /$ref https"),
    ],
)
def test_a_bad_grammar_or_schema_is_one_line(engines, capfd, options, message):
    with pytest.raises(SpecllmError) as error:
        engines[0].generate("Hello", max_tokens=4, **options)
    assert str(error.value).startswith(message) and "\n" not in str(error.value)
    assert capfd.readouterr().err == ""  # llama.cpp's own print of the error is kept off the terminal


@pytest.mark.parametrize("drafter", ["none", "model", "ngram"])
def test_a_grammar_whose_token_the_vocabulary_lacks_is_the_grammars_fault(engines, drafter):
    with pytest.raises(GrammarInvalid, match="^the grammar allows no token of this vocabulary"):
        engines[0].generate("Hello", max_tokens=4, drafter=drafter, grammar='root ::= "a" <[999999]>')


def test_parentheses_in_strings_classes_and_comments_are_no_groups(engines):
    text = 'root ::= "' + "(" * 6000 + '" [^()] # ' + "(" * 6000 + "\nx ::= " + "(" * 5000 + '"a"' + ")" * 5000
    assert engines[0].generate("Hello", max_tokens=1, temperature=0, grammar=text).text == "("


def test_repetitions_up_to_llama_cpps_limit_are_taken(engines):
    schema = {"type": "string", "maxLength": 2000, "pattern": "^x{0,2000}$", "enum": [{"maxLength": 10**6}]}
    assert schema_grammar(schema)
    assert schema_grammar({"const": {"minItems": 10**6}})  # a value, not a schema


def test_no_schema_is_fetched_without_asserts_either():
    """llama-cpp-python's converter refuses to fetch a remote $ref with an assert, which python -O
    leaves out: it then fetched it (a server's request reaching any address)."""
    code = "from specllm.llama.grammar import schema_grammar; schema_grammar({'$ref': 'https://127.0.0.1:9/s.json'})"
    proc = subprocess.run([sys.executable, "-O", "-c", code], capture_output=True, text=True, timeout=60)
    assert proc.stderr.strip().splitlines()[-1].startswith("specllm.errors.GrammarInvalid: the JSON schema's /$ref")


def test_a_schema_is_turned_into_a_grammar_once():
    """A request's schema is checked, configured and used: converted once (seconds for some)."""
    schema = {"type": "object", "properties": {f"p{i}": {"type": "string"} for i in range(300)}}
    assert schema_grammar(schema) is schema_grammar(json.dumps(schema))


def test_an_empty_schema_is_any_json_object(engines):
    r = engines[0].generate("Hello", max_tokens=60, temperature=0, json_schema={})
    assert r.text.lstrip().startswith("{")
    assert GenerationConfig(json_schema={}).json_schema == "{}"
    assert issubclass(GrammarInvalid, SpecllmError)


def test_the_draft_model_drafts_within_the_grammar(engines):
    """The draft masks its rows too: under a JSON schema, where unmasked drafts are all but always
    refused (acceptance ~0.01), most draft tokens are accepted."""
    for engine in engines:
        for prompt in PROMPTS:
            for sampler in (dict(temperature=0), dict(temperature=0.8, seed=1)):
                r = engine.generate(prompt, max_tokens=80, drafter="model", gamma=4, json_schema=SCHEMA, **sampler)
                assert r.stats.acceptance_rate > 0.5, (prompt, sampler, r.stats.acceptance_rate)


@pytest.mark.parametrize("target, draft", [("target", "extra_heavy"), ("extra_heavy", "draft")])
def test_vocabularies_of_different_sizes_under_a_grammar(tiny_models, target, draft):
    """A draft vocabulary larger than the target's: its ids past the target's have no text in the
    grammar's vocabulary and are never drafted. A larger target's: the grammar covers all of it."""
    e = Engine(Model(getattr(tiny_models, target), OPTIONS), Model(getattr(tiny_models, draft), OPTIONS))
    for prompt in PROMPTS[:2]:
        for grammar in (WORDS, schema_grammar(SCHEMA)):
            expected = e.generate(prompt, max_tokens=40, temperature=0, drafter="none", grammar=grammar)
            result = e.generate(prompt, max_tokens=40, temperature=0, drafter="model", gamma=4, grammar=grammar)
            assert result.tokens == expected.tokens
            # (a larger target writes ids the draft cannot read, after which it drafts nothing)
            assert result.stats.n_accepted > 0 or target == "extra_heavy"
    e.close()


class CopyWithAForbiddenToken(NoDrafter):
    """An n-gram-like drafter (one-hot q) whose copy is the target's own greedy text with a token
    the grammar forbids put in as its third token."""

    def __init__(self, prompt_length: int, script: list[int], forbidden: int):
        self.prompt_length, self.script, self.forbidden = prompt_length, script, forbidden

    def propose(self, context: list[int], gamma: int) -> Draft:
        at = len(context) - self.prompt_length
        copy = self.script[at : at + 2] + [self.forbidden] + self.script[at + 2 : at + gamma - 1]
        return Draft(copy[:gamma], source="ngram")


def test_a_copy_is_cut_before_its_first_forbidden_token(engines, monkeypatch):
    """A copied draft (one-hot q) goes to the target only up to its first token the grammar
    forbids: that token would be rejected for certain, and the target's own token after the prefix
    has the same distribution as the rejection's residual."""
    import specllm.engine.loop

    engine = engines[0]
    ids = engine.prompt_tokens("Hello")
    expected = engine.generate(ids, max_tokens=30, temperature=0, drafter="none", grammar=DIGITS).tokens
    forbidden = piece_token(engine.target, "a")
    drafter = CopyWithAForbiddenToken(len(ids), expected, forbidden)
    monkeypatch.setattr(specllm.engine.loop._Run, "_make_drafter", lambda run, engine: drafter)
    events = list(engine.stream(ids, max_tokens=30, temperature=0, drafter="ngram", gamma=4, grammar=DIGITS))
    steps, result = events[:-1], events[-1].result
    assert result.tokens == expected
    assert all(forbidden not in step.drafted for step in steps)
    assert sum(len(step.drafted) for step in steps) > 10 and result.stats.acceptance_rate == 1.0


def test_mtp_drafting_under_a_grammar_on_a_hybrid(tmp_path):
    """The target's MTP layers mask their drafts too, and a hybrid target takes rejected draft
    tokens back from its snapshots: greedy output equals target-only's."""
    path = tm.write_model(tmp_path / "q35-mtp.gguf", arch="qwen35", n_nextn=1, mtp_mimic=True)
    engine = specllm.load(str(path), n_ctx=512, n_threads=1, snapshots=16)
    accepted = 0
    for prompt in PROMPTS:
        expected = engine.generate(prompt, max_tokens=48, temperature=0, drafter="none", json_schema=SCHEMA)
        assert expected.text.startswith("{")  # (its strings run long: 48 tokens may not close them)
        for gamma in (1, 3, 5):
            r = engine.generate(prompt, max_tokens=48, temperature=0, drafter="mtp", gamma=gamma, json_schema=SCHEMA)
            assert r.tokens == expected.tokens, (prompt, gamma)
            accepted += r.stats.n_accepted
    assert accepted > 150, accepted  # masked drafts: 312; unmasked ones: 30
    engine.close()

"""`specllm run --grammar FILE` and `--json-schema FILE|JSON`: the output follows them, and a bad
file, grammar or schema is one line."""

import json
import os
import subprocess
import sys

import pytest
import tiny_models as tm
from one_line import assert_one_line_error

SPECLLM = [sys.executable, "-m", "specllm"]
SCHEMA = {"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"]}


def specllm_run(*args):
    return subprocess.run(
        SPECLLM + ["run", *map(str, args)], capture_output=True, text=True, env=dict(os.environ), timeout=120
    )


@pytest.fixture(scope="module")
def models(tiny_models):
    return ["--target", tiny_models.target, "--draft", tiny_models.draft, "--threads", 1, "--ctx-size", 256]


def run_json(models, *args):
    proc = specllm_run("Hello", *models, "--temperature", 0, "--json", *args)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


def test_grammar_file(models, tmp_path):
    grammar = tmp_path / "answer.gbnf"
    grammar.write_text('root ::= ("yes" | "no") "."\n')
    out = run_json(models, "--grammar", grammar)
    assert out["text"] in ("yes.", "no.") and out["stop_reason"] == "eos"


def test_json_schema_given_and_in_a_file(models, tmp_path):
    given = run_json(models, "--json-schema", json.dumps(SCHEMA), "--drafter", "model", "--gamma", 3)
    assert set(json.loads(given["text"])) == {"ok"} and given["stop_reason"] == "eos"
    path = tmp_path / "schema.json"
    path.write_text(json.dumps(SCHEMA), encoding="utf-8-sig")  # a BOM is no error
    assert run_json(models, "--json-schema", path)["text"] == given["text"]


def test_a_bounded_number_stays_within_its_bounds(models):
    """Neither llama-server's converter nor llama-cpp-python's reads a number's bounds."""
    schema = {"type": "object", "properties": {"p": {"type": "number", "minimum": 0.5, "exclusiveMaximum": 1}}}
    schema["required"] = ["p"]
    for seed in range(3):
        proc = specllm_run("Hello", *models, "--json", "--json-schema", json.dumps(schema), "--seed", seed)
        assert proc.returncode == 0, proc.stderr
        out = json.loads(proc.stdout)
        assert out["stop_reason"] == "eos" and 0.5 <= json.loads(out["text"])["p"] < 1, out["text"]


def test_a_bounded_integer_stays_within_its_bounds(models):
    """llama-server's converter reads minimum and exclusiveMaximum; llama-cpp-python's did not."""
    schema = {"type": "object", "properties": {"n": {"type": "integer", "minimum": -7, "exclusiveMaximum": -2}}}
    schema["required"] = ["n"]
    for seed in range(4):
        proc = specllm_run("Hello", *models, "--json", "--json-schema", json.dumps(schema), "--seed", seed)
        assert proc.returncode == 0, proc.stderr
        out = json.loads(proc.stdout)
        assert out["stop_reason"] == "eos" and -7 <= json.loads(out["text"])["n"] <= -3, out["text"]


@pytest.mark.parametrize(
    "args, fragments",
    [
        (["--grammar", "{dir}/missing.gbnf"], ["cannot read --grammar", "missing.gbnf: No such file"]),
        (["--grammar", "{dir}"], ["cannot read --grammar", "it is a folder"]),
        (["--grammar", "{dir}/bad.gbnf"], ["the grammar does not parse: Undefined rule identifier 'foo'"]),
        (["--json-schema", "{dir}/missing.json"], ["cannot read --json-schema", "No such file"]),
        (["--json-schema", "{dir}/bad.gbnf"], ["--json-schema", "bad.gbnf: the JSON schema is not JSON"]),
        (["--json-schema", '{"type": 3}'], ["the JSON schema's /type 3 is no JSON type"]),
        (
            ["--json-schema", '{"properties": {"a": {"type": "strng"}}}'],
            ['the JSON schema\'s /properties/a/type "strng"'],
        ),
        (["--json-schema", '{"properties": "a"}'], ["the JSON schema's /properties must be an object of schemas"]),
        (["--json-schema", '{"allOf": [{"enum": [1]}, {"enum": [2]}]}'], ["the JSON schema's /allOf admits no value"]),
        (
            ["--json-schema", '{"type": "number", "exclusiveMinimum": 1, "maximum": 1}'],
            ["number bounds at the root admit no number"],
        ),
        (["--json-schema", "{bad"], ["the JSON schema is not JSON"]),
        (["--json-schema", "{}", "--grammar", "{dir}/bad.gbnf"], ["give --grammar or --json-schema, not both"]),
        (["--grammar", ""], ["the value is empty"]),
    ],
)
def test_a_bad_grammar_or_schema_is_one_line(models, tmp_path, args, fragments):
    (tmp_path / "bad.gbnf").write_text("root ::= foo\n")
    proc = specllm_run("Hello", *models, *(a.replace("{dir}", str(tmp_path)) for a in args))
    assert_one_line_error(proc, *fragments)


def test_a_thinking_model_reasons_before_its_json(tmp_path):
    """The chat template opens a think block ([THINK], Magistral's): the reasoning is free and the
    text after [/THINK] follows the schema or the grammar."""
    template = "{% for m in messages %}[INST]{{ m['content'] }}[/INST]{% endfor %}[THINK]"
    target = tm.write_model(tmp_path / "thinker.gguf", vocab="markup", extra_scale=1.5, seed=2, chat_template=template)
    models = ["--target", target, "--drafter", "none", "--threads", 1, "--ctx-size", 256]
    (tmp_path / "answer.gbnf").write_text('root ::= ("yes" | "no") "."\n')
    for option, check in [
        (["--json-schema", json.dumps(SCHEMA)], lambda text: set(json.loads(text)) == {"ok"}),
        (["--grammar", tmp_path / "answer.gbnf"], lambda text: text in ("yes.", "no.")),
    ]:
        out = run_json(models, *option, "--max-tokens", 80)
        assert check(out["text"]) and out["reasoning"] and out["stop_reason"] == "eos", out

"""JSON under a schema laid out as llama-server allows (whitespace: nothing, a space, or one or two
newlines and up to 20 spaces or tabs, after `{`, `[`, `,`, `:` and a declared key and before `}`
and `]`), and patterns read as llama.cpp reads them. The oracle is llama.cpp's own converter: the
grammars its tests/test-json-schema-to-grammar.cpp expects, copied below; our grammar's text may
differ, so the two are compared by membership, through llama.cpp's grammar sampler, string by
string: each JSON text with each piece of whitespace put at each place outside its strings."""

import json

import pytest
import tiny_models as tm
from grammar_reference import accepts

from specllm.errors import GrammarInvalid
from specllm.llama.grammar import Grammar, schema_grammar
from specllm.llama.model import Model
from specllm.llama.options import ModelOptions

SPACE = 'space ::= | " " | "\\n"{1,2} [ \\t]{0,20}\n'
CHAR = 'char ::= [^"\\\\\\x7F\\x00-\\x1F] | [\\\\] (["\\\\bfnrt] | "u" [0-9a-fA-F]{4})\nstring ::= "\\"" char* "\\""\n'
NUMBER = (
    "decimal-part ::= [0-9]{1,16}\nintegral-part ::= [0] | [1-9] [0-9]{0,15}\n"
    'number ::= ("-"? integral-part) ("." decimal-part)? ([eE] [-+]? integral-part)?\n'
)
VALUE = (
    'array ::= "[" space ( value ("," space value)* )? space "]"\nboolean ::= ("true" | "false")\nnull ::= "null"\n'
    'object ::= "{" space ( string ":" space value ("," space string ":" space value)* )? space "}"\n'
    "value ::= object | array | string | number | boolean | null\n"
)
# (llama.cpp's test's name, schema, the grammar it expects, compact JSON texts: some in the
# language, some not)
CASES = [
    (
        "required props in original order",
        {
            "type": "object",
            "properties": {"b": {"type": "string"}, "c": {"type": "string"}, "a": {"type": "string"}},
            "required": ["a", "b", "c"],
            "additionalProperties": False,
        },
        'a-kv ::= "\\"a\\"" space ":" space string\nb-kv ::= "\\"b\\"" space ":" space string\n'
        'c-kv ::= "\\"c\\"" space ":" space string\n'
        'root ::= "{" space b-kv "," space c-kv "," space a-kv space "}"\n' + CHAR,
        ['{"b":"x","c":"","a":"z"}', '{"a":"x","b":"y","c":"z"}'],
    ),
    (
        "required + optional props each in original order",
        {
            "properties": {
                "b": {"type": "string"},
                "a": {"type": "string"},
                "d": {"type": "string"},
                "c": {"type": "string"},
            },
            "required": ["a", "b"],
            "additionalProperties": False,
        },
        'a-kv ::= "\\"a\\"" space ":" space string\nb-kv ::= "\\"b\\"" space ":" space string\n'
        'c-kv ::= "\\"c\\"" space ":" space string\nd-kv ::= "\\"d\\"" space ":" space string\n'
        'd-rest ::= ( "," space c-kv )?\n'
        'root ::= "{" space b-kv "," space a-kv ( "," space ( d-kv d-rest | c-kv ) )? space "}"\n' + CHAR,
        ['{"b":"","a":"","d":"","c":""}', '{"b":"","a":""}', '{"b":"","a":"","c":""}'],
    ),
    (
        "required + optional + additional props",
        {
            "type": "object",
            "properties": {"and": {"type": "number"}, "also": {"type": "number"}},
            "required": ["and"],
            "additionalProperties": {"type": "number"},
        },
        'additional-k ::= ["] ( [a] ([l] ([s] ([o] char+ | [^"o] char*) | [^"s] char*) | [n] ([d] char+ '
        '| [^"d] char*) | [^"ln] char*) | [^"a] char* )? ["]\n'
        'additional-kv ::= additional-k ":" space number\nalso-kv ::= "\\"also\\"" space ":" space number\n'
        'also-rest ::= ( "," space additional-kv )*\nand-kv ::= "\\"and\\"" space ":" space number\n'
        'root ::= "{" space and-kv ( "," space ( also-kv also-rest | additional-kv ( "," space additional-kv )* ) )? '
        'space "}"\n' + CHAR + NUMBER,
        ['{"and":1,"also":2.5,"x":3}', '{"and":-1,"q":1e5}', '{"and":1,"also":"x"}'],
    ),
    (
        "additional props (true)",
        {"type": "object", "additionalProperties": True},
        "root ::= object\n" + CHAR + NUMBER + VALUE,
        ['{"a":[1,{"b":null}],"c":true}', "{}", '{"a":[]}', "[]"],
    ),
    (
        "additional props (implicit), the schema of a json_object response format",
        {"type": "object"},
        "root ::= object\n" + CHAR + NUMBER + VALUE,
        ['{"k":{"n":[false,"s"]}}', "{}"],
    ),
    (
        "empty w/o additional props",
        {"type": "object", "additionalProperties": False},
        'root ::= "{" space "}"\n',
        ["{}", '{"a":1}'],
    ),
    (
        "string array",
        {"type": "array", "prefixItems": {"type": "string"}},
        'root ::= "[" space (string ("," space string)*)? space "]"\n' + CHAR,
        ['["a","b"]', "[]", '["a",1]'],
    ),
    (
        "tuple2",
        {"prefixItems": [{"type": "string"}, {"type": "number"}]},
        'root ::= "[" space string "," space number space "]"\n' + CHAR + NUMBER,
        ['["a",1.5]', '["a"]'],
    ),
    (
        "min + maxItems",
        {"items": {"type": ["number", "integer"]}, "minItems": 3, "maxItems": 5},
        'integer ::= ("-"? integral-part)\nitem ::= number | integer\n'
        'root ::= "[" space item ("," space item){2,4} space "]"\n' + NUMBER,
        ["[1,2,3]", "[1,2]", "[1,2,3,4,5,6]"],
    ),
    (
        "string const, non-string enum",
        {
            "type": "object",
            "properties": {"c": {"const": "foo"}, "e": {"enum": ["red", "amber", "green", None, 42, ["foo"]]}},
            "required": ["c", "e"],
            "additionalProperties": False,
        },
        'c ::= "\\"foo\\""\nc-kv ::= "\\"c\\"" space ":" space c\n'
        'e ::= ("\\"red\\"" | "\\"amber\\"" | "\\"green\\"" | "null" | "42" | "[\\"foo\\"]")\n'
        'e-kv ::= "\\"e\\"" space ":" space e\nroot ::= "{" space c-kv "," space e-kv space "}"\n',
        ['{"c":"foo","e":["foo"]}', '{"c":"foo","e":42}'],
    ),
    (
        "conflicting names (nested objects)",
        {
            "type": "object",
            "properties": {
                "number": {
                    "type": "object",
                    "properties": {
                        "number": {
                            "type": "object",
                            "properties": {"root": {"type": "number"}},
                            "required": ["root"],
                            "additionalProperties": False,
                        }
                    },
                    "required": ["number"],
                    "additionalProperties": False,
                }
            },
            "required": ["number"],
            "additionalProperties": False,
        },
        'number- ::= "{" space number-number-kv space "}"\nnumber-kv ::= "\\"number\\"" space ":" space number-\n'
        'number-number ::= "{" space number-number-root-kv space "}"\n'
        'number-number-kv ::= "\\"number\\"" space ":" space number-number\n'
        'number-number-root-kv ::= "\\"root\\"" space ":" space number\n'
        'root ::= "{" space number-kv space "}"\n' + NUMBER,
        ['{"number":{"number":{"root":1}}}'],
    ),
    (
        "description only (no type) treated as unconstrained",
        {"description": "any value"},
        "root ::= value\n" + CHAR + NUMBER + VALUE,
        ['[{"a":1},null]', "12", '"x"', "true"],
    ),
]
WHITESPACE = [
    " ",
    "  ",
    "\t",
    "\n",
    "\n\n",
    "\n\n\n",
    "\n" + " " * 20,
    "\n\n" + "\t" * 20,
    "\n" + " " * 21,
    " \n",
    "\r\n",
]


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    loaded = Model(
        tm.write_model(tmp_path_factory.mktemp("layout") / "m.gguf", seed=0), ModelOptions(n_ctx=256, n_threads=1)
    )
    yield loaded
    loaded.close()


def language(model, grammar_text):
    grammar = Grammar(model, grammar_text)
    return lambda text: accepts(grammar, text)


def places_outside_strings(text: str) -> list[int]:
    """The indices of `text` (its end included) where whitespace would be between JSON's tokens or
    inside a number or a literal, not in a string."""
    places, in_string, escaped = [], False, False
    for i, c in enumerate(text):
        if not in_string:
            places.append(i)
        if escaped:
            escaped = False
        elif c == "\\":
            escaped = True
        elif c == '"':
            in_string = not in_string
    return places + [len(text)]


@pytest.mark.parametrize("name, schema, expected, texts", CASES, ids=[case[0] for case in CASES])
def test_every_layout_is_taken_exactly_where_llama_server_takes_it(model, name, schema, expected, texts):
    ours, theirs = language(model, schema_grammar(schema)), language(model, expected + SPACE)
    taken = 0
    for text in texts:
        assert ours(text) == theirs(text), text
        for i in places_outside_strings(text):
            for space in WHITESPACE:
                laid_out = text[:i] + space + text[i:]
                assert ours(laid_out) == theirs(laid_out), repr(laid_out)
                taken += ours(laid_out)
        if theirs(text):  # indented as json.dumps indents (a literal of an enum's stays as written)
            pretty = json.dumps(json.loads(text), indent=2)
            assert ours(pretty) == theirs(pretty), pretty
    assert taken  # not vacuous: some layouts are in the language


def test_pretty_printed_json_as_llama_server_takes_it(model):
    schema = {
        "type": "object",
        "properties": {
            "a": {"type": "integer"},
            "xs": {"type": "array", "items": {"type": "object", "properties": {"k": {"const": "v"}}}},
            "t": {"enum": ["x", "y"]},
        },
        "required": ["a", "xs"],
        "additionalProperties": {"type": "boolean"},
    }
    takes = language(model, schema_grammar(schema))
    assert takes('{\n  "a": 1,\n  "xs": []\n}') and takes(
        '{\n\t"a": 1,\n\t"xs": [\n\t\t{\n\t\t\t"k": "v"\n\t\t}\n\t]\n}'
    )
    assert takes('{"a" : 1, "xs": [], "t": "y", "z": true}')  # a declared key may have space before its colon
    assert takes('{"a": 1,\n\n' + " " * 20 + '"xs": [ ]\n}') and takes('{"a": 1, "xs": [{ }]}')
    assert takes('{"a": 1, "xs": [],\r\n"t": "x"}') is False  # no carriage return
    assert not takes('{"a": 1,\n\n\n"xs": []}')  # three new lines
    assert not takes('{"a": 1,\n' + " " * 21 + '"xs": []}')  # 21 spaces
    assert not takes('{"a": 1, "xs": [], "z" : true}')  # an additional key's colon follows it at once
    assert not takes('{"a": 1 , "xs": []}') and not takes('{"a": 1, "xs": [1 ]}')  # nothing after a value...
    assert takes('{"a": 1, "xs": [] }') and not takes('{"a": 1, "xs": []} ')  # ...but before a bracket; none after
    assert not takes(' {"a": 1, "xs": []}') and not takes('{"a": 1, "xs": []}\n')


def test_the_thinking_answer_may_begin_after_any_whitespace(model):
    """The answer after a think block's marker (after_whitespace) takes any whitespace first, then
    the JSON in llama-server's layouts."""
    from specllm.llama.grammar import after_whitespace

    text, root = after_whitespace(schema_grammar({"type": "object", "properties": {"a": {"type": "integer"}}}))
    grammar = Grammar(model, text, root=root)
    assert accepts(grammar, '\n\n\n  {\n  "a": 1\n}') and not accepts(grammar, '\n{"a": 1}\n')


# llama.cpp's test's patterns: (name, pattern, the grammar it expects, strings as JSON texts)
PATTERNS = [
    (
        "simple regexp",
        "^abc?d*efg+(hij)?kl$",
        '"ab" "c"? "d"* "ef" "g"+ ("hij")? "kl"',
        ["abefgkl", "abcddefggghijkl", "abefkl"],
    ),
    ("regexp escapes", "^\\[\\]\\{\\}\\(\\)\\|\\+\\*\\?$", '"[]{}()|+*?"', ["[]{}()|+*?", "[]"]),
    ("regexp quote", '^"$', '"\\""', ['"', '\\"', ""]),  # llama.cpp's takes the quote unescaped
    ("regexp with top-level alternation", "^A|B|C|D$", '"A" | "B" | "C" | "D"', ["A", "D", "AB", ""]),
    (
        "regexp",
        "^(\\([0-9]{1,3}\\))?[0-9]{3}-[0-9]{4} a{3,5}nd...$",
        '("(" root-1{1,3} ")")? root-1{3,3} "-" root-1{4,4} " " "a"{3,5} "nd" dot dot dot',
        ["(12)345-6789 aaaand!!!", "345-6789 aaand...", "(1234)345-6789 aaand...", "345-6789 aand..."],
    ),
    ("regexp with non-capturing group", "^(?:foo|bar)baz$", '("foo" | "bar") "baz"', ["foobaz", "barbaz", "baz"]),
    ("regexp with nested non-capturing groups", "^(?:(?:ab)+c)?d$", '(("ab")+ "c")? "d"', ["d", "ababcd", "cd"]),
    ("regexp with escaped hyphen in a character class", "^[a-z\\-]+$", "[a-z\\-]+", ["a-b", "-", "A"]),
    ("regexp with escaped hyphen outside a character class", "^a\\-b$", '"a\\-b"', ["a-b", "ab"]),
]
PATTERN_RULES = "dot ::= [^\\x0A\\x0D]\nroot-1 ::= [0-9]\n"


@pytest.mark.parametrize("name, pattern, expected, texts", PATTERNS, ids=[p[0] for p in PATTERNS])
def test_a_pattern_is_read_as_llama_cpp_reads_it(model, name, pattern, expected, texts):
    ours = language(model, schema_grammar({"type": "string", "pattern": pattern}))
    theirs = language(model, f'root ::= "\\"" ({expected}) "\\""\n{PATTERN_RULES}{SPACE}')
    assert [ours(f'"{t}"') for t in texts] == [theirs(f'"{t}"') for t in texts]
    assert ours(f'"{texts[0]}"')


@pytest.mark.parametrize(
    "pattern, why",
    [
        ("[0-9]+", "not anchored with '^' and '$'"),
        ("^[0-9]{3}\\w$", "unsupported escape: \\w"),
        ("^\\d+$", "unsupported escape: \\d"),
        ("^(?=a)a$", "unsupported group syntax"),
        ("^a$b$", "anchor inside the pattern"),
        ("^a]$", "unsupported character: ]"),
        ("^a{x}$", "invalid number in curly brackets"),
        ("^a{1,2,3}$", "wrong number of values in curly brackets"),
        ("^[\\w]$", "unsupported escape in character class: \\w"),
        ("^" + "(" * 101 + "a" + ")" * 101 + "$", "pattern nesting too deep"),
    ],
)
def test_a_pattern_without_a_grammar_is_any_string_with_a_warning(model, capfd, pattern, why):
    schema = {"type": "object", "properties": {"a": {"type": "string", "pattern": pattern}}, "required": ["a"]}
    grammar = schema_grammar(schema)
    assert (
        f"the JSON schema's /properties/a/pattern {pattern} is not supported ({why}): any string is accepted"
        in capfd.readouterr().err
    )
    assert "a-1" not in grammar and "dot" not in grammar  # the rules of the part read are left out
    takes = language(model, grammar)
    assert takes('{"a": "anything \\n at all"}') and takes('{"a": ""}') and not takes('{"a": 1}')


@pytest.mark.parametrize(
    "pattern, why",
    [
        ("^(a$", "unbalanced parentheses"),
        ("^a)$", "unbalanced parentheses"),
        ("^[a-z$", "unterminated character class"),
        ("^*a$", "nothing to repeat"),
        ("^{2}$", "nothing to repeat"),
        ("^a\\$", "trailing backslash"),
    ],
)
def test_a_pattern_that_is_no_regular_expression_is_one_line(pattern, why):
    with pytest.raises(GrammarInvalid) as caught:
        schema_grammar({"type": "string", "pattern": pattern})
    assert str(caught.value) == f"the JSON schema's /pattern {pattern} is invalid: {why}"

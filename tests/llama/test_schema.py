"""JSON schemas turned into grammars with what llama-server's converter reads besides
llama-cpp-python's: each keyword's language checked string by string through llama.cpp's own
grammar sampler, and the integer bounds' GBNF against llama.cpp's own test cases."""

import re
from decimal import Decimal

import pytest
import tiny_models as tm
from grammar_reference import accepts

from specllm.errors import GrammarInvalid
from specllm.llama.grammar import Grammar, schema_grammar
from specllm.llama.model import Model
from specllm.llama.options import ModelOptions
from specllm.llama.schema import integer_range

NO = None
# llama.cpp's tests/test-json-schema-to-grammar.cpp: (minimum, maximum) and the root rule it expects
LLAMA_CPP_CASES = [
    ((0, NO), "[0] | [1-9] [0-9]{0,15}"),
    ((1, NO), "[1-9] [0-9]{0,15}"),
    ((3, NO), "[1-2] [0-9]{1,15} | [3-9] [0-9]{0,15}"),
    ((9, NO), "[1-8] [0-9]{1,15} | [9] [0-9]{0,15}"),
    ((10, NO), "[1] ([0-9]{1,15}) | [2-9] [0-9]{1,15}"),
    ((25, NO), "[1] [0-9]{2,15} | [2] ([0-4] [0-9]{1,14} | [5-9] [0-9]{0,14}) | [3-9] [0-9]{1,15}"),
    ((NO, 30), '"-" [1-9] [0-9]{0,15} | [0-9] | ([1-2] [0-9] | [3] "0")'),
    ((-5, NO), '"-" ([0-5]) | [0] | [1-9] [0-9]{0,15}'),
    (
        (-123, NO),
        '"-" ([0-9] | ([1-8] [0-9] | [9] [0-9]) | "1" ([0-1] [0-9] | [2] [0-3])) | [0] | [1-9] [0-9]{0,15}',
    ),
    # llama.cpp writes [0-4] [0-9]{1,15} first: "-04" (a leading zero, and -4 > -5) would pass
    ((NO, -5), '"-" ([1-4] [0-9]{1,15} | [5-9] [0-9]{0,15})'),
    ((NO, 1), '"-" [1-9] [0-9]{0,15} | [0-1]'),
    ((NO, 100), '"-" [1-9] [0-9]{0,15} | [0-9] | ([1-8] [0-9] | [9] [0-9]) | "100"'),
    ((0, 23), "[0-9] | ([1] [0-9] | [2] [0-3])"),
    ((15, 300), '([1] ([5-9]) | [2-9] [0-9]) | ([1-2] [0-9]{2} | [3] "00")'),
    ((5, 30), '[5-9] | ([1-2] [0-9] | [3] "0")'),
    (
        (-123, 42),
        '"-" ([0-9] | ([1-8] [0-9] | [9] [0-9]) | "1" ([0-1] [0-9] | [2] [0-3])) | [0-9] | ([1-3] [0-9] | [4] [0-2])',
    ),
    ((-10, 10), '"-" ([0-9] | "10") | [0-9] | "10"'),
    ((-12, 207), '"-" ([0-9] | "1" [0-2]) | [0-9] | ([1-8] [0-9] | [9] [0-9]) | ([1] [0-9]{2} | [2] "0" [0-7])'),
    ((12, 207), '([1] ([2-9]) | [2-9] [0-9]) | ([1] [0-9]{2} | [2] "0" [0-7])'),
]
# every integer from -120 to 120, large ones, and what is not a JSON integer
CANDIDATES = [str(i) for i in range(-120, 121)] + [
    *("999", "-999", "1000", "-1000", "4096", "123456", "-123456", "1" * 16, "-" + "9" * 16, "1" * 17),
    *("-0", "00", "01", "007", "-00", "-01", "-04", "-007", "+5", "5.0", "1e2", "", "-", " 5", "5 5"),
]
JSON_INTEGER = re.compile(r"-?(0|[1-9][0-9]{0,15})")  # at most 16 digits, as llama.cpp's integers
JSON_NUMBER = re.compile(r"-?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][-+]?[0-9]+)?")


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    loaded = Model(
        tm.write_model(tmp_path_factory.mktemp("schema") / "m.gguf", seed=0), ModelOptions(n_ctx=256, n_threads=1)
    )
    yield loaded
    loaded.close()


def language(model, schema):
    """`accepts` for a schema's grammar: text -> whether the grammar takes it."""
    grammar = Grammar(model, schema_grammar(schema))
    return lambda text: accepts(grammar, text)


@pytest.mark.parametrize("bounds, expected", LLAMA_CPP_CASES, ids=[str(b) for b, _ in LLAMA_CPP_CASES])
def test_integer_bounds_are_written_as_llama_cpp_writes_them(bounds, expected):
    low, high = bounds
    schema = {"type": "integer"}
    if low is not None:
        schema["minimum"] = low
    if high is not None:
        schema["maximum"] = high
    assert f"root ::= ({expected})" in schema_grammar(schema).splitlines()  # llama.cpp's line, whitespace too
    assert integer_range(-(2**63) if low is None else low, 2**63 - 1 if high is None else high) == expected


BOUNDED = [
    ({"minimum": 1, "maximum": 5}, 1, 5),
    ({"minimum": 0, "maximum": 0}, 0, 0),
    ({"exclusiveMinimum": 1, "exclusiveMaximum": 5}, 2, 4),
    ({"minimum": -7, "exclusiveMaximum": -2}, -7, -3),
    ({"exclusiveMinimum": -100, "maximum": 99}, -99, 99),
    ({"minimum": -115, "maximum": -13}, -115, -13),
    ({"minimum": 17}, 17, None),
    ({"exclusiveMinimum": -18}, -17, None),
    ({"maximum": -5}, None, -5),
    ({"exclusiveMaximum": 0}, None, -1),
    ({"maximum": 0}, None, 0),
    ({"exclusiveMaximum": 101}, None, 100),
    ({"minimum": 1.5, "maximum": 9.9}, 2, 9),  # a fractional bound rounded inwards
    ({"exclusiveMinimum": 2.5, "exclusiveMaximum": 7.2}, 3, 7),
    ({"minimum": 3, "exclusiveMinimum": 50, "maximum": 60, "exclusiveMaximum": 4}, 3, 60),  # inclusive first
    ({"minimum": 99, "maximum": 1000}, 99, 1000),
    ({"minimum": 1000, "maximum": 4096}, 1000, 4096),
    ({"minimum": -1000, "maximum": -999}, -1000, -999),
]


@pytest.mark.parametrize("bounds, low, high", BOUNDED, ids=[str(b) for b, _, _ in BOUNDED])
def test_a_bounded_integer_takes_exactly_the_integers_in_range(model, bounds, low, high):
    takes = language(model, {"type": "integer", **bounds})
    for text in CANDIDATES:
        in_range = JSON_INTEGER.fullmatch(text) is not None
        in_range = in_range and (low is None or int(text) >= low) and (high is None or int(text) <= high)
        if text == "-0":  # llama.cpp takes "-0" where 0 is in range with negative numbers; 0 either way
            assert not takes(text) or in_range, text
        else:
            assert takes(text) == in_range, (text, takes(text))
    bound = str(high if low is None else low)
    assert takes(bound) and not takes(bound + " ")  # as in llama.cpp, no whitespace after a value


def test_bounds_reach_integers_in_objects_arrays_and_type_lists(model):
    schema = {
        "type": "object",
        "properties": {
            "n": {"type": ["integer", "null"], "minimum": 1, "maximum": 3},
            "xs": {"type": "array", "items": {"type": "integer", "exclusiveMinimum": -3, "maximum": 2}},
        },
        "required": ["n", "xs"],
        "additionalProperties": False,
    }
    takes = language(model, schema)
    assert takes('{"n": 3, "xs": [-2, 0, 2]}') and takes('{"n": null, "xs": []}')
    assert not takes('{"n": 4, "xs": []}') and not takes('{"n": 0, "xs": []}')
    assert not takes('{"n": 1, "xs": [-3]}') and not takes('{"n": 1, "xs": [3]}')


@pytest.mark.parametrize(
    "schema, message",
    [
        (
            {"type": "integer", "minimum": 5, "maximum": 4},
            "the JSON schema's integer bounds at the root admit no integer: 5 > 4",
        ),
        (
            {"type": "integer", "exclusiveMinimum": 1, "exclusiveMaximum": 2},
            "the JSON schema's integer bounds at the root admit no integer: 2 > 1",
        ),
        ({"type": "integer", "minimum": "1"}, 'the JSON schema\'s /minimum must be a number, not "1"'),
        ({"type": "integer", "maximum": True}, "the JSON schema's /maximum must be a number, not true"),
        ({"type": "integer", "minimum": 10**20, "maximum": 10**21}, "the JSON schema's integer lower bound 10"),
        (
            {"type": "integer", "minimum": 2**62},
            "the JSON schema's integer lower bound 4611686018427387904 at the root leaves no",
        ),
        (
            {"type": "integer", "exclusiveMaximum": -(10**16)},
            "the JSON schema's integer upper bound -10000000000000001",
        ),
    ],
)
def test_bad_bounds_are_one_line(schema, message):
    with pytest.raises(GrammarInvalid) as caught:
        schema_grammar(schema)
    assert str(caught.value).startswith(message) and "\n" not in str(caught.value)


def test_a_bound_alone_of_16_digits_keeps_integers_within_16_digits(model):
    """llama.cpp writes a minimum alone from 2 * 10**15 on (a maximum alone from -2 * 10**15 down)
    with a repetition whose maximum is below its minimum ({16,15}), which its parser took as
    endless: the process ran out of memory. Its integers have at most 16 digits: so here."""
    takes = language(model, {"type": "integer", "minimum": 2 * 10**15})
    assert takes("2000000000000000") and takes("9999999999999999")
    assert not takes("1999999999999999") and not takes("10000000000000000")
    takes = language(model, {"type": "integer", "exclusiveMaximum": -(10**15)})
    assert takes("-1000000000000001") and takes("-9999999999999999")
    assert not takes("-1000000000000000") and not takes("-10000000000000000")


def test_bounds_at_or_past_a_64_bit_integers_are_none(model):
    """As llama.cpp's int64 bounds of no bound: OpenAPI's int64 schemas (and pydantic's `lt=10**20`)
    were refused as past a 64-bit integer's range."""
    for bounds in ({"minimum": -(2**63), "maximum": 2**63 - 1}, {"maximum": 2**64 - 1}, {"exclusiveMinimum": -1e300}):
        takes = language(model, {"type": "integer", **bounds})
        assert takes("0") and takes("-9999999999999999") and takes("9999999999999999") and not takes("1.5"), bounds
    takes = language(model, {"type": "integer", "minimum": 0, "exclusiveMaximum": 10**20})
    assert takes("0") and takes("9999999999999999") and not takes("-1")


def test_a_schema_that_says_nothing_is_any_value(model):
    for schema in ({"type": "object", "properties": {"v": {}}}, {"properties": {"v": {"description": "anything"}}}):
        takes = language(model, schema | {"required": ["v"]})
        for value in ('"x"', "1", "[1, {}]", "null", "true", '{"a": 2}'):
            assert takes(f'{{"v": {value}}}'), (schema, value)
    takes = language(model, {"type": "object", "properties": {"a": {"type": "integer"}}, "additionalProperties": True})
    assert takes('{"a": 1, "b": "x"}') and takes('{"b": [1]}') and not takes('{"a": "x"}')


def test_array_counts_without_items_and_items_of_any_value(model):
    takes = language(model, {"type": "array", "minItems": 2, "maxItems": 3})
    assert [takes(t) for t in ("[1]", '[1, "a"]', "[1, 2, null]", "[1, 2, 3, 4]")] == [False, True, True, False]
    takes = language(model, {"type": "array", "items": {}, "maxItems": 1})
    assert takes("[]") and takes('["a"]') and not takes("[1, 2]")
    assert language(model, {"minItems": 2})("3")  # without a type, only items make an array


def test_string_keywords_without_a_type(model):
    takes = language(model, {"maxLength": 2})
    assert takes('"ab"') and not takes('"abc"') and not takes("1")
    takes = language(model, {"format": "date"})
    assert takes('"2024-02-29"') and not takes('"2024-13-01"')


def test_string_characters_as_llama_cpp_takes_them(model):
    takes = language(model, {"type": "string"})
    assert takes('"a\\"b\\\\c\\n\\u00e9"') and takes('"é"')
    assert not takes('"a\tb"') and not takes('"\x7f"') and not takes('"a\\/b"')


def test_backslashes_and_quotes_in_values_and_names(model):
    value = 'say "hi" \\ bye'
    takes = language(model, {"type": "object", "properties": {'k"\\': {"const": value}}, "required": ['k"\\']})
    assert takes('{"k\\"\\\\": "say \\"hi\\" \\\\ bye"}')
    assert not takes('{"k\\"\\\\": "say \\"hi\\" \\ bye"}')
    takes = language(model, {"enum": ["a\\b", 'q"']})
    assert takes('"a\\\\b"') and takes('"q\\""') and not takes('"a\\b"')


def test_a_const_or_enum_value_is_its_text_as_it_is(model):
    """As llama.cpp writes it: "été" as a model writes it, not escaped to ASCII (\\u00e9)."""
    takes = language(model, {"enum": ["été", "北京", "😀", "a\u0001"]})
    assert takes('"été"') and takes('"北京"') and takes('"😀"') and takes('"a\\u0001"')
    assert not takes('"\\u00e9t\\u00e9"') and not takes('"a\u0001"')
    takes = language(model, {"type": "object", "properties": {"c": {"const": {"v": ["ñ"]}}}, "required": ["c"]})
    assert takes('{"c": {"v": ["ñ"]}}')


def test_an_additional_propertys_key_is_none_of_the_declared_ones(model):
    props = {
        "ab": {"type": "integer"},
        "a": {"type": "integer"},
        "b-]^": {"type": "integer"},
        "xy": {"type": "boolean"},
    }
    takes = language(model, {"type": "object", "properties": props, "additionalProperties": {"type": "string"}})
    assert takes('{"ab": 1, "a": 2, "c": "x", "abc": "y"}') and takes('{"": "z", "c": "w", "bb": "v"}')
    for key in ("ab", "a", "b-]^", "xy"):
        assert not takes(f'{{"{key}": "s"}}'), key
    # as in llama.cpp, a key that begins a declared one and ends early is refused too
    assert not takes('{"x": "s"}')


def test_additional_properties_after_an_optional_one_take_their_comma(model):
    takes = language(model, {"type": "object", "properties": {"p": {"type": "integer"}}, "additionalProperties": True})
    assert takes('{"p": 1, "q": 2, "r": 3}') and takes('{"q": 2}') and not takes('{"p": 1 "q": 2}')


def test_a_root_ref_into_recursive_defs(model):
    """pydantic's schema of a recursive root model: llama-cpp-python could not resolve it."""
    node = {
        "type": "object",
        "properties": {
            "v": {"type": "integer", "minimum": 0, "maximum": 9},
            "next": {"anyOf": [{"$ref": "#/$defs/Node"}, {"type": "null"}]},
        },
        "required": ["v", "next"],
    }
    takes = language(model, {"$defs": {"Node": node}, "$ref": "#/$defs/Node"})
    assert takes('{"v": 3, "next": {"v": 9, "next": null}}') and not takes('{"v": 3, "next": {"v": 10, "next": null}}')


def test_a_property_key_past_ascii_is_its_text(model):
    """As llama.cpp writes a key: "名前" as a model writes it (llama-cpp-python's grammar wanted
    "\\u540d\\u524d", and only that); its text only, as llama.cpp's literal takes no escape."""
    schema = {"type": "object", "properties": {"名前": {"type": "string"}, "größe": {"type": "integer"}}}
    takes = language(model, schema | {"required": ["名前", "größe"]})
    assert takes('{"名前": "x", "größe": 1}')
    assert not takes('{"\\u540d\\u524d": "x", "gr\\u00f6\\u00dfe": 1}') and not takes(
        '{"名前": "x", "gr\\u00f6\\u00dfe": 1}'
    )
    # an additional property's key is none of the declared ones, these included
    takes = language(model, schema | {"additionalProperties": {"type": "string"}})
    assert takes('{"名前": "x", "größe": 2, "前": "y", "große": "z", "名前x": "w"}')
    assert not takes('{"größe": "z"}') and not takes('{"名前": 1}')


def test_a_property_whose_key_is_empty_is_the_objects(model):
    """A root property's key "" names its value's rule as the root is named (none): in llama.cpp's
    converter the value then takes the root's rule, the grammar was that value's (`1`, not
    `{"": 1}`); and an additional key beside "" alone was "" only (llama.cpp's `( )`)."""
    value = {"type": "integer"}
    takes = language(model, {"type": "object", "properties": {"": value}, "required": [""]})
    assert takes('{"": 1}') and not takes("1")
    takes = language(model, {"type": "object", "properties": {"": value}, "additionalProperties": {"type": "string"}})
    assert takes('{"": 1, "a": "x"}') and takes('{"a": "x"}') and takes("{}")
    assert not takes('{"": "x"}') and not takes('{"": 1, "": "x"}') and not takes("1")
    nested = {"type": "object", "properties": {"o": {"type": "object", "properties": {"": value}, "required": [""]}}}
    takes = language(model, nested | {"required": ["o"]})
    assert takes('{"o": {"": 1}}') and not takes('{"o": 1}')


@pytest.mark.parametrize(
    "schema, message",
    [
        ({"type": []}, "the JSON schema's /type is an empty list: it must name a type"),
        ({"enum": []}, "the JSON schema's /enum must be a non-empty list of values, not []"),
        ({"enum": "abc"}, 'the JSON schema\'s /enum must be a non-empty list of values, not "abc"'),
        ({"properties": {"a": {"enum": []}}}, "the JSON schema's /properties/a/enum must be a non-empty list"),
        ({"anyOf": []}, "the JSON schema's /anyOf must be a non-empty list of schemas, not []"),
        (
            {"properties": {"a": {"oneOf": {}}}},
            "the JSON schema's /properties/a/oneOf must be a non-empty list of schemas, not {}",
        ),
        ({"allOf": []}, "the JSON schema's /allOf must be a non-empty list of schemas, not []"),
    ],
)
def test_an_empty_type_enum_or_list_of_schemas_is_one_line(schema, message):
    """llama.cpp refuses them too; the grammar was an empty rule that did not parse ("expecting newline")."""
    with pytest.raises(GrammarInvalid) as caught:
        schema_grammar(schema)
    assert str(caught.value).startswith(message) and "\n" not in str(caught.value)


def test_a_pattern_whose_count_is_reversed_is_refused():
    """No regular expression takes {3,2}; llama.cpp writes it into its grammar, whose parser then
    takes it as endless. The schema is refused as one whose pattern is invalid."""
    for pattern in ("^a{3,2}$", "^(ab){5,1}x$", "^[xy]{2,0}$"):
        with pytest.raises(GrammarInvalid) as caught:
            schema_grammar({"type": "string", "pattern": pattern})
        count = re.search(r"\{\d,\d\}", pattern)[0]
        assert str(caught.value) == (
            f"the JSON schema's /pattern {pattern} is invalid: the count {count} has its maximum below its minimum"
        )


def test_counts_of_items_or_characters_that_admit_nothing_are_one_line():
    """llama.cpp writes them as a repetition {m,n} with n < m, which its parser takes as endless;
    llama-cpp-python's grammar took exactly minItems items."""
    for schema, message in (
        (
            {"type": "array", "items": {"type": "integer"}, "minItems": 3, "maxItems": 2},
            "/minItems 3 is above its maxItems 2",
        ),
        ({"type": "string", "minLength": 5, "maxLength": 4}, "/minLength 5 is above its maxLength 4"),
        ({"properties": {"s": {"maxLength": 0, "minLength": 1}}}, "/properties/s/minLength 1 is above its maxLength 0"),
    ):
        with pytest.raises(GrammarInvalid) as caught:
            schema_grammar(schema)
        assert str(caught.value) == f"the JSON schema's {message}: no value has both"


def test_refs_are_json_pointers(model):
    """`~1` is a `/`, `~0` a `~`, percent-encoding is decoded (RFC 6901), a list's item is its index
    (zod's refs to where a schema was first seen); llama-cpp-python looked the parts up as written."""
    schema = {
        "$defs": {"a/b": {"type": "integer"}, "c~d": {"type": "boolean"}, "e f": {"const": "ef"}, "g~1h": {"const": 7}},
        "type": "object",
        "properties": {
            "x": {"$ref": "#/$defs/a~1b"},
            "y": {"$ref": "#/$defs/c~0d"},
            "z": {"$ref": "#/$defs/e%20f"},
            "w": {"$ref": "#/$defs/g~1h"},  # a part that names a key as written, as llama.cpp reads it
            "u": {"anyOf": [{"type": "null"}, {"type": "string", "maxLength": 1}]},
            "v": {"$ref": "#/properties/u/anyOf/1"},
        },
        "required": ["x", "y", "z", "w", "u", "v"],
    }
    takes = language(model, schema)
    assert takes('{"x": 1, "y": true, "z": "ef", "w": 7, "u": null, "v": "q"}')
    assert not takes('{"x": true, "y": true, "z": "ef", "w": 7, "u": null, "v": "q"}')
    assert not takes('{"x": 1, "y": 1, "z": "ef", "w": 7, "u": null, "v": "q"}')
    assert not takes('{"x": 1, "y": true, "z": "ef", "w": 7, "u": null, "v": null}')
    assert not takes('{"x": 1, "y": true, "z": "ef", "w": 7, "u": null, "v": "qq"}')
    with pytest.raises(GrammarInvalid) as caught:
        schema_grammar({"$defs": {}, "properties": {"p": {"$ref": "#/$defs/a~1b"}}})
    assert str(caught.value) == 'the JSON schema\'s /properties/p/$ref #/$defs/a~1b points at nothing in it: no "a/b"'


def test_a_ref_is_its_definition_whatever_its_name(model):
    """llama-cpp-python named a $ref's rule by its last part and took any rule of that name for it:
    `#/$defs/integer` was an integer, and two definitions of one last name were the first."""
    schema = {
        "$defs": {
            "integer": {"type": "string"},
            "A": {"type": "object", "properties": {"v": {"type": "object", "properties": {"n": {"type": "integer"}}}}},
            "B": {"type": "object", "properties": {"v": {"type": "object", "properties": {"s": {"type": "string"}}}}},
        },
        "type": "object",
        "properties": {
            "i": {"$ref": "#/$defs/integer"},
            "a": {"$ref": "#/$defs/A/properties/v"},
            "b": {"$ref": "#/$defs/B/properties/v"},
        },
        "required": ["i", "a", "b"],
    }
    takes = language(model, schema)
    assert takes('{"i": "x", "a": {"n": 1}, "b": {"s": "y"}}')
    assert not takes('{"i": 1, "a": {"n": 1}, "b": {"s": "y"}}') and not takes(
        '{"i": "x", "a": {"n": 1}, "b": {"n": 1}}'
    )


@pytest.mark.parametrize(
    "schema, message",
    [
        ({"properties": {"x": True}}, "the JSON schema has true at /properties/x, where a schema is expected"),
        (
            {"properties": {"o": {"properties": {"x": False}}}},
            "the JSON schema has false at /properties/o/properties/x, where a schema is expected",
        ),
        ({"type": "array", "items": True}, "the JSON schema has true at /items, where a schema is expected"),
        ({"type": "array", "items": False}, "the JSON schema's /items is false"),
        ({"anyOf": [{"type": "null"}, True]}, "the JSON schema has true at /anyOf/1, where a schema is expected"),
        ({"allOf": [False]}, "the JSON schema has false at /allOf/0, where a schema is expected"),
        (
            {"$defs": {"A": True}, "properties": {"a": {"$ref": "#/$defs/A"}}},
            "the JSON schema has true at /$defs/A, where a schema",
        ),
        ({"properties": {"x": "string"}}, 'the JSON schema has "string" at /properties/x, where a schema is expected'),
    ],
)
def test_a_boolean_schema_is_one_line(schema, message):
    """llama.cpp refuses `true` or `false` where a schema is expected (but as additionalProperties);
    here it was a Python error ("'bool' object has no attribute 'get'")."""
    with pytest.raises(GrammarInvalid) as caught:
        schema_grammar(schema)
    assert str(caught.value).startswith(message) and "\n" not in str(caught.value)


def test_booleans_where_they_are_read(model):
    """`additionalProperties` true, false or a schema, and `items: false` closing a tuple."""
    props = {"a": {"type": "integer"}}
    takes = language(model, {"properties": props, "additionalProperties": False})
    assert takes('{"a": 1}') and not takes('{"a": 1, "b": 2}')
    takes = language(
        model, {"properties": props, "additionalProperties": {"anyOf": [{"type": "string"}, {"type": "null"}]}}
    )
    assert takes('{"a": 1, "b": "x", "c": null}') and not takes('{"a": 1, "b": 2}') and not takes('{"a": "x"}')
    takes = language(model, {"type": "array", "prefixItems": [{"type": "integer"}, {"type": "string"}], "items": False})
    assert takes('[1, "x"]') and not takes('[1, "x", 2]') and not takes("[1]")


def test_an_all_of_of_enums_and_consts_is_their_intersection(model):
    """As llama.cpp intersects an allOf's enums (its consts too here, and a $ref to one: pydantic
    wraps a described enum field in an allOf); the parts' types filter the values. It was an
    empty object."""
    takes = language(model, {"allOf": [{"enum": ["a", "b", 1]}, {"enum": ["b", "c", 1.0]}]})
    assert takes('"b"') and takes("1") and not takes('"a"') and not takes('"c"') and not takes("{}")
    takes = language(model, {"type": "string", "allOf": [{"enum": ["a", "b", 1]}, {"const": "b"}]})
    assert takes('"b"') and not takes("1") and not takes('"a"')
    schema = {
        "$defs": {"Color": {"enum": ["red", "green", "blue"]}},
        "type": "object",
        "properties": {"c": {"allOf": [{"$ref": "#/$defs/Color"}], "description": "a colour"}},
        "required": ["c"],
    }
    takes = language(model, schema)
    assert takes('{"c": "green"}') and not takes('{"c": "pink"}') and not takes('{"c": {}}')
    takes = language(model, {"allOf": [{"anyOf": [{"const": 1}, {"const": 2}]}, {"enum": [2, 3]}, {"type": "integer"}]})
    assert takes("2") and not takes("1") and not takes("3")


@pytest.mark.parametrize(
    "schema, message",
    [
        ({"allOf": [{"enum": ["a"]}, {"const": "b"}]}, "the JSON schema's /allOf admits no value"),
        ({"properties": {"x": {"type": "string", "allOf": [{"enum": [1, 2]}]}}}, "the JSON schema's /properties/x/allOf admits no value"),  # noqa: E501
        ({"allOf": [{"enum": [1, "1"]}, {"type": "boolean"}]}, "the JSON schema's /allOf admits no value"),
    ],
)  # fmt: skip
def test_an_all_of_whose_values_have_nothing_in_common_is_one_line(schema, message):
    """llama.cpp took an empty object for it."""
    with pytest.raises(GrammarInvalid) as caught:
        schema_grammar(schema)
    assert str(caught.value).startswith(message) and "\n" not in str(caught.value)


# numbers without an exponent around the bounds below, and what is no JSON number or has one
NUMBERS = sorted(
    {f"{sign}{i}{frac}" for sign in ("", "-") for i in range(4) for frac in ("", ".0", ".00")}
    | {f"{sign}{i}.{d:0{n}d}" for sign in ("", "-") for i in range(3) for n in (1, 2, 3) for d in range(0, 10**n, 7)}
    | {
        f"{sign}{i}.{d}"
        for sign in ("", "-")
        for i in range(3)
        for d in ("5", "25", "249", "2500000001", "0" * 15 + "1")
    }
    | {
        f"{sign}{i}.{d}"
        for sign in ("", "-")
        for i in range(3)
        for d in ("75", "7499", "0000000000000001", "74" + "9" * 14)
    }
    | {"12345678901234567", "-0", "-0.0", "00", "01.5", "1.", ".5", "+1", "1e0", "5e-1", "-1E2", "0.5e1", "1.5.2", ""}
)
NUMBER_BOUNDS = [
    {"minimum": 0},
    {"exclusiveMinimum": 0},
    {"minimum": 0, "maximum": 1},
    {"minimum": 0.25, "maximum": 2.5},
    {"minimum": 1.05, "maximum": 1.25},
    {"exclusiveMinimum": -1.5, "exclusiveMaximum": 0.75},
    {"minimum": -2, "exclusiveMaximum": 0},
    {"maximum": -0.5},
    {"exclusiveMaximum": 2.0000000000000001},  # 2.0 as a float: at most 2
    {"minimum": 1, "exclusiveMinimum": 1},  # the tighter of the two
    {"minimum": 0.1, "maximum": 0.1},
    {"minimum": -1e300, "maximum": 1e300},  # beyond 16 digits: none
]


def in_range(text: str, bounds: dict) -> bool:
    value = Decimal(text)
    return all(
        {"minimum": value >= bound, "exclusiveMinimum": value > bound, "maximum": value <= bound}.get(
            key, value < bound
        )
        for key, bound in ((key, Decimal(repr(b)) if isinstance(b, float) else Decimal(b)) for key, b in bounds.items())
    )


@pytest.mark.parametrize("bounds", NUMBER_BOUNDS, ids=[str(b) for b in NUMBER_BOUNDS])
def test_a_bounded_number_takes_only_numbers_in_range(model, bounds):
    """Every text the grammar takes is a JSON number in range, and every one in range without an
    exponent is taken (a minimum of 0 or more without a minus sign: not `-0`). llama.cpp leaves a
    number's bounds out."""
    takes = language(model, {"type": "number", **bounds})
    for text in NUMBERS:
        number = JSON_NUMBER.fullmatch(text) is not None
        if takes(text):
            assert number and in_range(text, bounds) and "e" not in text.lower(), text
        elif number and "e" not in text.lower():
            too_long = len(text.lstrip("-").split(".")[0]) > 16
            unsigned = any(bounds.get(key, -1) >= 0 for key in ("minimum", "exclusiveMinimum"))
            minus_zero = text.startswith("-") and Decimal(text) == 0 and unsigned
            assert not in_range(text, bounds) or too_long or minus_zero, text


def test_number_bounds_reach_properties_and_type_lists(model):
    schema = {
        "properties": {"p": {"type": ["number", "null"], "minimum": 0, "maximum": 1}},
        "required": ["p"],
    }
    takes = language(model, schema)
    assert takes('{"p": 0.5}') and takes('{"p": null}') and takes('{"p": 1.0}')
    assert not takes('{"p": 1.5}') and not takes('{"p": -0.5}')


@pytest.mark.parametrize(
    "schema, message",
    [
        ({"type": "number", "minimum": 1.5, "maximum": 1.25}, "the JSON schema's number bounds at the root admit no number"),  # noqa: E501
        ({"properties": {"n": {"type": "number", "minimum": 1, "exclusiveMaximum": 1}}}, "the JSON schema's number bounds at /properties/n admit no number"),  # noqa: E501
        ({"type": "number", "minimum": 1e17}, "the JSON schema's number bounds at the root admit no number of at most 16 integer digits"),  # noqa: E501
        ({"type": "number", "maximum": "1"}, 'the JSON schema\'s /maximum must be a number, not "1"'),
    ],
)  # fmt: skip
def test_bad_number_bounds_are_one_line(schema, message):
    with pytest.raises(GrammarInvalid) as caught:
        schema_grammar(schema)
    assert str(caught.value) == message


@pytest.mark.parametrize(
    "schema, message",
    [
        ({"type": "object", "properties": {"items": {"type": "array", "items": {"type": "strng"}}}}, 'the JSON schema\'s /properties/items/items/type "strng" is no JSON type'),  # noqa: E501
        ({"type": ["string", "text"]}, 'the JSON schema\'s /type/1 "text" is no JSON type'),
        ({"anyOf": [{"type": "null"}, {"type": 3}]}, "the JSON schema's /anyOf/1/type 3 is no JSON type"),
        ({"properties": ["a", "b"]}, 'the JSON schema\'s /properties must be an object of schemas by name, not ["a", "b"]'),  # noqa: E501
        ({"$defs": {"A": {"properties": "x"}}, "$ref": "#/$defs/A"}, 'the JSON schema\'s /$defs/A/properties must be an object'),  # noqa: E501
        ({"properties": {"a/b": {"type": "array", "prefixItems": [{}, {"minLength": 2, "maxLength": 1}]}}}, "the JSON schema's /properties/a~1b/prefixItems/1/minLength 2 is above"),  # noqa: E501
        ({"properties": {"p": {"type": "string", "pattern": "^(a$"}}}, "the JSON schema's /properties/p/pattern ^(a$ is invalid"),  # noqa: E501
        ({"properties": {"p": {"type": "string", "maxLength": 5000}}}, "the JSON schema's /properties/p/maxLength 5000 is past"),  # noqa: E501
        ({"properties": {"p": {"$ref": "https://example.com/s.json"}}}, "the JSON schema's /properties/p/$ref https"),
        ({"additionalProperties": 3}, "the JSON schema has 3 at /additionalProperties, where a schema is expected"),
    ],
)  # fmt: skip
def test_a_refusal_names_where_in_the_schema(schema, message):
    """Each refusal names the offending part by its JSON pointer, not a rule of the grammar; an
    unknown type and a `properties` that is no object in words of their own (they were the
    converter's: "Unrecognized schema: ...", "'list' object has no attribute 'items'")."""
    with pytest.raises(GrammarInvalid) as caught:
        schema_grammar(schema)
    assert str(caught.value).startswith(message) and "\n" not in str(caught.value)


def test_draft_04_exclusive_flags_make_their_bound_exclusive(model):
    """OpenAPI 3.0 and zod-to-json-schema's openApi3 target write draft-04's `exclusiveMinimum:
    true` beside `minimum` (z.number().positive()): the bound is exclusive (a number's was refused
    as "must be a number, not true", an integer's took the bound itself); `false` says nothing."""
    positive = language(model, {"type": "number", "minimum": 0, "exclusiveMinimum": True})
    assert positive("0.5") and positive("0.0001") and not positive("0") and not positive("0.000")
    below = language(model, {"type": "integer", "maximum": 5, "exclusiveMaximum": True, "exclusiveMinimum": False})
    assert below("4") and below("-3") and not below("5")
    at_least = language(model, {"type": "number", "minimum": 1, "exclusiveMinimum": False})
    assert at_least("1") and not at_least("0.5")

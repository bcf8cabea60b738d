"""JSON schemas turned into GBNF as llama-cpp-python converts them, with what llama-server's
converter (llama.cpp's common/json-schema.cpp and json-schema-to-grammar.cpp) reads that
llama-cpp-python's leaves out or reads otherwise:

- an integer's `minimum`, `maximum`, `exclusiveMinimum` and `exclusiveMaximum` (a fractional bound
  rounded inwards), written as llama.cpp's `build_min_max_int` writes them;
- a list of types keeps the schema's other keywords for each type (`{"type": ["integer", "null"],
  "minimum": 1}`), where llama-cpp-python's drops them;
- a schema without a type or structural keyword (`{}`, `{"description": ...}`) is any JSON value,
  as is `additionalProperties: true`'s value (llama-cpp-python: any object, or an error);
- an array's `minItems` / `maxItems` without `items`, a string's `minLength` / `maxLength` or
  `format` without `"type": "string"`;
- a string's characters: no control character unescaped, `\\/` not an escape;
- a `$ref` at the root beside the `$defs` it refers into, with `$ref`s of their own (llama-cpp-python
  fails); a `$ref` as a JSON pointer, through lists too, its rule named by its whole path;
- a property's key past ASCII as its text (llama-cpp-python: `\\u` escapes); a root property's key
  `""` is the object's (llama.cpp's converter named its value's rule as the root's, and took `""`
  alone as an additional key beside it);
- what llama.cpp refuses, refused in one line: an empty `type`, `enum`, `anyOf`, `oneOf` or `allOf`,
  `true` or `false` where a schema is expected (but `additionalProperties`, and `items` closing a
  tuple), and counts whose minimum is above their maximum;
- the backslashes in a `const`, an `enum` value or a property name escaped (llama-cpp-python's
  grammar then does not parse, or means something else);
- a `pattern` as llama.cpp reads it (specllm/llama/patterns.py): `(?:...)` groups, and one it has
  no grammar for (unanchored, `\\d`, ...) any string, with a warning (llama-cpp-python asserts);
- whitespace where llama.cpp allows it, so that a model may pretty-print: llama-cpp-python's `space`
  (at most one space) follows every value; llama.cpp's (nothing, a space, or one or two newlines
  and up to 20 spaces or tabs) follows `{`, `[`, `,`, `:` and a declared key and comes before `}`
  and `]`, and nothing follows a value (so none after the JSON, nor before a `,`).
"""

import json
import math
import re
import urllib.parse

from llama_cpp import llama_grammar as lg

from specllm import report
from specllm.errors import GrammarInvalid
from specllm.llama.patterns import InvalidPattern, UnsupportedPattern, pattern_rule

# llama.cpp's int64 bounds stand for "no bound"
_NO_MIN, _NO_MAX = -(2**63), 2**63 - 1
_LARGEST = 10**16 - 1  # the greatest integer llama.cpp's grammars write (16 digits)
_LARGEST_ALONE = 10**15  # a bound alone from here on is written as a range up to _LARGEST
_DIGITS = "at most 16 digits, a grammar's most"
_UNBOUNDED = 2**31 - 1  # more_digits' "no maximum" (std::numeric_limits<int>::max())
_BOUND_KEYS = ("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum")
# what makes a schema without a type a string, as llama.cpp's builder reads it
_STRING_KEYS = ("pattern", "minLength", "maxLength")
_ANY_VALUE = lg.BuiltinRule(
    "object | array | string | number | boolean | null", ["object", "array", "string", "number", "boolean", "null"]
)
# llama.cpp's string character: not a control character, and `\/` is no escape
_CHAR = lg.BuiltinRule(r'[^"\\\x7F\x00-\x1F] | [\\] (["\\bfnrt] | "u" [0-9a-fA-F]{4})', [])
# llama.cpp's whitespace between tokens (SPACE_RULE): nothing, a space, or an indented new line
SPACE = '| " " | "\\n"{1,2} [ \\t]{0,20}'
# what ends a rule of llama-cpp-python's: a value followed by its `space`, a closing bracket's too
_TRAILING_SPACE = re.compile(r'(?P<closing> "[\]}]")? space$')


def json_schema_to_gbnf(schema: dict) -> str:
    """`schema` (a JSON schema, parsed) as GBNF: llama-cpp-python's converter with llama-server's
    readings added."""
    converter = _Converter(prop_order={}, allow_fetch=False, dotall=False, raw_pattern=False)
    if "$ref" in schema:
        # llama-cpp-python looks no further into a schema that has a $ref, so the $refs in its
        # $defs (pydantic's recursive root model) stay unresolved: resolved here first, in place
        converter.resolve_refs({key: value for key, value in schema.items() if key != "$ref"}, "stdin")
    converter.visit(converter.resolve_refs(schema, "stdin"), "")
    return converter.format_grammar()


class _Converter(lg.SchemaConverter):
    # the key rule of the object being built, for its additional properties (see _build_object_rule)
    _additional_key: str | None = None
    _root_named = False  # the root's rule is named: a later rule without a name is a property's

    def __init__(self, **options):
        super().__init__(**options)
        self._rules["space"] = SPACE

    def _add_rule(self, name, rule):
        return super()._add_rule(name, _TRAILING_SPACE.sub(_space_before_closing, rule))

    def _format_literal(self, literal):
        # llama-cpp-python passes only a property's key here, as JSON escaped to ASCII
        # ("\u540d\u524d"); llama.cpp writes its text as it is ("名前"), as a model writes it
        return self._literal(json.dumps(json.loads(literal), ensure_ascii=False))

    def _literal(self, text: str) -> str:
        # llama.cpp escapes a backslash too; without it, a `\"` in a JSON value ends the literal
        return super()._format_literal(text.replace("\\", "\\\\"))

    def _generate_constant_rule(self, value):
        # as llama.cpp writes a const or enum value: its text as it is ("été"), not escaped to
        # ASCII ("\u00e9t\u00e9"), which a model hardly writes
        return self._literal(json.dumps(value, ensure_ascii=False))

    def resolve_refs(self, schema: dict, url: str):
        """llama-cpp-python's, with each $ref within the schema read as a JSON pointer (RFC 6901:
        `~1` a `/`, `~0` a `~`, percent-encoding decoded) that may go through lists (zod's
        `#/properties/a/anyOf/1`); no schema is fetched (grammar.py refuses other $refs first)."""

        def visit(node) -> None:
            if isinstance(node, list):
                for item in node:
                    visit(item)
            elif isinstance(node, dict):
                ref = node.get("$ref")
                if ref is None:
                    for value in node.values():
                        visit(value)
                elif not isinstance(ref, str) or not (ref.startswith("#/") or ref in self._refs):
                    raise GrammarInvalid(f"the JSON schema's $ref {json.dumps(ref)} is not a path within it (#/...)")
                elif ref not in self._refs:
                    node["$ref"] = f"{url}{ref}"
                    self._refs[node["$ref"]] = _pointed(schema, ref)

        visit(schema)
        return schema

    def _resolve_ref(self, ref):
        # named as llama.cpp names it, by its whole path: llama-cpp-python names it by its last part
        # and takes any rule of that name for it (`#/$defs/integer` was the integer primitive)
        name = "ref" + re.sub(r"[^a-zA-Z0-9-]+", "-", ref.split("#", 1)[-1])
        if name not in self._rules and ref not in self._refs_being_resolved:
            self._refs_being_resolved.add(ref)
            name = self.visit(self._refs[ref], name)
            self._refs_being_resolved.remove(ref)
        return name

    def _add_primitive(self, name, rule):
        if name == "string" and self._additional_key:
            return self._additional_key  # the one string primitive _build_object_rule asks for itself
        if name == "char":
            rule = _CHAR
        return super()._add_primitive(name, rule)

    def visit(self, schema, name):
        if not isinstance(schema, dict):  # `true` or `false` as a property's schema, an item's, ...
            raise GrammarInvalid(
                f"the JSON schema has {json.dumps(schema)} where a schema is expected ({name or 'the root'}): "
                "a schema must be an object there, as llama-server requires"
            )
        if not name and self._root_named:
            # the value of the root's property "" (named by its key, as the root is by none): in
            # llama.cpp's converter it takes the root's rule, and the grammar is that value's
            name = "empty-key"
        self._root_named = True
        outer, self._additional_key = self._additional_key, None  # a property's own strings are strings
        try:
            return self._visit(schema, name)
        finally:
            self._additional_key = outer

    def _visit(self, schema, name):
        schema_type = schema.get("type")
        rule_name = name + "-" if name in lg.RESERVED_NAMES else name or "root"
        if "$ref" in schema:
            return super().visit(schema, name)
        if "oneOf" in schema or "anyOf" in schema:
            _check_schema_list(schema, "oneOf" if "oneOf" in schema else "anyOf")
            return super().visit(schema, name)
        if isinstance(schema_type, list):
            if not schema_type:
                raise GrammarInvalid(
                    "the JSON schema's type is an empty list: it must name a type, as llama-server requires"
                )
            alternatives = [{**schema, "type": t} for t in schema_type]
            return self._add_rule(rule_name, self._generate_union_rule(name, alternatives))
        if "const" in schema:
            return super().visit(schema, name)
        if "enum" in schema:
            if not isinstance(schema["enum"], list) or not schema["enum"]:
                raise GrammarInvalid(
                    f"the JSON schema's enum must be a non-empty list of values, not {json.dumps(schema['enum'])}"
                )
            return super().visit(schema, name)
        if schema_type in (None, "object") and "allOf" in schema:
            _check_schema_list(schema, "allOf")
        if schema.get("items") is False and "prefixItems" not in schema:
            # `false` closes a tuple (`prefixItems`), which is read so; alone it leaves only [], which
            # llama-server refuses
            raise GrammarInvalid(
                "the JSON schema's items is false: a schema must be an object there, as llama-server requires"
            )
        _check_counts(schema)
        if schema_type == "integer" and any(key in schema for key in _BOUND_KEYS):
            low, high = integer_bounds(schema)
            if (low, high) != (_NO_MIN, _NO_MAX):
                return self._add_rule(rule_name, f"({integer_range(low, high)}) space")
        if schema_type is None and _is_any_value(schema):
            return self._add_rule(rule_name, self._add_primitive("value", _ANY_VALUE))
        if _is_array_of_any_value(schema):
            return self._add_rule(rule_name, self._array_of_any_value(schema, name))
        if schema_type is None and _is_string(schema):
            return super().visit({**schema, "type": "string"}, name)
        return super().visit(schema, name)

    def _array_of_any_value(self, schema: dict, name: str) -> str:
        item = self.visit({}, f"{name}{'-' if name else ''}item")
        count = lg._build_repetition(
            item, schema.get("minItems", 0), schema.get("maxItems"), separator_rule='"," space'
        )
        return f'"[" space {count} "]" space'

    def _build_object_rule(self, properties, required, name, additional_properties):
        if additional_properties is True:
            additional_properties = {}  # any value: visited as one (llama-cpp-python: an object)
        if isinstance(additional_properties, dict) and properties:
            # an additional property's key is none of the declared ones, as in llama.cpp
            key = self._not_strings([json.dumps(prop, ensure_ascii=False)[1:-1] for prop, _ in properties])
            self._additional_key = self._add_rule(f"{name}{'-' if name else ''}additional-k", f"{key} space")
        if not properties and not isinstance(additional_properties, dict):
            return '"{" space "}"'  # llama-cpp-python's has two spaces inside ('"{" space  "}" space')
        try:
            return super()._build_object_rule(properties, required, name, additional_properties)
        finally:
            self._additional_key = None

    def _visit_pattern(self, pattern, name):
        if not isinstance(pattern, str):
            raise GrammarInvalid(f"the JSON schema's pattern must be a string, not {pattern!r}")
        rules = dict(self._rules)
        try:
            return self._add_rule(name, pattern_rule(pattern, name, self._add_rule))
        except UnsupportedPattern as e:
            self._rules = rules  # the rules of the part read are no part of the grammar
            report.say(f"the JSON schema's pattern {pattern} is not supported ({e}): any string is accepted for it")
            return self._add_rule(name, self._add_primitive("string", lg.PRIMITIVE_RULES["string"]))
        except InvalidPattern as e:
            raise GrammarInvalid(f"the JSON schema's pattern {pattern} is invalid: {e}") from None

    def format_grammar(self):
        # llama-cpp-python writes the additional properties after an optional one without their
        # comma (`p-rest ::= additional-kvs`): `{"p": 1 "q": 2}`; llama.cpp has `( "," space kv )*`
        for name, rule in self._rules.items():
            if name.endswith("-rest") and _ADDITIONAL_KVS.fullmatch(rule):
                self._rules[name] = f'( "," space {rule} )?'
        return super().format_grammar()

    def _not_strings(self, strings: list[str]) -> str:
        """A JSON string that is none of `strings` (as written in JSON), as llama.cpp's _not_strings
        writes it."""
        trie: dict = {}
        for text in strings:
            node = trie
            for c in text:
                node = node.setdefault(c, {})
            node[_END] = {}
        char = super()._add_primitive("char", _CHAR)
        out = ['["] ( ']

        def visit(node: dict) -> None:
            children = sorted(c for c in node if c != _END)
            for i, c in enumerate(children):
                out.append(f"{' | ' if i else ''}[{_class_char(c)}]")
                grandchildren = [g for g in node[c] if g != _END]
                out.append(" (" if grandchildren else f" {char}+")
                if grandchildren:
                    visit(node[c])
                    out.append(")")
            if children:
                out.append(f' | [^"{"".join(map(_class_char, children))}] {char}*')

        if not [c for c in trie if c != _END]:  # none but "": llama.cpp's `( )` took "" alone
            return f'["] {char}+ ["]'
        visit(trie)
        out.append(" )" if _END in trie else " )?")
        out.append(' ["]')
        return "".join(out)


def _pointed(schema: dict, ref: str):
    """What the JSON pointer `ref` (`#/...`) points at in `schema`; a part is looked up as RFC 6901
    decodes it, then as written (llama.cpp reads a part as written)."""
    target = schema
    for part in ref[2:].split("/"):
        decoded = urllib.parse.unquote(part).replace("~1", "/").replace("~0", "~")
        if isinstance(target, dict) and (decoded in target or part in target):
            target = target[decoded if decoded in target else part]
        elif isinstance(target, list) and part.isdigit() and int(part) < len(target):
            target = target[int(part)]
        else:
            raise GrammarInvalid(f"the JSON schema's $ref {ref} points at nothing in it: no {json.dumps(decoded)}")
    return target


def _check_schema_list(schema: dict, key: str) -> None:
    """Refuses an anyOf, oneOf or allOf that is no list of schemas, or an empty one, as llama.cpp does."""
    value = schema[key]
    if not isinstance(value, list) or not value:
        raise GrammarInvalid(f"the JSON schema's {key} must be a non-empty list of schemas, not {json.dumps(value)}")
    for alternative in value:
        if not isinstance(alternative, dict):
            raise GrammarInvalid(
                f"the JSON schema has {json.dumps(alternative)} in its {key} where a schema is expected: "
                "a schema must be an object there, as llama-server requires"
            )


def _check_counts(schema: dict) -> None:
    """Refuses a minimum count above the maximum (items, a string's length): no value has both, and
    llama.cpp writes a repetition {m,n} with n < m, which its grammar parser takes as endless."""
    for low, high in (("minItems", "maxItems"), ("minLength", "maxLength")):
        least, most = schema.get(low), schema.get(high)
        if isinstance(least, int) and isinstance(most, int) and least > most:
            raise GrammarInvalid(f"the JSON schema's {low} {least} is above its {high} {most}: no value has both")


def _space_before_closing(end: re.Match) -> str:
    """llama-cpp-python ends each value's rule with `space` (no other rule ends so); llama.cpp puts
    it before a closing bracket and after no value."""
    return f" space{end['closing']}" if end["closing"] else ""


_ADDITIONAL_KVS = re.compile(r"[a-zA-Z0-9-]*additional-kvs[0-9]*")
_END = ""  # a trie's mark of a whole string (no character is empty)


def _class_char(c: str) -> str:
    """A character as GBNF writes it inside [...] (a ^ first would negate it)."""
    if c == "^":
        return "\\x5E"
    return "\\" + c if c in '\\]-"' else c


def _is_any_value(schema: dict) -> bool:
    """Whether a schema without a type says nothing llama.cpp's builder reads: any JSON value."""
    if any(key in schema for key in ("properties", "allOf", "items", "prefixItems")) or _is_string(schema):
        return False
    return schema.get("additionalProperties", True) is True


def _is_string(schema: dict) -> bool:
    """Whether a schema without a type is a string's, as llama.cpp's builder reads it."""
    return any(key in schema for key in _STRING_KEYS) or _format(schema) is not None


def _format(schema: dict) -> str | None:
    """The string format both converters know that `schema` names, if any."""
    name = schema.get("format")
    known = isinstance(name, str) and (re.fullmatch(r"uuid[1-5]?", name) or f"{name}-string" in lg.STRING_FORMAT_RULES)
    return name if known else None


def _is_array_of_any_value(schema: dict) -> bool:
    """An array whose items may be any value: llama-cpp-python fails on `"items": {}`, and without
    `items` leaves out `minItems` and `maxItems`."""
    if schema.get("type") is None and ("properties" in schema or "allOf" in schema):
        return False  # an object's schema, as llama.cpp's builder reads it
    if "items" in schema:
        return schema["items"] == {} and schema.get("type", "array") == "array"
    bounded = "minItems" in schema or "maxItems" in schema
    return schema.get("type") == "array" and "prefixItems" not in schema and bounded


def integer_bounds(schema: dict) -> tuple[int, int]:
    """An integer schema's least and greatest values, as llama.cpp reads them: `minimum` before
    `exclusiveMinimum` (and `maximum` before `exclusiveMaximum`), a fractional bound rounded
    inwards; _NO_MIN / _NO_MAX where there is none, or where it is past a 64-bit integer's range
    (llama.cpp's int64 bounds of no bound: OpenAPI's int64 schemas give them)."""
    low, high = _NO_MIN, _NO_MAX
    if "minimum" in schema:
        low = _bound(schema, "minimum", math.ceil)
    elif "exclusiveMinimum" in schema:
        low = _bound(schema, "exclusiveMinimum", math.floor) + 1
    if "maximum" in schema:
        high = _bound(schema, "maximum", math.floor)
    elif "exclusiveMaximum" in schema:
        high = _bound(schema, "exclusiveMaximum", math.ceil) - 1
    low, high = _one_bound_capped(max(low, _NO_MIN), min(high, _NO_MAX))
    if low > high:
        raise GrammarInvalid(f"the JSON schema's integer bounds admit no integer: {low} > {high}")
    return low, high


def _one_bound_capped(low: int, high: int) -> tuple[int, int]:
    """A bound alone of 16 digits or more with the other side at 16 digits, an integer's most in
    llama.cpp: its GBNF for such a bound alone repeats digits {m,n} with n < m (from 2 * 10**15 on),
    which its parser takes as endless (llama-server then runs out of memory)."""
    if high == _NO_MAX and low >= _LARGEST_ALONE:
        if low > _LARGEST:
            raise GrammarInvalid(f"the JSON schema's integer lower bound {low} leaves no integer of {_DIGITS}")
        return low, _LARGEST
    if low == _NO_MIN and high <= -_LARGEST_ALONE:
        if high < -_LARGEST:
            raise GrammarInvalid(f"the JSON schema's integer upper bound {high} leaves no integer of {_DIGITS}")
        return -_LARGEST, high
    return low, high


def _bound(schema: dict, key: str, rounded) -> int:
    value = schema[key]
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise GrammarInvalid(f"the JSON schema's {key} must be a number, not {value!r}")
    return value if isinstance(value, int) else rounded(value)


def integer_range(min_value: int, max_value: int, decimals_left: int = 16, top_level: bool = True) -> str:
    """GBNF for the decimal integers from min_value to max_value (_NO_MIN / _NO_MAX: unbounded) of
    at most 16 digits, as llama.cpp's build_min_max_int writes it, text for text (but for a negative
    maximum alone: see _at_most)."""
    out: list[str] = []
    _min_max_int(min_value, max_value, out, decimals_left, top_level)
    return "".join(out)


def _more_digits(out: list[str], min_digits: int, max_digits: int) -> None:
    out.append("[0-9]")
    if min_digits == max_digits == 1:
        return
    out.append(f"{{{min_digits}")
    if max_digits != min_digits:
        out.append("," + ("" if max_digits == _UNBOUNDED else str(max_digits)))
    out.append("}")


def _digit_range(out: list[str], low: str, high: str) -> None:
    out.append(f"[{low}]" if low == high else f"[{low}-{high}]")


def _uniform_range(out: list[str], low: str, high: str) -> None:
    """The numbers of len(low) == len(high) digits from low to high, leading zeros included."""
    i = 0
    while i < len(low) and i < len(high) and low[i] == high[i]:
        i += 1
    if i > 0:
        out.append(f'"{low[:i]}"')
    if i >= len(low) or i >= len(high):
        return
    if i > 0:
        out.append(" ")
    sub_len = len(low) - i - 1
    if sub_len == 0:
        out.append(f"[{low[i]}-{high[i]}]")
        return
    low_sub, high_sub = low[i + 1 :], high[i + 1 :]
    zeros, nines = "0" * sub_len, "9" * sub_len
    high_reached = False
    out.append("(")
    if low_sub == zeros:
        _digit_range(out, low[i], chr(ord(high[i]) - 1))
        out.append(" ")
        _more_digits(out, sub_len, sub_len)
    else:
        out.append(f"[{low[i]}] (")
        _uniform_range(out, low_sub, nines)
        out.append(")")
        if ord(low[i]) < ord(high[i]) - 1:
            out.append(" | ")
            if high_sub == nines:
                _digit_range(out, chr(ord(low[i]) + 1), high[i])
                high_reached = True
            else:
                _digit_range(out, chr(ord(low[i]) + 1), chr(ord(high[i]) - 1))
            out.append(" ")
            _more_digits(out, sub_len, sub_len)
    if not high_reached:
        out.append(" | ")
        _digit_range(out, high[i], high[i])
        out.append(" ")
        _uniform_range(out, zeros, high_sub)
    out.append(")")


def _min_max_int(min_value: int, max_value: int, out: list[str], decimals_left: int, top_level: bool) -> None:
    has_min, has_max = min_value != _NO_MIN, max_value != _NO_MAX
    if has_min and has_max:
        _bounded(min_value, max_value, out, decimals_left)
    elif has_min:
        _at_least(min_value, out, decimals_left, top_level)
    elif has_max:
        _at_most(max_value, out, decimals_left, top_level)
    else:
        raise ValueError("an integer range needs a minimum or a maximum")


def _bounded(min_value: int, max_value: int, out: list[str], decimals_left: int) -> None:
    if min_value < 0 and max_value < 0:
        out.append('"-" (')
        _min_max_int(-max_value, -min_value, out, decimals_left, True)
        out.append(")")
        return
    if min_value < 0:
        out.append('"-" (')
        _min_max_int(0, -min_value, out, decimals_left, True)
        out.append(") | ")
        min_value = 0
    min_s, max_s = str(min_value), str(max_value)
    for digits in range(len(min_s), len(max_s)):
        _uniform_range(out, min_s, "9" * digits)
        min_s = "1" + "0" * digits
        out.append(" | ")
    _uniform_range(out, min_s, max_s)


def _at_least(min_value: int, out: list[str], decimals_left: int, top_level: bool) -> None:
    less_decimals = max(decimals_left - 1, 1)
    if min_value < 0:
        out.append('"-" (')
        _min_max_int(_NO_MIN, -min_value, out, decimals_left, False)
        out.append(") | [0] | [1-9] ")
        _more_digits(out, 0, decimals_left - 1)
    elif min_value == 0:
        if top_level:
            out.append("[0] | [1-9] ")
            _more_digits(out, 0, less_decimals)
        else:
            _more_digits(out, 1, decimals_left)
    elif min_value <= 9:
        c = str(min_value)
        range_start = "1" if top_level else "0"
        if c > range_start:
            _digit_range(out, range_start, chr(ord(c) - 1))
            out.append(" ")
            _more_digits(out, 1, less_decimals)
            out.append(" | ")
        _digit_range(out, c, "9")
        out.append(" ")
        _more_digits(out, 0, less_decimals)
    else:
        min_s = str(min_value)
        c = min_s[0]
        if c > "1":
            _digit_range(out, "1" if top_level else "0", chr(ord(c) - 1))
            out.append(" ")
            _more_digits(out, len(min_s), less_decimals)
            out.append(" | ")
        _digit_range(out, c, c)
        out.append(" (")
        _min_max_int(int(min_s[1:]), _NO_MAX, out, less_decimals, False)
        out.append(")")
        if c < "9":
            out.append(" | ")
            _digit_range(out, chr(ord(c) + 1), "9")
            out.append(" ")
            _more_digits(out, len(min_s) - 1, less_decimals)


def _at_most(max_value: int, out: list[str], decimals_left: int, top_level: bool) -> None:
    less_decimals = max(decimals_left - 1, 1)
    if max_value >= 0:
        if top_level:
            out.append('"-" [1-9] ')
            _more_digits(out, 0, less_decimals)
            out.append(" | ")
        _min_max_int(0, max_value, out, decimals_left, True)
    else:
        # llama.cpp passes top_level false here, which lets "-04" through under a maximum of -5
        # (a leading zero: not JSON, and -4 > -5); the digits after "-" begin a number
        out.append('"-" (')
        _min_max_int(-max_value, _NO_MAX, out, decimals_left, True)
        out.append(")")

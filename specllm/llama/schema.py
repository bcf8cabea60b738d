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
- an `allOf` whose parts list values (`enum`, `const`, a $ref to one): the values they all list
  (llama.cpp intersects enums alone, and takes an object where none is left: refused here);
- a number's `minimum`, `maximum`, `exclusiveMinimum` and `exclusiveMaximum` (llama.cpp reads
  none), for numbers written without an exponent (number_range);
- what llama.cpp refuses, refused in one line that names the part by its JSON pointer
  (checked_paths): an empty `type`, `enum`, `anyOf`, `oneOf` or `allOf`, a `type` that names no
  JSON type, a `properties` that is no object, `true` or `false` where a schema is expected (but
  `additionalProperties`, and `items` closing a tuple), and counts whose minimum is above their
  maximum;
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
from decimal import Decimal

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
    converter.paths = checked_paths(schema)
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
    _path = ""  # the JSON pointer of the schema being visited: refusals name it

    def __init__(self, **options):
        super().__init__(**options)
        self._rules["space"] = SPACE
        self.paths: dict[int, str] = {}  # each schema (by id) at its JSON pointer, from checked_paths

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
        if not isinstance(schema, dict):  # checked_paths refuses it first, naming where it is
            raise GrammarInvalid(f"the JSON schema has {json.dumps(schema)} where a schema is expected")
        if not name and self._root_named:
            # the value of the root's property "" (named by its key, as the root is by none): in
            # llama.cpp's converter it takes the root's rule, and the grammar is that value's
            name = "empty-key"
        self._root_named = True
        outer, self._additional_key = self._additional_key, None  # a property's own strings are strings
        outer_path, self._path = self._path, self.paths.get(id(schema), self._path)
        try:
            return self._visit(schema, name)
        finally:
            self._additional_key, self._path = outer, outer_path

    def _visit(self, schema, name):
        schema_type = schema.get("type")
        rule_name = name + "-" if name in lg.RESERVED_NAMES else name or "root"
        if "$ref" in schema or "oneOf" in schema or "anyOf" in schema:
            return super().visit(schema, name)
        if isinstance(schema_type, list):
            alternatives = [{**schema, "type": t} for t in schema_type]
            self.paths.update((id(alternative), self._path) for alternative in alternatives)
            try:
                return self._add_rule(rule_name, self._generate_union_rule(name, alternatives))
            finally:
                for alternative in alternatives:  # their ids may be another dict's later
                    del self.paths[id(alternative)]
        if "const" in schema or "enum" in schema:
            return super().visit(schema, name)
        if "allOf" in schema and _reads_all_of(schema):
            values = self._all_of_values(schema)
            if values is not None:
                return self._add_rule(rule_name, self._values_rule(values))
        if schema_type == "integer" and any(key in schema for key in _BOUND_KEYS):
            low, high = integer_bounds(schema)
            if (low, high) != (_NO_MIN, _NO_MAX):
                return self._add_rule(rule_name, f"({integer_range(low, high)}) space")
        if schema_type == "number" and any(key in schema for key in _BOUND_KEYS):
            return self._add_rule(rule_name, f"({number_range(*number_bounds(schema))}) space")
        if schema_type is None and _is_any_value(schema):
            return self._add_rule(rule_name, self._add_primitive("value", _ANY_VALUE))
        if _is_array_of_any_value(schema):
            return self._add_rule(rule_name, self._array_of_any_value(schema, name))
        if schema_type is None and _is_string(schema):
            return super().visit({**schema, "type": "string"}, name)
        return super().visit(schema, name)

    def _all_of_values(self, schema: dict) -> list | None:
        """The values an allOf allows where some of its parts list them (`enum`, `const`, a $ref
        to one, an anyOf of them): those all such parts list, of the types the schema and its other
        parts name (their other keywords are not checked); None where no part lists values. As
        llama.cpp intersects its parts' enums; it leaves out consts, and takes an object where the
        intersection is empty, which is refused here."""
        values = _listed_values(schema, self._refs)
        if values == []:
            raise GrammarInvalid(
                f"the JSON schema's {_pointer(self._path, 'allOf')} admits no value: "
                "no value its enums and consts list is in all of them and of its types"
            )
        return values

    def _values_rule(self, values: list) -> str:
        return "(" + " | ".join(self._generate_constant_rule(value) for value in values) + ")"

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
            raise GrammarInvalid(
                f"the JSON schema's {_pointer(self._path, 'pattern')} must be a string, not {pattern!r}"
            )
        rules = dict(self._rules)
        try:
            return self._add_rule(name, pattern_rule(pattern, name, self._add_rule))
        except UnsupportedPattern as e:
            self._rules = rules  # the rules of the part read are no part of the grammar
            report.say(
                f"the JSON schema's {_pointer(self._path, 'pattern')} {pattern} is not supported ({e}): "
                "any string is accepted for it"
            )
            return self._add_rule(name, self._add_primitive("string", lg.PRIMITIVE_RULES["string"]))
        except InvalidPattern as e:
            raise GrammarInvalid(
                f"the JSON schema's {_pointer(self._path, 'pattern')} {pattern} is invalid: {e}"
            ) from None

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


def _pointed(schema: dict, ref: str, path: str = ""):
    """What the JSON pointer `ref` (`#/...`, the $ref at `path`) points at in `schema`; a part is
    looked up as RFC 6901 decodes it, then as written (llama.cpp reads a part as written)."""
    target = schema
    for part in ref[2:].split("/"):
        decoded = urllib.parse.unquote(part).replace("~1", "/").replace("~0", "~")
        if isinstance(target, dict) and (decoded in target or part in target):
            target = target[decoded if decoded in target else part]
        elif isinstance(target, list) and part.isdigit() and int(part) < len(target):
            target = target[int(part)]
        else:
            raise GrammarInvalid(
                f"the JSON schema's {_pointer(path, '$ref')} {ref} points at nothing in it: no {json.dumps(decoded)}"
            )
    return target


def _check_schema_list(schema: dict, key: str, path: str) -> None:
    """Refuses an anyOf, oneOf or allOf that is no list, or an empty one, as llama.cpp does (its
    items are checked as schemas where they are walked)."""
    value = schema[key]
    if not isinstance(value, list) or not value:
        raise GrammarInvalid(
            f"the JSON schema's {_pointer(path, key)} must be a non-empty list of schemas, not {json.dumps(value)}"
        )


def _check_counts(schema: dict, path: str) -> None:
    """Refuses a minimum count above the maximum (items, a string's length): no value has both, and
    llama.cpp writes a repetition {m,n} with n < m, which its grammar parser takes as endless."""
    for low, high in (("minItems", "maxItems"), ("minLength", "maxLength")):
        least, most = schema.get(low), schema.get(high)
        if isinstance(least, int) and isinstance(most, int) and least > most:
            raise GrammarInvalid(
                f"the JSON schema's {_pointer(path, low)} {least} is above its {high} {most}: no value has both"
            )


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


def integer_bounds(schema: dict, path: str = "") -> tuple[int, int]:
    """An integer schema's least and greatest values, as llama.cpp reads them: `minimum` before
    `exclusiveMinimum` (and `maximum` before `exclusiveMaximum`), a fractional bound rounded
    inwards; _NO_MIN / _NO_MAX where there is none, or where it is past a 64-bit integer's range
    (llama.cpp's int64 bounds of no bound: OpenAPI's int64 schemas give them). `path`: where the
    schema is, for a refusal."""
    schema = _exclusive_flags_read(schema)
    low, high = _NO_MIN, _NO_MAX
    if "minimum" in schema:
        low = math.ceil(_bound(schema, "minimum", path))
    elif "exclusiveMinimum" in schema:
        low = math.floor(_bound(schema, "exclusiveMinimum", path)) + 1
    if "maximum" in schema:
        high = math.floor(_bound(schema, "maximum", path))
    elif "exclusiveMaximum" in schema:
        high = math.ceil(_bound(schema, "exclusiveMaximum", path)) - 1
    low, high = _one_bound_capped(max(low, _NO_MIN), min(high, _NO_MAX), path)
    if low > high:
        raise GrammarInvalid(f"the JSON schema's integer bounds at {_place(path)} admit no integer: {low} > {high}")
    return low, high


def _one_bound_capped(low: int, high: int, path: str) -> tuple[int, int]:
    """A bound alone of 16 digits or more with the other side at 16 digits, an integer's most in
    llama.cpp: its GBNF for such a bound alone repeats digits {m,n} with n < m (from 2 * 10**15 on),
    which its parser takes as endless (llama-server then runs out of memory)."""
    if high == _NO_MAX and low >= _LARGEST_ALONE:
        if low > _LARGEST:
            raise GrammarInvalid(
                f"the JSON schema's integer lower bound {low} at {_place(path)} leaves no integer of {_DIGITS}"
            )
        return low, _LARGEST
    if low == _NO_MIN and high <= -_LARGEST_ALONE:
        if high < -_LARGEST:
            raise GrammarInvalid(
                f"the JSON schema's integer upper bound {high} at {_place(path)} leaves no integer of {_DIGITS}"
            )
        return -_LARGEST, high
    return low, high


def _exclusive_flags_read(schema: dict) -> dict:
    """The schema with draft-04's boolean `exclusiveMinimum` / `exclusiveMaximum` (OpenAPI 3.0's,
    zod-to-json-schema's openApi3 target's) read as today's numbers: `true` makes the `minimum`
    (`maximum`) beside it exclusive; `false`, or a flag without its bound, says nothing."""
    read = dict(schema)
    for inclusive, exclusive in (("minimum", "exclusiveMinimum"), ("maximum", "exclusiveMaximum")):
        flag = read.get(exclusive)
        if isinstance(flag, bool):
            del read[exclusive]
            if flag and inclusive in read:
                read[exclusive] = read.pop(inclusive)
    return read


def _bound(schema: dict, key: str, path: str) -> Decimal:
    """A bound as written in the schema, exactly: a float as its shortest text (0.1 is 0.1)."""
    value = schema[key]
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise GrammarInvalid(f"the JSON schema's {_pointer(path, key)} must be a number, not {json.dumps(value)}")
    return Decimal(value) if isinstance(value, int) else Decimal(repr(value))


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


# JSON's types, as a schema's `type` names them
_TYPES = ("string", "number", "integer", "boolean", "array", "object", "null")


def _pointer(path: str, key: str) -> str:
    """The JSON pointer of `key` in the schema at `path`: `/properties/a` and `minimum` give
    `/properties/a/minimum`."""
    return f"{path}/{key.replace('~', '~0').replace('/', '~1')}"


def _place(path: str) -> str:
    return path or "the root"


def checked_paths(schema: dict) -> dict[int, str]:
    """Each schema within `schema` (by id) at its JSON pointer, walked as llama.cpp's builder walks it
    (a $ref's target where it is, once); refuses in one line, naming where, what it refuses: a schema
    that is no object, a `type` that names no JSON type, a `properties` that is no object, an empty
    or malformed `enum`, `anyOf`, `oneOf` or `allOf`, reversed counts, bounds that admit nothing."""
    paths: dict[int, str] = {}
    pending: list[tuple[object, str]] = [(schema, "")]
    while pending:  # not recursive: a schema may nest deeper than Python's stack
        node, path = pending.pop()
        if not isinstance(node, dict):
            raise GrammarInvalid(
                f"the JSON schema has {json.dumps(node)} at {_place(path)}, where a schema is expected: "
                "a schema must be an object there, as llama-server requires"
            )
        if id(node) in paths:
            continue
        paths[id(node)] = path
        pending.extend(_parts(schema, node, path))
    return paths


def _parts(root: dict, node: dict, path: str) -> list[tuple[object, str]]:
    """The schemas within `node` (at `path`) that the converter reads, with their paths; refuses
    what is wrong in `node` itself."""
    if "$ref" in node:
        ref = node["$ref"]
        if not isinstance(ref, str) or not ref.startswith("#/"):
            raise GrammarInvalid(
                f"the JSON schema's {_pointer(path, '$ref')} {json.dumps(ref)} is not a path within it (#/...)"
            )
        return [(_pointed(root, ref, path), ref[1:])]
    for key in ("oneOf", "anyOf"):
        if key in node:
            _check_schema_list(node, key, path)
            return _listed(node[key], _pointer(path, key))
    types = _type_names(node, path)
    if "enum" in node and (not isinstance(node["enum"], list) or not node["enum"]):
        raise GrammarInvalid(
            f"the JSON schema's {_pointer(path, 'enum')} must be a non-empty list of values, not "
            f"{json.dumps(node['enum'])}"
        )
    if "const" in node or "enum" in node:
        return []
    _check_counts(node, path)
    if "integer" in types and any(key in node for key in _BOUND_KEYS):
        integer_bounds(node, path)
    if "number" in types and any(key in node for key in _BOUND_KEYS):
        number_bounds(node, path)
    parts = []
    if "allOf" in node:
        _check_schema_list(node, "allOf", path)
        parts += _listed(node["allOf"], _pointer(path, "allOf"))
    if not types or "object" in types:
        parts += _object_parts(node, path)
    if not types or "array" in types:
        parts += _array_parts(node, path)
    return parts


def _type_names(node: dict, path: str) -> list[str]:
    """The JSON types `node` names (none: any), each one of JSON's."""
    given = node.get("type")
    if given is None:
        return []
    names = given if isinstance(given, list) else [given]
    if not names:
        raise GrammarInvalid(
            f"the JSON schema's {_pointer(path, 'type')} is an empty list: "
            "it must name a type, as llama-server requires"
        )
    for i, name in enumerate(names):
        if name not in _TYPES:
            where = _pointer(path, "type") + (f"/{i}" if isinstance(given, list) else "")
            raise GrammarInvalid(
                f"the JSON schema's {where} {json.dumps(name)} is no JSON type: it names one of {', '.join(_TYPES)}"
            )
    return names


def _object_parts(node: dict, path: str) -> list[tuple[object, str]]:
    parts = []
    properties = node.get("properties", {})
    if not isinstance(properties, dict):
        raise GrammarInvalid(
            f"the JSON schema's {_pointer(path, 'properties')} must be an object of schemas by name, not "
            f"{json.dumps(properties)}"
        )
    properties_path = _pointer(path, "properties")
    parts += [(value, _pointer(properties_path, key)) for key, value in properties.items()]
    additional = node.get("additionalProperties")
    if not isinstance(additional, bool) and additional is not None:
        parts.append((additional, _pointer(path, "additionalProperties")))
    return parts


def _array_parts(node: dict, path: str) -> list[tuple[object, str]]:
    parts: list[tuple[object, str]] = []
    if "prefixItems" in node:
        prefix = node["prefixItems"]
        where = _pointer(path, "prefixItems")
        parts += _listed(prefix, where) if isinstance(prefix, list) else [(prefix, where)]
    items = node.get("items")
    if isinstance(items, list):
        parts += _listed(items, _pointer(path, "items"))
    elif items is False and "prefixItems" not in node:
        # `false` closes a tuple (`prefixItems`), which is read so; alone it leaves only [], which
        # llama-server refuses
        raise GrammarInvalid(
            f"the JSON schema's {_pointer(path, 'items')} is false: a schema must be an object there, "
            "as llama-server requires"
        )
    elif items is not None and items is not False:
        parts.append((items, _pointer(path, "items")))
    return parts


def _listed(schemas: list, path: str) -> list[tuple[object, str]]:
    return [(item, f"{path}/{i}") for i, item in enumerate(schemas)]


def _reads_all_of(schema: dict) -> bool:
    """Whether llama.cpp's builder reads the schema's allOf: an object's without properties of its
    own, or a string's."""
    if schema.get("type") == "string":
        return True
    has_properties = "properties" in schema or schema.get("additionalProperties", True) is not True
    return schema.get("type") in (None, "object") and not has_properties


def _listed_values(schema: dict, refs: dict, seen: frozenset = frozenset()) -> list | None:
    """The values `schema` allows where it lists them (a const, an enum, a $ref to one, an anyOf or
    oneOf of them, an allOf with a part that lists them: see _all_of_values); None where it does
    not. `refs`: the converter's resolved $refs."""
    if id(schema) in seen or not isinstance(schema, dict):
        return None
    seen = seen | {id(schema)}
    if "$ref" in schema:
        target = refs.get(schema["$ref"])
        return None if target is None else _listed_values(target, refs, seen)
    alternatives = schema.get("anyOf", schema.get("oneOf"))
    if isinstance(alternatives, list):
        each = [_listed_values(alternative, refs, seen) for alternative in alternatives]
        listed = [values for values in each if values is not None]
        return _distinct([v for values in listed for v in values]) if len(listed) == len(each) else None
    if "const" in schema:
        return [schema["const"]]
    if isinstance(schema.get("enum"), list):
        return _distinct(schema["enum"])
    if not isinstance(schema.get("allOf"), list):
        return None
    parts = [_listed_values(part, refs, seen) for part in schema["allOf"]]
    listed = [values for values in parts if values is not None]
    if not listed:
        return None
    kept = {_value_key(value) for value in listed[0]}
    for values in listed[1:]:
        kept &= {_value_key(value) for value in values}
    typed = [schema] + [part for part, values in zip(schema["allOf"], parts, strict=True) if values is None]
    return [v for v in listed[0] if _value_key(v) in kept and all(_of_type(v, part) for part in typed)]


def _distinct(values: list) -> list:
    """`values` without repeats (1 and 1.0 are one)."""
    return list({_value_key(v): v for v in values}.values())


def _value_key(value) -> str:
    """A JSON value's identity as JSON Schema compares values: 1 and 1.0 are one value."""
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    return json.dumps(value, sort_keys=True)


def _of_type(value, schema) -> bool:
    """Whether `value` is of a type `schema` names (any, where it names none)."""
    names = schema.get("type") if isinstance(schema, dict) else None
    if names is None:
        return True
    names = names if isinstance(names, list) else [names]
    return any(_is_of(value, name) for name in names)


def _is_of(value, name: str) -> bool:
    if name == "integer":
        return isinstance(value, int | float) and not isinstance(value, bool) and float(value).is_integer()
    if name == "number":
        return isinstance(value, int | float) and not isinstance(value, bool)
    kinds = {"string": str, "boolean": bool, "array": list, "object": dict, "null": type(None)}
    return isinstance(value, kinds[name])


# A number's bound: its value and whether the bound itself is in range
Bound = tuple[Decimal, bool]
_ABOVE_DIGITS = Decimal(10**16)  # a number's integer part has at most 16 digits, as llama.cpp's
_ANY_FRACTION = '("." [0-9]{1,16})?'
_FRACTION_DIGITS = 16  # llama.cpp's decimal-part: [0-9]{1,16}


def number_bounds(schema: dict, path: str = "") -> tuple[Bound | None, Bound | None]:
    """A number schema's lower and upper bounds, each the tighter of its inclusive and exclusive
    keyword, as JSON Schema reads them; None where there is none, or where it is past what a
    number of 16 integer digits reaches. Refuses bounds that admit no number. `path`: where the
    schema is, for a refusal."""
    schema = _exclusive_flags_read(schema)
    lows = [(_bound(schema, key, path), key == "minimum") for key in ("minimum", "exclusiveMinimum") if key in schema]
    highs = [(_bound(schema, key, path), key == "maximum") for key in ("maximum", "exclusiveMaximum") if key in schema]
    # the tighter: the greater lower bound (at equal values the exclusive one), the lesser upper
    low = max(lows, key=lambda bound: (bound[0], not bound[1])) if lows else None
    high = min(highs, key=lambda bound: (bound[0], bound[1])) if highs else None
    if low is not None and low[0] <= -_ABOVE_DIGITS:
        low = None
    if high is not None and high[0] >= _ABOVE_DIGITS:
        high = None
    both_inclusive = low is not None and high is not None and low[1] and high[1]
    empty = low is not None and high is not None and (low[0] > high[0] or (low[0] == high[0] and not both_inclusive))
    past = (low is not None and low[0] >= _ABOVE_DIGITS) or (high is not None and high[0] <= -_ABOVE_DIGITS)
    if empty or past:
        raise GrammarInvalid(
            f"the JSON schema's number bounds at {_place(path)} admit no number"
            + (" of at most 16 integer digits" if past and not empty else "")
        )
    return low, high


def number_range(low: Bound | None, high: Bound | None) -> str:
    """GBNF for the JSON numbers from `low` to `high` written without an exponent (a bound written
    so can be checked digit by digit): the integer part within the integer range between the
    bounds, and at a bound's own integer part the fraction compared digit by digit with the
    bound's. A minimum of 0 or more leaves out the minus sign (`-0` too)."""
    alternatives = []
    zero = (Decimal(0), True)
    if high is None or high[0] > 0 or high == zero:
        alternatives.append(_magnitudes(low if low is not None and low[0] >= 0 else zero, high))
    if low is None or low[0] < 0:
        least = (-high[0], high[1]) if high is not None and high[0] <= 0 else zero
        alternatives.append(f'"-" ({_magnitudes(least, None if low is None else (-low[0], low[1]))})')
    return " | ".join(a for a in alternatives if a)


def _magnitudes(low: Bound, high: Bound | None) -> str:
    """GBNF for the unsigned numbers from `low` (at least 0) to `high` (None: any)."""
    first = math.floor(low[0])
    last = None if high is None else min(math.floor(high[0]), _LARGEST)
    if last is not None and last < first:
        return ""
    low_digits = _fraction_digits(low[0])
    if last == first:
        edge = _with_fraction(first, (low_digits, not low[1]), _upper_digits(high))
        return edge or ""
    alternatives = [_with_fraction(first, (low_digits, not low[1]), None)]
    between_last = _LARGEST if last is None else last - 1
    if first + 1 <= between_last:
        integers = integer_range(first + 1, _NO_MAX if last is None else between_last)
        alternatives.append(f"({integers}) {_ANY_FRACTION}")
    if last is not None:
        alternatives.append(_with_fraction(last, None, _upper_digits(high)))
    return " | ".join(a for a in alternatives if a)


def _upper_digits(high: Bound | None) -> tuple[str, bool] | None:
    return None if high is None else (_fraction_digits(high[0]), not high[1])


def _fraction_digits(value: Decimal) -> str:
    """The digits after the point of a non-negative decimal, without trailing zeros."""
    fraction = value - math.floor(value)
    return "" if fraction == 0 else format(fraction, "f").split(".")[1].rstrip("0")


# A fraction's bound: its digits (no trailing zeros) and whether it is strict
FractionBound = tuple[str, bool]


def _with_fraction(integer: int, low: FractionBound | None, high: FractionBound | None) -> str | None:
    """GBNF for `integer` followed by the fractions (none, or "." and 1 to 16 digits) from `low`
    to `high` (None: no bound); None where no fraction is in range."""
    digits = _fraction_rule(low, high, _FRACTION_DIGITS, at_least_one=True)
    if _ends_here(low, high):
        return f'"{integer}"' + (f' ("." {digits})?' if digits else "")
    return f'"{integer}" "." {digits}' if digits else None


def _ends_here(low: FractionBound | None, high: FractionBound | None) -> bool:
    """Whether the digits read so far, with no more after them, are within `low` and `high` (what
    is left of each bound's digits after them)."""
    low_ok = low is None or (low[0] == "" and not low[1])
    high_ok = high is None or high[0] != "" or not high[1]
    return low_ok and high_ok


def _fraction_rule(low: FractionBound | None, high: FractionBound | None, left: int, at_least_one: bool) -> str | None:
    """GBNF for the digit strings of at most `left` digits (at least one where `at_least_one`) whose
    value as a fraction (0.ddd) is within `low` and `high`; None where there are none. Each digit
    either leaves a bound behind (above the low one's digit, below the high one's) or keeps
    following it."""
    if low is not None and low == ("", False):
        low = None
    if low is None and high in (None, ("", False)):  # any digits; at the high bound's end only zeros
        digit = "[0-9]" if high is None else "[0]"
        return f"{digit}{{{int(at_least_one)},{left}}}" if left else ("" if not at_least_one else None)
    if left == 0:
        return None if at_least_one or not _ends_here(low, high) else ""
    groups: dict[tuple, list[str]] = {}
    for digit in "0123456789":
        after = (_after_low(low, digit), _after_high(high, digit))
        if "gone" not in after:
            groups.setdefault(after, []).append(digit)
    alternatives = []
    for (after_low, after_high), digits in groups.items():
        rest = _fraction_rule(after_low, after_high, left - 1, at_least_one=False)
        if rest is not None:
            digit_class = digits[0] if len(digits) == 1 else f"{digits[0]}-{digits[-1]}"
            alternatives.append(f"[{digit_class}] {rest}".strip())
    if not alternatives:
        return None if at_least_one or not _ends_here(low, high) else ""
    choice = f"({' | '.join(alternatives)})"
    return choice if at_least_one or not _ends_here(low, high) else f"{choice}?"


def _after_low(low: FractionBound | None, digit: str):
    """What is left of the lower bound after `digit`: None once above it, "gone" below it."""
    if low is None:
        return None
    bound_digit = low[0][:1] or "0"
    if digit > bound_digit:
        return None
    return "gone" if digit < bound_digit else (low[0][1:], low[1])


def _after_high(high: FractionBound | None, digit: str):
    """What is left of the upper bound after `digit`: None once below it, "gone" above it."""
    if high is None:
        return None
    bound_digit = high[0][:1] or "0"
    if digit < bound_digit:
        return None
    return "gone" if digit > bound_digit else (high[0][1:], high[1])

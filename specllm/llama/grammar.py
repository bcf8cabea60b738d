"""Structured output: llama.cpp's GBNF grammar sampler over a model's vocabulary, and JSON schemas
turned into GBNF as llama-cpp-python does.

A Grammar is a parse state: `allowed` says which of some token ids may come next (llama.cpp's
sampler sets the others' logits to -inf: a token whose text the grammar cannot take, an empty or
control piece, an end-of-generation token before the grammar can end), `accept` advances it over a
token, `clone` copies it (a speculative step reads each draft position under the state after the
draft tokens before it).
"""

import contextlib
import ctypes
import functools
import json
import os
import re
import sys
import tempfile
import threading
import weakref

import llama_cpp as L
import numpy as np

from specllm.errors import GrammarInvalid, SpecllmError
from specllm.llama.log import recent_errors
from specllm.llama.model import Model
from specllm.llama.schema import json_schema_to_gbnf

# llama_token_data, as numpy lays it out: a whole-vocabulary array is built without a Python loop
_TOKEN_DATA = np.dtype([("id", np.int32), ("logit", np.float32), ("p", np.float32)])
_EMPTY_OBJECT_SCHEMA = {"type": "object"}  # what llama-server makes of a schema given as {}
_TOO_DEEP = "the JSON schema nests too deep to read"
# llama.cpp's grammar parser refuses a repetition past this (MAX_REPETITION_THRESHOLD), as llama-server
# then refuses the schema; llama-cpp-python's converter writes each repetition out instead, in memory
# that grows with the count and in groups nested as deep (which overflow the C parser's stack)
MAX_REPETITIONS = 2000
_THE_LIMIT = f"the {MAX_REPETITIONS} repetitions a grammar may have"
_COUNT_KEYS = ("minItems", "maxItems", "minLength", "maxLength")
_VALUE_KEYS = ("enum", "const", "default", "examples")  # JSON values, not schemas: not looked into
_PATTERN_COUNTS = re.compile(r"\{\s*(\d*)\s*(?:,\s*(\d*)\s*)?\}")
# llama.cpp's parser recurses once per group nested in a group, and its first step into a grammar
# once per rule reached before any text: 30000 groups, or a chain of 100000 rules, overflowed the
# stack and killed the process (10000 and 20000 did not)
MAX_NESTING = 5000
MAX_RULES = 10000
_PARSING = threading.Lock()  # held while llama.cpp parses a grammar (Grammar)
# a repetition {m,n}: llama.cpp's parser takes n < m as n - m wrapped around, 2^64 optional copies,
# and the process grows until the system kills it
_COUNTED = re.compile(r"\{\s*(\d+)\s*,\s*(\d+)\s*\}")
# what holds parentheses that are not groups: a string, a character class, a token, a comment
_LITERALS = re.compile(r'"(?:\\.|[^"\\])*"|\[(?:\\.|[^\]\\])*\]|<[^>\n]*>|#[^\n]*')


class Grammar:
    """A grammar's parse state over `model`'s vocabulary (llama.cpp's grammar sampler)."""

    def __init__(self, model: Model, text: str, *, root: str = "root", _sampler=None):
        self.model = model
        if _sampler is not None:
            self._sampler, self.by_text = _sampler, False  # clone() says how its copy reads tokens
            return
        if not isinstance(text, str) or not text.strip():
            raise GrammarInvalid("the grammar is empty")
        if "\0" in text:  # C would read the grammar only up to it
            raise GrammarInvalid("the grammar holds a NUL character")
        try:
            encoded = text.encode("utf-8")
        except UnicodeEncodeError:
            raise GrammarInvalid("the grammar is not valid UTF-8 text") from None
        _check_size(text)
        # One at a time: two threads swapping file descriptor 2 at once would leave it on one's
        # temporary file for good (serve makes grammars on several threads, ahead of their turns)
        with _PARSING:
            recent_errors.clear()  # what it logs now says why it refused the grammar
            with _stderr_kept() as printed:  # llama.cpp prints a parse error, with the whole grammar
                sampler = L.llama_sampler_init_grammar(model._vocab, encoded, root.encode())
        if not sampler:
            raise GrammarInvalid(f"the grammar does not parse: {_why(printed)}")
        if printed[0]:  # not the parser's: another thread's, written meanwhile
            os.write(2, printed[0].encode())
        self._sampler = sampler
        self.by_text = not _names_tokens(text)

    def clone(self) -> "Grammar":
        copy = Grammar(self.model, "", _sampler=L.llama_sampler_clone(self._sampler))
        copy.by_text = self.by_text
        return copy

    def allowed(self, ids: np.ndarray) -> np.ndarray:
        """Which of `ids` the grammar allows next, as a boolean array in their order. Many ids
        (a whole vocabulary) are first narrowed by their first bytes (_Prefixes)."""
        if len(ids) < _NARROWED_FROM or not self.by_text:
            return self._allowed(ids)
        prefixes = _prefixes(self.model)
        possible = self._possible_probes(prefixes)
        kept = possible[prefixes.deepest[ids]]
        allowed = np.zeros(len(ids), dtype=bool)
        allowed[kept] = self._allowed(ids[kept])
        return allowed

    def _possible_probes(self, prefixes: "_Prefixes") -> np.ndarray:
        """Over the vocabulary (and the last index, "no probe"): which probes the grammar does not
        rule out, shortest first, a probe asked only where its own probe was allowed. Once most are
        allowed (inside a JSON string) the longer ones are not asked: they would rule out little."""
        possible = np.zeros(self.model.n_vocab + 1, dtype=bool)
        possible[-1] = True
        narrowing = True
        for probes in prefixes.by_length:
            asked = probes[possible[prefixes.deepest[probes]]]
            if not narrowing:
                possible[asked] = True
                continue
            allowed = self._allowed(asked)
            possible[asked[allowed]] = True
            narrowing = 2 * np.count_nonzero(allowed) < len(asked)
        return possible

    def _allowed(self, ids: np.ndarray) -> np.ndarray:
        """Which of `ids` llama.cpp's grammar sampler allows next."""
        data = np.zeros(len(ids), dtype=_TOKEN_DATA)
        data["id"] = ids
        array = L.llama_token_data_array(
            data=data.ctypes.data_as(L.llama_token_data_p), size=len(ids), selected=-1, sorted=False
        )
        L.llama_sampler_apply(self._sampler, ctypes.byref(array))
        return data["logit"] == 0

    def accept(self, token: int) -> None:
        """Advance over `token`. An end of generation leaves the state as it is (nothing follows
        it). llama.cpp aborts the process on a token the grammar forbids, so that is refused here."""
        if self.model.is_eog(token):
            return
        if not self.allowed(np.array([token]))[0]:
            raise SpecllmError(f"token {token} is not allowed by the grammar here")
        L.llama_sampler_accept(self._sampler, token)

    def close(self) -> None:
        sampler, self._sampler = getattr(self, "_sampler", None), None
        if sampler:
            L.llama_sampler_free(sampler)

    def __del__(self):
        self.close()


# Narrowing the ids to check by their first bytes costs a few numpy passes over them: worth it for
# thousands (a check costs about 0.4 microseconds a token), not for a head of 64
_NARROWED_FROM = 4096
_PROBE_DEPTH = 3  # first bytes: 1, 2 and 3


class _Prefixes:
    """A vocabulary's probes: for each token, the longest of its first 1 to _PROBE_DEPTH bytes
    that is a token's whole text (its probe: `deepest`; n_vocab where it has none). llama.cpp's
    grammar reads a token's text a character (or a character's first bytes) at a time and refuses
    it where it refuses one, so it refuses every token whose probe it refuses: a few hundred
    questions rule out most of a 152k vocabulary at a JSON object's first token. The texts are
    llama.cpp's own (special pieces, as its grammar reads them). An end of generation is allowed by
    no text: no probe, and none of its own. A grammar that names tokens (<[id]>, !<...>) allows
    them by id, not text: it is never narrowed."""

    def __init__(self, model: Model):
        n = model.n_vocab
        eog = {t for t in model.markup_tokens if model.is_eog(t)}
        pieces = [b"" if t in eog else piece for t, piece in enumerate(model.pieces.special)]
        spelling: dict[bytes, int] = {}
        for t, piece in enumerate(pieces):
            if piece:
                spelling.setdefault(piece, t)
        self.deepest = np.full(n + 1, n, dtype=np.intp)
        for t, piece in enumerate(pieces):
            for depth in range(min(len(piece) - 1, _PROBE_DEPTH), 0, -1):
                probe = spelling.get(piece[:depth])
                if probe is not None:
                    self.deepest[t] = probe
                    break
        probes = np.unique(self.deepest[:n])
        probes = probes[probes < n]
        lengths = np.array([len(pieces[t]) for t in probes])
        # a probe's own probe is shorter: asked first
        self.by_length = [probes[lengths == length] for length in range(1, _PROBE_DEPTH + 1)]


_PREFIXES: "weakref.WeakKeyDictionary[Model, _Prefixes]" = weakref.WeakKeyDictionary()


def _prefixes(model: Model) -> _Prefixes:
    """A vocabulary's _Prefixes, found once per model (from Model.pieces)."""
    if model not in _PREFIXES:
        _PREFIXES[model] = _Prefixes(model)
    return _PREFIXES[model]


def find_probes(model: Model) -> None:
    """Find the vocabulary's probes now, if they are not yet (Grammar.allowed's narrowing: half a
    second for 152k tokens, once per model), so that timing a grammar's mask times only the mask."""
    _prefixes(model)


def _names_tokens(text: str) -> bool:
    """Whether GBNF `text` names a token (`<[id]>`, `<|im_end|>`, `!<...>`) outside its strings,
    character classes and comments."""
    bare = _LITERALS.sub(lambda literal: literal[0] if literal[0].startswith("<") else "", text)  # tokens kept
    return "<" in bare or "!" in bare


def after_whitespace(text: str, root: str = "root") -> tuple[str, str]:
    """A grammar (GBNF text) and the name of its start symbol that take whitespace first, then what
    `text`'s `root` takes: an answer after a think block, which may begin on a new line."""
    name = _new_rule(text, "answer-after-whitespace")
    return f"{text}\n{name} ::= [ \\t\\n\\r]* {root}\n", name


def or_call(text: str, opening: str, names: tuple[str, ...] = ()) -> tuple[str, str]:
    """A grammar (GBNF text) and the name of its start symbol that take what `text`'s root takes,
    or a tool call's opening (call_opening) followed by any text: an answer, or a call
    (constrained.py frees the text once the opening is written; the text after it here only lets
    a token run past its end)."""
    name = _new_rule(text, "answer-or-call")
    return f"{text}\n{name} ::= root | {call_opening(opening, names)} [^\\x00]*\n", name


def call_opening(opening: str, names: tuple[str, ...] = ()) -> str:
    """A GBNF expression for a tool call's opening: `opening`, or with the tools' `names` a fenced
    JSON call naming one (fenced_call). The call may begin with a space or new lines, as a
    template's may (Bielik's "\\n<tool_call>", DeepSeek V4's "\\n\\n"), bounded as llama.cpp's
    JSON grammars bound their whitespace. The one description of an opening: or_call's grammar
    takes it before a call, and constrained.py reads the answer with it to tell when the opening
    is written."""
    spaces = '( " " | "\\n"{1,2} [ \\t]{0,20} )?'
    fenced = f" | {fenced_call(names)}" if names else ""
    return f"{spaces} ( {gbnf_literal(opening)}{fenced} )"


def fenced_call(names: tuple[str, ...]) -> str:
    """GBNF for the opening of a call written in a fenced code block, as the reply reader reads one
    (serve/tool_calls.py's _fenced; the default pair's Qwen2.5-Coder writes its calls so): a fence,
    "json" or no language, then a JSON object up to its "name", one of the tools' `names` as JSON
    writes it (json.dumps, non-ASCII as itself). No other spelling of it (a \\u escape): as
    llama.cpp's grammars write a tool's name, the model writes the name it was offered."""
    spaces = "[ \\t\\n\\r]{0,20}"  # JSON's whitespace, bounded as llama.cpp's JSON grammars bound it
    named = " | ".join(gbnf_literal(json.dumps(name, ensure_ascii=False)) for name in names)
    return f'"```" "json"? {spaces} "{{" {spaces} "\\"name\\"" {spaces} ":" {spaces} ( {named} )'


def gbnf_literal(text: str) -> str:
    """`text` as a GBNF string literal: quotes and backslashes escaped, control characters as \\x."""
    escaped = "".join(
        "\\" + c if c in '"\\' else f"\\x{ord(c):02x}" if ord(c) < 0x20 or c == "\x7f" else c for c in text
    )
    return f'"{escaped}"'


def _new_rule(text: str, name: str) -> str:
    """`name`, lengthened until it is no rule of the grammar's own."""
    while name in text:
        name += "x"
    return name


def schema_text(schema: object) -> str:
    """A JSON schema (a dict, or its JSON text) as JSON text, checked to be a JSON object and to
    turn into a grammar."""
    schema = _schema_object(schema)
    try:
        text = json.dumps(schema)
    except (TypeError, ValueError) as e:
        raise GrammarInvalid(f"the JSON schema is not JSON: {e}") from None
    except RecursionError:  # a dict nested deeper than Python's stack
        raise GrammarInvalid(_TOO_DEEP) from None
    schema_grammar(schema)
    return text


def schema_grammar(schema: object) -> str:
    """A JSON schema (a dict, or its JSON text) as GBNF, as llama-cpp-python converts it with what
    llama-server reads besides (specllm/llama/schema.py); {} is any JSON object, as in llama-server."""
    schema = _schema_object(schema)
    _check_schema(schema)
    return _converted(json.dumps(schema or _EMPTY_OBJECT_SCHEMA))


@functools.lru_cache(maxsize=8)
def _converted(schema_json: str) -> str:
    """A schema's grammar, kept: a request's schema is checked, then configured, then used (a schema
    of many optional properties takes seconds each time)."""
    try:
        return json_schema_to_gbnf(json.loads(schema_json))
    except GrammarInvalid:
        raise
    except Exception as e:  # the converter raises what it meets: KeyError, ValueError, TypeError, ...
        raise GrammarInvalid(f"the JSON schema cannot be turned into a grammar: {_message(e)}") from None


def _schema_object(schema: object) -> dict:
    """A JSON schema given as a dict or as its JSON text, as a dict."""
    if isinstance(schema, str):
        try:
            schema = json.loads(schema)
        except ValueError as e:
            raise GrammarInvalid(f"the JSON schema is not JSON: {e}") from None
        except RecursionError:
            raise GrammarInvalid(_TOO_DEEP) from None
    if not isinstance(schema, dict):
        raise GrammarInvalid(f"a JSON schema is a JSON object, not {type(schema).__name__}")
    return schema


def _check_size(text: str) -> None:
    """Refuses a grammar nested deeper, or of more rules, than llama.cpp's C code can take, or with
    a repetition it would take as endless."""
    structure = _LITERALS.sub("", text)
    rules = structure.count("::=")
    if rules > MAX_RULES:
        raise GrammarInvalid(f"the grammar has {rules} rules, more than the {MAX_RULES} it may have")
    depth = deepest = 0
    for paren in re.findall(r"[()]", structure):
        depth += 1 if paren == "(" else -1
        deepest = max(deepest, depth)
    if deepest > MAX_NESTING:
        raise GrammarInvalid(f"the grammar nests groups {deepest} deep, more than the {MAX_NESTING} it may")
    for match in _COUNTED.finditer(structure):
        if int(match.group(2)) < int(match.group(1)):
            raise GrammarInvalid(f"the grammar repeats {match.group(0)}: a maximum below its minimum")


def _check_schema(schema: dict) -> None:
    """Refuses a schema that repeats something more than MAX_REPETITIONS times (a count of items or
    characters, or a pattern's {m,n}), or that refers to a schema outside it, naming where (a JSON
    pointer)."""
    pending: list[tuple[object, str]] = [(schema, "")]
    while pending:  # not recursive: a schema given as a dict may nest deeper than Python's stack
        node, path = pending.pop()
        if isinstance(node, list):
            pending.extend((item, f"{path}/{i}") for i, item in enumerate(node))
        if not isinstance(node, dict):
            continue
        for key, value in node.items():
            where = f"{path}/{str(key).replace('~', '~0').replace('/', '~1')}"
            if key in _COUNT_KEYS and isinstance(value, int) and value > MAX_REPETITIONS:
                raise GrammarInvalid(
                    f"the JSON schema's {where} {value} is past the {MAX_REPETITIONS} repetitions a grammar may have"
                )
            if key == "pattern" and isinstance(value, str):
                _check_pattern(value, where)
            if key == "$ref" and isinstance(value, str) and not value.startswith("#"):
                # the converter would fetch an https one where Python runs without asserts (-O)
                raise GrammarInvalid(f"the JSON schema's {where} {value} is not within it: no schema is fetched")
            if key not in _VALUE_KEYS:
                pending.append((value, where))


def _check_pattern(pattern: str, where: str) -> None:
    for match in _PATTERN_COUNTS.finditer(pattern):
        if any(count and int(count) > MAX_REPETITIONS for count in match.groups()):
            raise GrammarInvalid(f"the JSON schema's {where} repeats {match.group(0)}: past {_THE_LIMIT}")


@contextlib.contextmanager
def _stderr_kept():
    """What is printed on file descriptor 2 meanwhile (llama.cpp's C code writes there directly),
    kept from the terminal: a list that holds the text once the block ends."""
    printed: list[str] = []
    sys.stderr.flush()
    saved = os.dup(2)
    with tempfile.TemporaryFile() as kept:
        os.dup2(kept.fileno(), 2)
        try:
            yield printed
        finally:
            os.dup2(saved, 2)
            os.close(saved)
            kept.seek(0)
            printed.append(kept.read().decode("utf-8", errors="replace"))


def _why(printed: list[str]) -> str:
    """llama.cpp's reason for refusing a grammar: the line it printed, or its error log's."""
    said = re.search(r"error parsing grammar: (.*)", "".join(printed))
    if said:
        return said.group(1).strip()
    lines = [line.split(": ", 1)[-1] for line in recent_errors if "failed to parse grammar" not in line]
    return lines[0] if lines else "llama.cpp refused it"


def _message(error: Exception) -> str:
    text = str(error).strip().splitlines()
    return text[0] if text else type(error).__name__

"""A JSON schema's `pattern` (a regular expression) as GBNF, read as llama-server's converter reads
it (llama.cpp's common/json-schema-to-grammar.cpp, `_visit_pattern`), where llama-cpp-python's
asserts or writes a grammar that does not parse:

- a pattern anchored with `^...$` becomes a rule for the JSON string it matches: literals,
  character classes, `.` (not a line break), groups (`(?:...)` too), alternatives and the
  quantifiers `*`, `+`, `?`, `{m}`, `{m,}`, `{,n}` and `{m,n}`; an escape is kept only where GBNF
  has it (`\\t`, `\\xHH`, `\\u`, `\\"`, ...) or is the regex's own for a special character (`\\.`);
- what is a regular expression but has no GBNF (no anchors, `\\d`, `\\w`, a lookaround, an anchor
  inside, a stray `]` or `}`, a count that is no number) is UnsupportedPattern: llama.cpp then
  takes any string, with a warning;
- what is no regular expression (unbalanced parentheses, an unterminated class, nothing to repeat,
  a trailing backslash) is InvalidPattern: llama.cpp refuses the schema; so is a count `{m,n}` with
  n < m, which llama.cpp writes into its grammar (its parser then takes it as endless).
"""

from collections.abc import Callable

_INT_MAX = 2**31 - 1  # a count's "no maximum" (std::numeric_limits<int>::max())
MAX_DEPTH = 100  # groups nested deeper are not supported (MAX_PATTERN_DEPTH)
DOT = "[^\\x0A\\x0D]"  # `.`: any character but a line break
_NON_LITERAL = set("|.()[]{}*+?^$")
_ESCAPED_IN_REGEXPS_BUT_NOT_IN_LITERALS = set("^$.[]()|{}*+?")
_GBNF_ESCAPES = set('trn\\"[]-')  # the one-character escapes llama.cpp's grammar parser knows
_HEX_DIGITS = {"x": 2, "u": 4, "U": 8}


class UnsupportedPattern(ValueError):
    """A valid regular expression that has no grammar: llama.cpp takes any string for it."""


class InvalidPattern(ValueError):
    """Not a valid regular expression: llama.cpp refuses the schema."""


def pattern_rule(pattern: str, name: str, add_rule: Callable[[str, str], str]) -> str:
    """The GBNF body of a JSON string that matches `pattern`, as llama.cpp writes it; `add_rule`
    (name, body) -> the name it was given adds the rules of a repeated group or class and of `.`."""
    if len(pattern) < 2 or pattern[0] != "^" or pattern[-1] != "$":
        raise UnsupportedPattern("not anchored with '^' and '$'")
    reader = _Reader(pattern[1:-1], name, add_rule)
    rule = reader.sequence()
    if reader.depth != 0:
        raise InvalidPattern("unbalanced parentheses")
    return f'"\\"" ({rule}) "\\""'


class _Reader:
    """llama.cpp's `transform`: reads the pattern from `i` on, one sequence per group."""

    def __init__(self, pattern: str, name: str, add_rule: Callable[[str, str], str]):
        self.pattern, self.name, self.add_rule = pattern, name, add_rule
        self.i = self.depth = 0
        self.repeated: dict[str, str] = {}  # a repeated item's rule name, by its text

    def sequence(self) -> str:
        """Items up to the `)` that closes the group (or the end), as GBNF."""
        seq: list[tuple[str, bool]] = []  # (text, whether it is a literal's inside)
        p = self.pattern
        while self.i < len(p):
            c = p[self.i]
            if c == ".":
                seq.append((self.add_rule("dot", DOT), False))
                self.i += 1
            elif c == "(":
                seq.append((f"({self._group()})", False))
            elif c == ")":
                self.i += 1
                if self.depth == 0:
                    raise InvalidPattern("unbalanced parentheses")
                self.depth -= 1
                return _joined(seq)
            elif c in "^$":
                raise UnsupportedPattern("anchor inside the pattern")
            elif c == "[":
                seq.append((self._class(), False))
            elif c == "|":
                seq.append(("|", False))
                self.i += 1
            elif c in "*+?":
                if not seq:
                    raise InvalidPattern("nothing to repeat")
                seq[-1] = (_rule(seq[-1]) + c, False)
                self.i += 1
            elif c == "{":
                low, high = self._counts()
                if not seq:
                    raise InvalidPattern("nothing to repeat")
                seq[-1] = (_repetition(self._item(seq[-1]), low, high), False)
            else:
                seq.append((self._literal(), True))
        return _joined(seq)

    def _group(self) -> str:
        p = self.pattern
        self.i += 1
        if self.i < len(p) and p[self.i] == "?":
            if self.i + 1 < len(p) and p[self.i + 1] == ":":
                self.i += 2  # a non-capturing group is a group
            else:
                raise UnsupportedPattern("unsupported group syntax")  # a lookaround, a named group, flags
        self.depth += 1
        if self.depth > MAX_DEPTH:
            raise UnsupportedPattern("pattern nesting too deep")
        return self.sequence()

    def _class(self) -> str:
        p, out = self.pattern, "["
        self.i += 1
        while self.i < len(p) and p[self.i] != "]":
            n = _escape_length(p, self.i) if p[self.i] == "\\" else 1
            if n == 0:
                raise UnsupportedPattern(f"unsupported escape in character class: {p[self.i : self.i + 2]}")
            out += p[self.i : self.i + n]
            self.i += n
        if self.i >= len(p):
            raise InvalidPattern("unterminated character class")
        self.i += 1
        return out + "]"

    def _counts(self) -> tuple[int, int]:
        """A `{...}` quantifier's least and greatest counts (_INT_MAX: none)."""
        p, start = self.pattern, self.i + 1
        end = p.find("}", start)
        if end < 0:
            raise UnsupportedPattern("unterminated curly brackets")
        self.i = end + 1
        nums = p[start:end].split(",")
        if len(nums) == 1:
            return _stoi(nums[0]), _stoi(nums[0])
        if len(nums) != 2:
            raise UnsupportedPattern("wrong number of values in curly brackets")
        low, high = (_stoi(nums[0]) if nums[0] else 0), (_stoi(nums[1]) if nums[1] else _INT_MAX)
        if high < low:
            # no regular expression takes it; llama.cpp writes it into its grammar, whose parser
            # then takes {m,n} with n < m as endless
            raise InvalidPattern(f"the count {p[start - 1 : end + 1]} has its maximum below its minimum")
        return low, high

    def _item(self, item: tuple[str, bool]) -> str:
        """What a `{m,n}` repeats: a literal as it is, anything else by a rule of its own."""
        text, is_literal = item
        if is_literal:
            return f'"{text}"'
        if text not in self.repeated:
            self.repeated[text] = self.add_rule(f"{self.name}-{len(self.repeated) + 1}", text)
        return self.repeated[text]

    def _literal(self) -> str:
        """The longest run of plain characters from `i` that no quantifier follows (but for its
        first), escapes read."""
        p, first, out = self.pattern, self.pattern[self.i], ""
        while self.i < len(p):
            c = p[self.i]
            if c == "\\":
                if self.i == len(p) - 1:
                    raise InvalidPattern("trailing backslash")
                if p[self.i + 1] in _ESCAPED_IN_REGEXPS_BUT_NOT_IN_LITERALS:
                    out += p[self.i + 1]
                    self.i += 2
                    continue
                n = _escape_length(p, self.i)
                if n == 0:
                    raise UnsupportedPattern(f"unsupported escape: {p[self.i : self.i + 2]}")
                out += p[self.i : self.i + n]
                self.i += n
            elif c == '"':
                out += '\\"'
                self.i += 1
            elif c not in _NON_LITERAL and (
                self.i == len(p) - 1 or not out or p[self.i + 1] == "." or p[self.i + 1] not in _NON_LITERAL
            ):
                out += c
                self.i += 1
            else:
                break
        if not out:  # nothing read: a stray "]" or "}"
            raise UnsupportedPattern(f"unsupported character: {first}")
        return out


def _rule(item: tuple[str, bool]) -> str:
    text, is_literal = item
    return f'"{text}"' if is_literal else text


def _joined(seq: list[tuple[str, bool]]) -> str:
    """A sequence's items as GBNF, runs of literals merged into one."""
    merged: list[tuple[str, bool]] = []
    for text, is_literal in seq:
        if is_literal and merged and merged[-1][1]:
            merged[-1] = (merged[-1][0] + text, True)
        else:
            merged.append((text, is_literal))
    return " ".join(_rule(item) for item in merged)


def _repetition(item: str, low: int, high: int) -> str:
    """`item` from `low` to `high` times (_INT_MAX: no maximum), as llama.cpp's build_repetition
    writes it without a separator."""
    if high == 0:
        return ""
    if low == 0 and high == 1:
        return f"{item}?"
    if high == _INT_MAX and low in (0, 1):
        return f"{item}{'*+'[low]}"
    return f"{item}{{{low},{'' if high == _INT_MAX else high}}}"


def _stoi(text: str) -> int:
    """std::stoi: leading whitespace, a sign, digits, and whatever follows them ignored."""
    digits = text.lstrip(" \t\n\v\f\r")
    sign = digits[:1] if digits[:1] in ("+", "-") else ""
    run = len(digits[len(sign) :]) - len(digits[len(sign) :].lstrip("0123456789"))
    if run == 0:
        raise UnsupportedPattern("invalid number in curly brackets")
    value = int(digits[: len(sign) + run])
    if not -(2**31) <= value <= _INT_MAX:
        raise UnsupportedPattern("invalid number in curly brackets")
    return value


def _escape_length(pattern: str, pos: int) -> int:
    """How long the escape at `pos` is where GBNF has it (llama.cpp's gbnf_escape_length); 0: none."""
    if pos + 1 >= len(pattern) or pattern[pos] != "\\":
        return 0
    kind = pattern[pos + 1]
    if kind not in _HEX_DIGITS:
        return 2 if kind in _GBNF_ESCAPES else 0
    digits = pattern[pos + 2 : pos + 2 + _HEX_DIGITS[kind]]
    if len(digits) < _HEX_DIGITS[kind] or any(h not in "0123456789abcdefABCDEF" for h in digits):
        return 0
    return 2 + len(digits)

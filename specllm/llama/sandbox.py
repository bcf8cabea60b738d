"""The sandbox chat templates render in: Jinja's immutable sandbox, with a size check before each
operation of a template that could make a large value, and a deadline on a rendering.

A template comes from the model file, so it is untrusted. Jinja's sandbox keeps it from files and
private attributes, not from memory or time: `"x" * 10**10` or `10 ** (10**9)` would allocate
gigabytes, and two nested loops over a long string run for hours without a single range() call.
Here each operation that can make something larger than what it was given (the operators `*`, `**`,
`+`, `%` and `~`, the filters and str methods that pad, repeat, format or join, a container written
in the template, what a namespace is given, a block of output gathered before it is joined) works
out the size of its result first and refuses one past the bound. Python compares containers in C,
where no deadline reaches: `==`, `in`, `<`, the tests that compare and a list's count() and index()
measure the containers they are given first (but for a constant of the template's own), and the
filters that sort or compare (sort, min, max, unique, groupby, dictsort) measure what they compare,
together. Time: each loop step, call, intercepted operator and filter checks the clock against the
rendering's deadline. That is far cheaper than a trace function, which runs at each line: with one,
Gemma 4's template rendered a 200-turn conversation in 1.4 s instead of 0.4 s; with all these
checks, in 0.48 s (and the simpler templates' few milliseconds grow by one to three). It is as
thorough: between two checks a template runs only straight-line code, whose operations are each
bounded in size, and so in time.

Lists: as llama.cpp's engine, a template may append to a list and pop from it, but only to and
from a list it wrote itself ([...], a TemplateList): never the caller's messages or tools, nor a
list a filter made. Each item appended is measured and counted in its list's size, which stays
within the bound. A list already put in another container (written in a list, tuple or dict,
appended, passed to a macro's varargs or to cycler) is sealed: a size measured once stays true,
and two lists that share another many times over cannot grow past their measure after it. A
namespace's attributes are the template's variables: a list one holds itself is not sealed."""

import contextlib
import functools
import itertools
import re
import string
import threading
import time
from collections.abc import Callable, Iterator, Mapping, MappingView
from typing import Any

import jinja2.filters
import jinja2.utils
from jinja2 import nodes
from jinja2.compiler import CodeGenerator, Frame, operators, optimizeconst
from jinja2.exceptions import SecurityError
from jinja2.runtime import BlockReference, Macro
from jinja2.sandbox import ImmutableSandboxedEnvironment
from markupsafe import Markup

_STAR_OR_WIDTH = re.compile(r"%(?:\([^)]*\))?[-#0 +]*(\*|\d*)(?:\.(\*|\d*))?[hlL]?(.)")
_SPEC_NUMBER = re.compile(r"\d+")


ITEM_SIZE = 32  # what an item of a list or dict counts for in a size: about its memory, in bytes
CONTAINERS = (list, tuple, jinja2.utils.Namespace, set, frozenset, Mapping, MappingView)  # the ABCs last: slower
SORTING_FILTERS = ("sort", "min", "max", "unique", "groupby", "dictsort")  # compare their items in C
LISTING_FILTERS = ("tojson", *SORTING_FILTERS)  # take an iterator (map's) as the list llama.cpp's give
COMPARING_TESTS = frozenset(
    {"==", "eq", "equalto", "!=", "ne", "<", "lt", "lessthan", "<=", "le", ">", "gt", "greaterthan", ">=", "ge", "in"}
)


class TemplateList(list):
    """A list the template wrote itself: it may append to it and pop from it (see the module's
    docstring), until it is sealed. `size` is its measure, kept as it changes."""

    __slots__ = ("size", "sealed")
    CHANGES = frozenset({"append", "pop"})  # what llama.cpp's engine allows on a list

    def __init__(self, items, size: int):
        super().__init__(items)
        self.size, self.sealed = size, False


def measure(value, limit: int, seal: bool = False) -> tuple[int, int]:
    """(size, depth) of a value: about the length of its text (a string's length and quotes, a
    number's digits, a container's items at ITEM_SIZE each and their own sizes, each counted as
    often as it occurs), and how deeply containers nest in it. Counting stops once the size passes
    `limit`, so the walk takes at most limit / ITEM_SIZE steps, even for a list that holds itself
    many times over through shared items. A level at a time: no call per item. With `seal`, each
    TemplateList in it is sealed."""
    size, depth, level = 0, 0, [value]
    while level and size <= limit:
        inner: list = []
        for item in level:
            if isinstance(item, str):
                size += len(item) + 2  # quotes, when inside a container
            elif isinstance(item, int):
                size += item.bit_length() // 3 + 1  # at least its decimal digits
            elif isinstance(item, CONTAINERS):
                if seal and isinstance(item, TemplateList):
                    item.sealed = True
                items = _children(item)
                size += 2 + ITEM_SIZE * len(items)
                if size > limit:
                    break
                inner.extend(items)
            else:
                size += 24  # a float, None, Undefined, a macro: a short text
        depth, level = depth + bool(inner), inner
    return size, depth


def _children(container) -> list | tuple:
    if isinstance(container, (list, tuple)):
        return container
    if isinstance(container, jinja2.utils.Namespace):
        container = container._Namespace__attrs  # (its repr shows them)
    if isinstance(container, Mapping):
        return [*container.keys(), *container.values()]
    return list(container)


def percent_size(text: str, args, limit: int) -> int:
    """At least the length of `text % args`: its own text, the widths and precisions it asks for,
    and for each conversion the largest argument (a `*` width takes an int argument)."""
    values = list(args.values()) if isinstance(args, Mapping) else list(args) if isinstance(args, tuple) else [args]
    largest = max((measure(v, limit)[0] for v in values), default=0)
    size = len(text)
    for match in _STAR_OR_WIDTH.finditer(text):
        width, precision, _ = match.groups()
        stars = (width == "*") + (precision == "*")
        size += int(width if width.isdigit() else 0) + int(precision if precision and precision.isdigit() else 0)
        size += largest + stars * max((abs(v) for v in values if isinstance(v, int)), default=0)
    return size


def braces_size(text: str, args, kwargs, limit: int) -> int:
    """At least the length of `text.format(*args, **kwargs)`, as percent_size does for `%`."""
    values = [*args, *kwargs.values()]
    largest = max((measure(v, limit)[0] for v in values), default=0)
    widest = max((abs(v) for v in values if isinstance(v, int)), default=0)
    size = len(text)
    for _, field, spec, _ in string.Formatter().parse(text):
        if field is not None:
            numbers = [int(n) for n in _SPEC_NUMBER.findall(spec or "")]
            size += largest + sum(numbers) + (widest if "{" in (spec or "") else 0)
    return size


def replaced_size(text: str, old: str, new: str, count: int = -1) -> int:
    """The length of text.replace(old, new, count), without making it."""
    found = text.count(old) if old else len(text) + 1
    if count is not None and count >= 0:
        found = min(found, count)
    return len(text) + found * (len(new) - len(old))


class TemplateTooBig(ValueError):
    """A template's operation would build a value past the rendering's bound."""


class TemplateTooSlow(ValueError):
    """A template's rendering ran past its deadline."""


class OutputBuffer(list):
    """The list Jinja gathers a macro's, a call block's or a {% set %} block's output in, refusing
    text past `limit` characters as it comes (the join at the end would be too late)."""

    def __init__(self, limit: int):
        super().__init__()
        self.limit = self.left = limit

    def append(self, text) -> None:
        self._take(len(text))
        super().append(text)

    def extend(self, texts) -> None:
        texts = tuple(texts)
        self._take(sum(map(len, texts)))
        super().extend(texts)

    def _take(self, chars: int) -> None:
        self.left -= chars
        if self.left < 0:
            raise TemplateTooBig(f"a block of its output grows past {self.limit} characters")


class NamespaceAttributes:
    """What a template's `{% set ns.attr = value %}` assigns through (`[ns, "attr"] = value`): a
    namespace is a container too, and what it holds is measured as it comes."""

    def __init__(self, sandbox: "BoundedSandbox"):
        self.sandbox = sandbox

    def __setitem__(self, key: tuple[jinja2.utils.Namespace, str], value) -> None:
        namespace, name = key
        if not isinstance(value, (str, int, float)) and value is not None:  # their size is bounded as made
            self.sandbox.held_size(value)
        namespace[name] = value


class BoundedCodeGenerator(CodeGenerator):
    """Jinja's code generator, with output buffers that count, loops that check the clock, and
    `~` and containers written in the template ([...], (...), {...}) that check their size."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self._loop_iterables: set[int] = set()  # (ids: Jinja's nodes compare by value)

    def buffer(self, frame: Frame) -> None:
        frame.buffer = self.temporary_identifier()
        self.writeline(f"{frame.buffer} = environment.output_buffer()")

    def visit_For(self, node: nodes.For, frame: Frame) -> None:
        self._loop_iterables.add(id(node.iter))
        super().visit_For(node, frame)

    def visit(self, node: nodes.Node, *args, **kwargs) -> Any:
        """As Jinja's, but a loop's iterable is wrapped in `environment.timed(...)`."""
        if id(node) not in self._loop_iterables:
            return super().visit(node, *args, **kwargs)
        self._loop_iterables.discard(id(node))
        self.write("environment.timed(")
        super().visit(node, *args, **kwargs)
        self.write(")")

    @optimizeconst
    def visit_Concat(self, node: nodes.Concat, frame: Frame) -> None:
        if frame.eval_ctx.volatile:
            join = "(markup_join if context.eval_ctx.volatile else str_join)"
        elif frame.eval_ctx.autoescape:
            join = "markup_join"
        else:
            join = "str_join"
        self.write(f"environment.join_operands({join}, (")
        for arg in node.nodes:
            self.visit(arg, frame)
            self.write(", ")
        self.write("))")

    # A list that holds a list twice, made again from itself a few dozen times, is small in memory
    # and a few lines of template, but far too large to write or compare: each container a template
    # writes out is measured as it is made (and what it holds sealed); a list, as a TemplateList.

    def visit_List(self, node: nodes.List, frame: Frame) -> None:
        self._checked("template_list", super().visit_List, node, frame)

    def visit_Const(self, node: nodes.Const, frame: Frame) -> None:
        """As Jinja's; a list of constants, which its optimizer folds into one, is a TemplateList."""
        if isinstance(node.value, list):
            self._checked("template_list", super().visit_Const, node, frame)
        else:
            super().visit_Const(node, frame)

    def visit_Dict(self, node: nodes.Dict, frame: Frame) -> None:
        self._checked("container", super().visit_Dict, node, frame)

    def visit_Tuple(self, node: nodes.Tuple, frame: Frame) -> None:
        if node.ctx != "load":  # the names a {% set a, b = ... %} assigns to
            super().visit_Tuple(node, frame)
        else:
            self._checked("container", super().visit_Tuple, node, frame)

    def visit_NSRef(self, node: nodes.NSRef, frame: Frame) -> None:
        """`ns.attr` assigned to (by {% set %}, alone or in a tuple): through the environment's
        NamespaceAttributes, which measure the value first."""
        self.writeline(f"environment.namespace_attributes[{frame.symbols.ref(node.name)}, {node.attr!r}]")

    # Python compares two containers in C, item by item, where no deadline reaches: unless one
    # side is a constant of the template's own (the common `message.role == 'user'`), each
    # operand that is a container is measured first.

    @optimizeconst
    def visit_Compare(self, node: nodes.Compare, frame: Frame) -> None:
        if len(node.ops) == 1 and nodes.Const in (type(node.expr), type(node.ops[0].expr)):
            super().visit_Compare(node, frame)
            return
        self.write("(")
        self._checked("comparable", self.visit, node.expr, frame)
        for operand in node.ops:
            self.write(f" {operators[operand.op]} ")
            self._checked("comparable", self.visit, operand.expr, frame)
        self.write(")")

    def _checked(self, check: str, visit: Callable[[Any, Frame], None], node: nodes.Node, frame: Frame) -> None:
        self.write(f"environment.{check}(")
        visit(node, frame)
        self.write(")")


class BoundedSandbox(ImmutableSandboxedEnvironment):
    """ImmutableSandboxedEnvironment, with no operation of a template making a value of more than
    `max_chars` (a string's characters; measure's size for others) or an int of more than
    `max_int_bits` bits. It compiles and renders every template as its parent does, but for the
    checks: the same text, or an error."""

    code_generator_class = BoundedCodeGenerator
    intercepted_binops = frozenset({"*", "**", "+", "%"})

    def __init__(
        self, *args, max_chars: int, max_int_bits: int, filters: Mapping[str, Callable] | None = None, **kwargs
    ):
        """`filters` replace Jinja's of those names, checked as they are (tojson, say)."""
        self.max_chars, self.max_int_bits = max_chars, max_int_bits
        super().__init__(*args, finalize=self.checked_value, **kwargs)
        self.filters.update(filters or {}, join=self._bounded_join, sum=self._bounded_sum)
        checks = self._filter_checks()
        for name, function in self.filters.items():  # each checks the clock: one can take long on a long list
            self.filters[name] = _checked_filter(function, checks.get(name, _ignore_arguments))
        self.globals["dict"] = _returning_checked(dict, self.container)
        self.globals["cycler"] = _returning_checked(jinja2.utils.Cycler, self._sealed_cycler)
        self.globals["namespace"] = _returning_checked(jinja2.utils.Namespace, self._measured_namespace)
        self.namespace_attributes = NamespaceAttributes(self)
        for name in COMPARING_TESTS:  # `a is eq(b)`, select('equalto', b): compared as `==` is
            self.tests[name] = _checked_filter(self.tests[name], self._check_comparison)  # type: ignore[arg-type]
        for name in LISTING_FILTERS:  # listed before their checks, which go through the list
            self.filters[name] = _listing_iterators(self.filters[name])
        self.globals["lipsum"] = _checked_filter(jinja2.utils.generate_lorem_ipsum, self._check_lipsum)

    # --- what a template's operations make ------------------------------------------------------

    def refuse_past(self, size: int) -> None:
        if size > self.max_chars:
            raise TemplateTooBig(f"it makes a value of more than {self.max_chars} characters")

    def size(self, value) -> int:
        """measure's size; a string's own length, when it is not inside a container."""
        return len(value) if isinstance(value, str) else measure(value, self.max_chars)[0]

    def call_binop(self, context, operator: str, left, right):
        check_clock()
        if operator == "*":
            self._check_multiplication(left, right)
        elif operator == "**":
            self._check_power(left, right)
        elif operator == "+":
            self._check_addition(left, right)
        elif isinstance(left, str):  # % formats a string; for numbers it makes no larger one
            self.refuse_past(percent_size(left, right, self.max_chars))
        return super().call_binop(context, operator, left, right)

    def _check_multiplication(self, left, right) -> None:
        if _is_int(left) and _is_int(right):
            self._refuse_bits(abs(left).bit_length() + abs(right).bit_length())
        elif _is_int(right) and isinstance(left, (str, list, tuple)):
            self.refuse_past(self.size(left) * right)
        elif _is_int(left) and isinstance(right, (str, list, tuple)):
            self.refuse_past(self.size(right) * left)

    def _check_power(self, left, right) -> None:
        if _is_int(left) and _is_int(right) and right > 0 and abs(left) > 1:
            self._refuse_bits(abs(left).bit_length() * right)

    def _check_addition(self, left, right) -> None:
        if isinstance(left, str) and isinstance(right, str):  # the common case, kept cheap
            self.refuse_past(len(left) + len(right))
        elif isinstance(left, (list, tuple)) and isinstance(right, (list, tuple)):
            self.refuse_past(self.size(left) + self.size(right))

    def _refuse_bits(self, bits: int) -> None:
        if bits > self.max_int_bits:
            raise TemplateTooBig(f"it makes a number of more than {self.max_int_bits} bits")

    def join_operands(self, join: Callable, operands: tuple) -> str:
        """`a ~ b ~ ...`: each operand's text, joined."""
        check_clock()
        self.refuse_past(sum(len(o) if isinstance(o, str) else self.size(o) for o in operands))
        return join(operands)

    def checked_value(self, value):
        """The value, if its size is within the bound: what `{{ value }}` writes, whose text Jinja
        makes next."""
        if not isinstance(value, str):
            self.refuse_past(self.size(value))
        return value

    def container(self, value):
        """A container the template made (a tuple or dict it writes, dict()'s), if its size is
        within the bound; the lists in it are sealed."""
        self._sealed_size(value)
        return value

    def template_list(self, items: list) -> TemplateList:
        """A list the template writes: measured as a container, then one it may change."""
        return TemplateList(items, self._sealed_size(items))

    def _sealed_size(self, value) -> int:
        size = measure(value, self.max_chars, seal=True)[0]
        self.refuse_past(size)
        return size

    def held_size(self, *values) -> int:
        """The size of values a namespace holds, together within the bound, with what is in them
        sealed. A list it holds itself is not sealed: as a variable's, the template may still
        append to it (Kimi K2's templates queue their tool call ids in `namespace(ids=[])`)."""
        return self._sealed_size([value[:] if isinstance(value, TemplateList) else value for value in values])

    def _measured_namespace(self, namespace: jinja2.utils.Namespace) -> jinja2.utils.Namespace:
        """What namespace(...) made, if what it holds (its names and values) is within the bound."""
        self.held_size(*_children(namespace))
        return namespace

    def comparable(self, value):
        """An operand of a comparison: a container, if its size is within the bound."""
        if isinstance(value, CONTAINERS):
            self.refuse_past(measure(value, self.max_chars)[0])
        return value

    def _check_comparison(self, value, other=None) -> None:
        self.comparable(value)
        self.comparable(other)

    def is_safe_attribute(self, obj, attr: str, value) -> bool:
        """As the immutable sandbox's, but a TemplateList's append and pop are allowed (and
        checked in call)."""
        if isinstance(obj, TemplateList) and attr in TemplateList.CHANGES:
            return True
        return super().is_safe_attribute(obj, attr, value)

    @staticmethod
    def timed(iterable) -> Iterator:
        """A loop's items (the generated code reaches the module's functions through the environment)."""
        return timed(iterable)

    def output_buffer(self) -> OutputBuffer:
        return OutputBuffer(self.max_chars)

    # --- calls: str methods that pad, repeat or join; a block's output --------------------------

    def call(__self, __context, __obj, *args, **kwargs):  # noqa: N805 (as Jinja's, for kwargs named self)
        check_clock()
        if isinstance(__obj, BlockReference):
            return __self._render_block(__obj)
        owner, name = getattr(__obj, "__self__", None), getattr(__obj, "__name__", "")
        if isinstance(owner, TemplateList) and name in TemplateList.CHANGES:
            return __self._change_list(__context, __obj, owner, args, kwargs)
        if isinstance(__obj, Macro) and (__obj.catch_varargs or __obj.catch_kwargs):
            __self._seal_gathered(__obj, args, kwargs)
        if isinstance(owner, (list, tuple)) and name in ("count", "index") and args:  # compare each item in C
            __self._check_comparison(owner, args[0])
        if isinstance(owner, str) and name == "join" and args:
            args = (list(args[0]), *args[1:])  # measured, then joined: once, as it may be a generator
        if isinstance(owner, (str, int)) and not isinstance(owner, bool):
            __self._check_method(owner, name, args, kwargs)
        return super().call(__context, __obj, *args, **kwargs)

    def _check_method(self, owner, name: str, args: tuple, kwargs: dict) -> None:
        arguments = [*args, *kwargs.values()]
        if name in ("center", "ljust", "rjust", "zfill", "to_bytes") and arguments and _is_int(arguments[0]):
            self.refuse_past(arguments[0])
        elif name == "expandtabs" and arguments and _is_int(arguments[0]):
            self.refuse_past(len(owner) + owner.count("\t") * arguments[0])
        elif name == "replace" and len(args) >= 2 and isinstance(args[0], str) and isinstance(args[1], str):
            self.refuse_past(replaced_size(owner, *args[:2], *args[2:3]))
        elif name == "join" and args:
            self.refuse_past(self._joined_size(args[0], owner))

    def _change_list(self, context, method: Callable, items: TemplateList, args: tuple, kwargs: dict):
        """items.append(item) or items.pop(index), keeping items.size: what is appended is
        measured and sealed, and the list may not grow past the bound."""
        if items.sealed:
            raise SecurityError(f"a list's {method.__name__} is unsafe once the list is in another container")
        if method.__name__ == "pop":
            item = super().call(context, method, *args, **kwargs)
            items.size -= ITEM_SIZE + measure(item, self.max_chars)[0]
            return item
        grown = items.size + ITEM_SIZE + sum(self._sealed_size(item) for item in args)  # append's one item
        if grown > self.max_chars:
            raise TemplateTooBig(f"it grows a list past {self.max_chars} characters")
        super().call(context, method, *args, **kwargs)
        items.size = grown
        return None

    def _seal_gathered(self, macro: Macro, args: tuple, kwargs: dict) -> None:
        """The arguments a macro gathers in its varargs tuple or kwargs dict are in a container."""
        gathered = [*args[len(macro.arguments) :], *(v for k, v in kwargs.items() if k not in macro.arguments)]
        self._sealed_size(gathered)

    def wrap_str_format(self, value):
        formats = super().wrap_str_format(value)
        if formats is None:
            return None
        text = value.__self__

        @functools.wraps(formats)
        def checked_format(*args, **kwargs):
            mapping = args[0] if value.__name__ == "format_map" and args else {}
            self.refuse_past(braces_size(text, args, {**kwargs, **mapping}, self.max_chars))
            return formats(*args, **kwargs)

        return checked_format

    def _render_block(self, block: BlockReference) -> str:
        """`self.name()`: the block's output, counted as it comes, as BlockReference's call joins it."""
        out = OutputBuffer(self.max_chars)
        for chunk in block._stack[block._depth](block._context):
            out.append(chunk)
        text = "".join(out)
        return Markup(text) if block._context.eval_ctx.autoescape else text

    # --- filters and globals --------------------------------------------------------------------

    def _filter_checks(self) -> dict[str, Callable[..., None]]:
        """A check before each filter that can make more than it is given: its arguments as the
        filter's (after the context some take)."""
        return {
            "format": lambda value, *args, **kwargs: self.refuse_past(
                percent_size(str(value), kwargs or args, self.max_chars)
            ),
            "center": lambda value, width=80: self.refuse_past(max(self.size(value), width if _is_int(width) else 0)),
            "indent": self._check_indent,
            "replace": self._check_replace,
            "wordwrap": self._check_wordwrap,
            "tojson": self._check_tojson,
            "pprint": self._check_pprint,
            "list": lambda value: self.refuse_past(len(value) * ITEM_SIZE if isinstance(value, str) else 0),
            "string": lambda value: self.refuse_past(self.size(value)),
            "batch": lambda value, linecount, fill_with=None: self.refuse_past(2 * linecount),
            "slice": lambda value, slices, fill_with=None: self.refuse_past(2 * slices),
            "sort": lambda value, reverse=False, case_sensitive=False, attribute=None: self._check_compared(
                value, attribute, jinja2.filters.make_multi_attrgetter
            ),
            "min": lambda value, case_sensitive=False, attribute=None: self._check_compared(value, attribute),
            "max": lambda value, case_sensitive=False, attribute=None: self._check_compared(value, attribute),
            "unique": lambda value, case_sensitive=False, attribute=None: self._check_compared(value, attribute),
            "groupby": lambda value, attribute, default=None, case_sensitive=False: self._check_compared(
                value, attribute, functools.partial(jinja2.filters.make_attrgetter, default=default)
            ),
            "dictsort": lambda value, case_sensitive=False, by="key", reverse=False: self._check_compared(value),
        }

    def _check_compared(self, values, attribute=None, getter: Callable = jinja2.filters.make_attrgetter) -> None:
        """Python sorts and compares in C, where no deadline reaches, each comparison taking up to
        the size of what it compares: what a filter compares (its values, or their `attribute` got
        as the filter gets it) is measured first, together within the bound, so a sort's work is at
        most the bound times log n. (Strings the filter lowers stay about as long.)"""
        if attribute is not None:
            values = map(getter(self, attribute), values)
        self.refuse_past(measure(list(values), self.max_chars)[0])

    def _check_indent(self, text, width=4, first=False, blank=False) -> None:
        indent = width if _is_int(width) else len(str(width))
        lines = str(text).count("\n") + 1 if isinstance(text, str) else self.size(text)
        self.refuse_past(indent)
        self.refuse_past(self.size(text) + lines * indent)

    def _check_replace(self, text, old, new, count=None) -> None:
        if isinstance(text, str) and isinstance(old, str) and isinstance(new, str):
            self.refuse_past(replaced_size(text, old, new, -1 if count is None else count))
        else:
            self.refuse_past(self.size(text) * (2 + self.size(new)))

    def _check_wordwrap(self, text, width=79, break_long_words=True, wrapstring=None, break_on_hyphens=True) -> None:
        self.refuse_past(self.size(text) * (1 + len(wrapstring or "\n")))

    def _check_tojson(self, value, ensure_ascii=False, indent=None, separators=None, sort_keys=False) -> None:
        size, depth = measure(value, self.max_chars)
        indent_chars = indent if _is_int(indent) else len(indent) if isinstance(indent, str) else 0
        separator_chars = self.size(separators) if separators else 0
        self.refuse_past(indent_chars)
        self.refuse_past(size * (6 + depth * indent_chars + separator_chars))  # "\u0000" for one character

    def _check_pprint(self, value) -> None:
        size, depth = measure(value, self.max_chars)
        self.refuse_past((size + 1) * (4 + depth))  # pprint indents nested items

    def _sealed_cycler(self, cycler: jinja2.utils.Cycler) -> jinja2.utils.Cycler:
        self.container(cycler.items)
        return cycler

    def _check_lipsum(self, n=5, html=True, min=20, max=100) -> None:  # noqa: A002 (lipsum's names)
        self.refuse_past(n * (max * 12 + 20))  # a word is at most 12 characters

    @jinja2.filters.pass_eval_context
    def _bounded_join(self, eval_ctx, value, d: str = "", attribute=None):
        items = list(value)  # once: it may be a generator
        self.refuse_past(self._joined_size(items, d))
        return jinja2.filters.do_join(eval_ctx, items, d, attribute)

    @jinja2.filters.pass_environment
    def _bounded_sum(self, environment, iterable, attribute=None, start=0):
        """Python's sum of lists makes each partial sum anew, in C, where no deadline reaches: the
        items it copies in all must be within the bound too."""
        items = list(iterable)
        if attribute is not None:
            items = list(map(jinja2.filters.make_attrgetter(environment, attribute), items))
        if isinstance(start, (list, tuple)):
            lengths = [len(item) if isinstance(item, (list, tuple)) else 0 for item in items]
            copied = len(start) * len(items) + sum(itertools.accumulate(lengths))
            self.refuse_past(copied * ITEM_SIZE)
        return sum(items, start)

    def _joined_size(self, items: list, separator) -> int:
        return sum(self.size(item) for item in items) + len(items) * self.size(separator)


def _checked_filter(function: Callable, check: Callable[..., None]) -> Callable:
    """`function` (a filter, or a global), calling `check` on its arguments first (not on the
    context a filter may take first)."""
    takes_context = getattr(function, "jinja_pass_arg", None) is not None

    @functools.wraps(function)
    def checked(*args, **kwargs):
        check_clock()
        check(*args[takes_context:], **kwargs)
        return function(*args, **kwargs)

    return checked


def _listing_iterators(function: Callable) -> Callable:
    """A filter that takes what Jinja's map, select, reject and reverse give (an iterator) as the
    list llama.cpp's give, before its checks (its value: after the context some take)."""
    at = int(getattr(function, "jinja_pass_arg", None) is not None)

    @functools.wraps(function)
    def listing(*args, **kwargs):
        if len(args) > at and isinstance(args[at], Iterator):
            args = (*args[:at], list(args[at]), *args[at + 1 :])
        return function(*args, **kwargs)

    return listing


def _ignore_arguments(*args, **kwargs) -> None:
    pass


def _returning_checked(function: Callable, check: Callable[[Any], Any]) -> Callable:
    @functools.wraps(function)
    def checked(*args, **kwargs):
        return check(function(*args, **kwargs))

    return checked


def _is_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


# --- the deadline -------------------------------------------------------------------------------

_clock = threading.local()  # this thread's rendering's (end, seconds); a serve worker renders on its own


@contextlib.contextmanager
def deadline(seconds: float) -> Iterator[None]:
    """Within the block, a template's code raises TemplateTooSlow once `seconds` have passed (at
    its next loop step, call, intercepted operator or filter)."""
    previous = getattr(_clock, "deadline", None)
    _clock.deadline = (time.monotonic() + seconds, seconds)
    try:
        yield
    finally:
        _clock.deadline = previous


def check_clock() -> None:
    """Raise TemplateTooSlow past this thread's deadline, if it has one."""
    current = getattr(_clock, "deadline", None)
    if current is not None and time.monotonic() > current[0]:
        raise TemplateTooSlow(f"its rendering takes more than {current[1]:g} s")


def timed(iterable) -> Iterator:
    """A loop's items, checking the clock at each."""
    for item in iterable:
        check_clock()
        yield item

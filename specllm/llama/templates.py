"""Chat templates: compiled and rendered the way llama-cpp-python does, sandboxed and bounded."""

import functools
import io

# The fallback for models that carry no chat template of their own.
CHATML_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)

HARMONY_CHANNEL = "<|channel|>"  # in gpt-oss's template, and in no other
GEMMA4_RESPONSE = "<|tool_response>"  # in Gemma 4's
READS_THINKING = ("message.thinking", "message['thinking']", 'message["thinking"]')  # gpt-oss's, LFM2.5's
THINKING_BLOCK = "block['thinking']"  # Ministral 3's and Magistral's: reasoning is a block of the content
# The end of a turn that a model may spell out in text tokens, where its template writes a control
# token that ends generation only as that one token: a reply stops at it as a stop string, as
# llama.cpp adds it to a chat request's (additional_stops): (what the template holds, the string)
TURN_ENDS_SPELLED = (
    (("<role>ASSISTANT</role>", "<arg_key>"), "<|role_end|>"),  # Ling 3.0 (Bailing V3)
    (("laguna_glm_thinking",), "</assistant>"),  # poolside Laguna, after its calls
)


def turn_stops(source: str) -> tuple[str, ...]:
    """The stop strings a chat reply rendered with this template needs (TURN_ENDS_SPELLED)."""
    return tuple(stop for marks, stop in TURN_ENDS_SPELLED if all(mark in source for mark in marks))


def as_template_takes(source: str, messages: list[dict]) -> list[dict]:
    """The messages as this template takes them, as llama-server passes them. A template that
    reads an assistant's reasoning from `thinking` (gpt-oss's, LFM2.5's) gets reasoning_content
    there too; one that reads it from a "thinking" block of the content (Ministral 3's) gets it
    so, before the answer's text block: given reasoning_content only, they would drop it, and a
    chat's next prompt would no longer extend the reply as the model wrote it. gpt-oss's
    (harmony) refuses a call's message that has both content and thinking: there the content
    goes. Gemma 4's writes a call's content after the call's results, as the turn's answer, and
    closes the turn: the model would then answer outside one; there the content goes too. A
    template that refuses a system message (Gemma 2's) gets its text in the first user message."""
    if _leads_with_system(messages) and refuses_system(source):
        messages = _system_in_first_message(messages)
    if THINKING_BLOCK in source:
        return [_with_thinking_block(m) if _reasons(m) else m for m in messages]
    if any(reads in source for reads in READS_THINKING):
        harmony = HARMONY_CHANNEL in source
        return [_with_thinking(m, harmony) if _reasons(m) else m for m in messages]
    if GEMMA4_RESPONSE in source:
        return [_without_content(m) if isinstance(m, dict) and m.get("tool_calls") else m for m in messages]
    return messages


@functools.lru_cache(maxsize=8)
def refuses_system(source: str) -> bool:
    """Whether the template refuses a system message (Gemma 2's raises "System role not
    supported") but renders the conversation without it."""
    template = compile_chat_template(source)
    user = {"role": "user", "content": "Hi"}
    return not _renders(template, [{"role": "system", "content": "Be brief."}, user]) and _renders(template, [user])


def _renders(template, messages: list[dict]) -> bool:
    try:
        render_bounded(template, messages=messages, bos_token="", eos_token="", add_generation_prompt=True)
    except Exception:  # a template can raise anything from inside Jinja
        return False
    return True


def _leads_with_system(messages: list[dict]) -> bool:
    first = messages[0] if messages else None
    return isinstance(first, dict) and first.get("role") == "system" and isinstance(first.get("content"), str)


def _system_in_first_message(messages: list[dict]) -> list[dict]:
    """The system message's text before the next message's, on a line of its own, as llama.cpp
    passes a system message to a template that refuses one (alone, it is left out)."""
    system, rest = messages[0]["content"], messages[1:]
    if rest and isinstance(rest[0], dict) and isinstance(rest[0].get("content"), str):
        return [rest[0] | {"content": system + "\n" + rest[0]["content"]}, *rest[1:]]
    return rest


def _reasons(message) -> bool:
    return isinstance(message, dict) and bool(message.get("reasoning_content"))


def _with_thinking(message: dict, harmony: bool) -> dict:
    message = message | {"thinking": message["reasoning_content"]}
    return _without_content(message) if harmony and message.get("tool_calls") else message


def _with_thinking_block(message: dict) -> dict:
    """Ministral 3's form, as llama-server makes it: the reasoning as a first block, then the
    answer's text as a block (or the blocks it already is)."""
    content = message.get("content")
    blocks = content if isinstance(content, list) else [{"type": "text", "text": content}] if content else []
    thinking = {"type": "thinking", "thinking": message["reasoning_content"]}
    rest = {key: value for key, value in message.items() if key != "reasoning_content"}
    return rest | {"content": [thinking, *blocks]}


def _without_content(message: dict) -> dict:
    return {key: value for key, value in message.items() if key != "content"}


# A template comes from the model file, so it is untrusted. Beyond the sandbox (no file or attribute
# access, see sandbox.py), a rendering is bounded: in the values each operation of it may make
# (TEMPLATE_MAX_CHARS, TEMPLATE_MAX_INT_BITS), checked before they are made; in its output
# (TEMPLATE_MAX_CHARS, counted as it is produced); in its range() items (TEMPLATE_RANGE_BUDGET); and
# in time (TEMPLATE_DEADLINE_S, which stops its loops, range() or not).
TEMPLATE_RANGE_BUDGET = 1_000_000  # items all range() calls of one rendering may produce together
TEMPLATE_MAX_CHARS = 32 * 2**20  # far more than any context holds (a token is a few characters)
TEMPLATE_MAX_INT_BITS = 2**16  # no template counts past 64 bits; past this, arithmetic turns slow
TEMPLATE_DEADLINE_S = 10.0  # real templates render a long conversation in milliseconds
# What a rendering gives the template itself (render_chat's variables, and render_bounded's, as
# Jinja2ChatFormatter's): a caller's own variables cannot set them.
TEMPLATE_VARIABLES = frozenset({
    "messages", "tools", "add_generation_prompt", "bos_token", "eos_token", "raise_exception",
    "strftime_now", "range", "functions", "function_call", "tool_choice",
})  # fmt: skip


@functools.lru_cache(maxsize=8)
def compile_chat_template(source: str):
    """The template compiled as llama-cpp-python's Jinja2ChatFormatter does (same options,
    extensions and tojson; its sandbox, ImmutableSandboxedEnvironment, with checks before each
    operation that could make a value too large); a syntax error raises here."""
    import jinja2
    import jinja2.ext
    from llama_cpp.llama_chat_format import Jinja2ChatFormatter as Formatter

    from specllm.llama.sandbox import BoundedSandbox

    env = BoundedSandbox(
        loader=jinja2.BaseLoader(),
        trim_blocks=True,
        lstrip_blocks=True,
        extensions=[Formatter.IgnoreGenerationTags, jinja2.ext.loopcontrols],
        filters={"tojson": Formatter.tojson},
        max_chars=TEMPLATE_MAX_CHARS,
        max_int_bits=TEMPLATE_MAX_INT_BITS,
    )
    return env.from_string(source)


def with_effort_alias(variables: dict) -> dict:
    """The variables, with reasoning_effort also as reasoning_strength, the name Muse Glimmer's
    template reads it by, as llama.cpp passes it (a reasoning_strength of their own stays)."""
    effort = variables.get("reasoning_effort")
    if not isinstance(effort, str) or not effort or "reasoning_strength" in variables:
        return variables
    return variables | {"reasoning_strength": effort}


def render_bounded(template, /, tools=None, **variables) -> str:
    """template.render(**variables) with what Jinja2ChatFormatter passes too, but with a range()
    that gives at most TEMPLATE_RANGE_BUDGET items in all, at most TEMPLATE_MAX_CHARS characters
    of output (counted as they are produced, so a runaway template stops early), and within
    TEMPLATE_DEADLINE_S seconds. Any name is a variable, even "template" or "self" (a request's
    chat_template_kwargs): the variables go to Jinja as one dict, not as arguments of these
    functions."""
    from llama_cpp.llama_chat_format import Jinja2ChatFormatter as Formatter

    from specllm.llama.sandbox import deadline

    budget = [TEMPLATE_RANGE_BUDGET]

    def bounded_range(*args):
        items = range(*args)
        budget[0] -= len(items)
        if budget[0] < 0:
            raise ValueError(f"its loops ask range() for more than {TEMPLATE_RANGE_BUDGET} items")
        return items

    def raise_exception(message: str):
        raise ValueError(message)

    out = io.StringIO()
    chunks = template.generate(
        with_effort_alias(variables)
        | {
            "raise_exception": raise_exception,
            "strftime_now": Formatter.strftime_now,
            "range": bounded_range,
            "functions": None,
            "function_call": None,
            "tools": tools,
            "tool_choice": None,
        }
    )
    with deadline(TEMPLATE_DEADLINE_S):
        for chunk in chunks:
            if out.tell() + len(chunk) > TEMPLATE_MAX_CHARS:
                raise ValueError(f"it renders more than {TEMPLATE_MAX_CHARS} characters")
            out.write(chunk)
    return out.getvalue()

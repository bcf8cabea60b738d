"""A chat template's rendering is bounded in memory and time (specllm/llama/sandbox.py): each
template here makes a value past the bound, or runs past the deadline, without its check (most
would take gigabytes, or minutes), and is refused at once; real templates render as
llama-cpp-python's Jinja2ChatFormatter renders them."""

import json
import re
import sys
import time
from pathlib import Path

import pytest
from llama_cpp.llama_chat_format import Jinja2ChatFormatter as Formatter

import specllm.llama.templates as templates
from specllm.errors import ChatTemplateFailed
from specllm.llama.sandbox import TemplateTooBig, TemplateTooSlow
from specllm.llama.templates import CHATML_TEMPLATE, compile_chat_template, render_bounded

sys.path.insert(0, str(Path(__file__).parents[1]))

import tool_templates  # noqa: E402

BIG = '{% set s = "x" * 30000000 %}'  # 30 M characters: within the bound, as one value
LONG = '{% set s = "x" * 10000 %}'  # a separator that makes a long join
# 300 namespaces (a cycler each, in c) whose lists grow after they were put in a list: each list is
# within the bound, all those compared together are not
GROWN = (
    "{% set a = namespace(x=1) %}{% set b = namespace(x=1) %}{% set l = [a, b] * 150 %}"
    "{% set c = [cycler(a), cycler(b)] * 150 %}{% set a.x = range(100000)|list %}{% set b.x = range(100000)|list %}"
)

# (template, what it would make without its check)
TOO_BIG = {
    "str *": ('{{ "x" * 2000000000 }}', "2 G characters"),
    "str * 2**40": ('{{ "x" * (2**40) }}', "a MemoryError"),
    "list *": ("{{ ([1] * 10**9)|length }}", "a list of 10**9 items (8 GB)"),
    "int **": ("{{ 2 ** (10 ** 7) > 0 }}", "a 10 M-bit number"),
    "int *": ("{% set n = 2 ** 30000 %}{{ n * n * n > 0 }}", "a 90 k-bit number"),
    "str +": (BIG + "{{ (s + s)|length }}", "60 M characters"),
    "list +": ("{% set l = [0] * 510000 %}{{ (l + l)|length }}", "a list of 1 M items"),
    "%": ('{{ "%999999999d" % 1 }}', "1 G characters"),
    "% with a * width": ('{{ "%*d" % (999999999, 1) }}', "1 G characters"),
    "~": (BIG + "{{ (s ~ s)|length }}", "60 M characters"),
    "str.format": ('{{ "{:>999999999}".format(1) }}', "1 G characters"),
    "format filter": ('{{ "%999999999d"|format(1) }}', "1 G characters"),
    "join filter": (LONG + '{{ (["a"] * 100000)|join(s)|length }}', "1 G characters"),
    "str.join": (LONG + '{{ s.join(["a"] * 100000)|length }}', "1 G characters"),
    "str.center": ('{{ "x".center(2000000000) }}', "2 G characters"),
    "center filter": ('{{ "x"|center(2000000000) }}', "2 G characters"),
    "int.to_bytes": ('{{ (1).to_bytes(2000000000, "big")|length }}', "2 GB"),
    "str.replace": ('{% set s = "x" * 40000 %}{{ s.replace("", s)|length }}', "1.6 G characters"),
    "replace filter": ('{% set s = "x" * 40000 %}{{ s|replace("", s)|length }}', "1.6 G characters"),
    "str.expandtabs": ('{{ "\\t".expandtabs(2000000000)|length }}', "2 G characters"),
    "indent filter": (LONG + '{{ ("\\n" * 100000)|indent(s)|length }}', "1 G characters"),
    "wordwrap filter": (LONG + '{{ ("a " * 100000)|wordwrap(1, wrapstring=s)|length }}', "1 G characters"),
    "tojson indent": ("{{ [[[[1]]]]|tojson(indent=2000000000)|length }}", "8 G characters"),
    "pprint filter": (BIG + "{{ [s]|pprint|length }}", "a pformat of 30 M characters, in levels"),
    "string filter": (
        "{% set ns = namespace(a=1) %}{% for i in range(21) %}{% set ns.a = namespace(x=ns.a, y=ns.a) %}"
        "{% endfor %}{{ ns.a|string|length }}",
        "the text of 2**21 namespaces: 50 M characters",
    ),
    "list filter": (BIG + "{{ s|list|length }}", "a list of 30 M items"),
    "batch filter": ('{{ ["a"]|batch(2000000000, "x")|list|length }}', "a list of 2 G items"),
    "slice filter": ('{{ ["a"]|slice(17000000)|list|length }}', "17 M lists"),
    "sum filter": ("{{ ([[0]] * 2000)|sum(start=[])|length }}", "2 M items copied, in C (4.5e10 for 300000 lists)"),
    "lipsum": ("{{ lipsum(30000)|length }}", "30000 paragraphs: 36 M characters"),
    # a list that holds another twice, made again from itself: small in memory, but not to compare
    "a list written in the template": (
        "{% set ns = namespace(a=[1], b=[1]) %}{% for i in range(24) %}"
        "{% set ns.a = [ns.a, ns.a] %}{% set ns.b = [ns.b, ns.b] %}{% endfor %}{{ ns.a == ns.b }}",
        "a comparison of 2**24 items, in C (2**60 with 60 steps)",
    ),
    "dict()": (
        "{% set ns = namespace(a=1, b=1) %}{% for i in range(24) %}"
        "{% set ns.a = dict(x=ns.a, y=ns.a) %}{% set ns.b = dict(x=ns.b, y=ns.b) %}{% endfor %}{{ ns.a == ns.b }}",
        "a comparison of 2**24 items, in C (2**60 with 60 steps)",
    ),
    "a namespace's attribute": (
        "{% set a = namespace(x=1) %}{% set b = namespace(x=1) %}{% set la = [a, a] %}{% set lb = [b, b] %}"
        "{% set both = [a, b] %}{% for i in range(24) %}{% set a.x = la|map(attribute='x')|list %}"
        "{% set b.x = lb|map(attribute='x')|list %}{% endfor %}{{ both|map(attribute='x')|max|length }}",
        "a comparison of 2**24 items, in C (2**40 with 40 steps: hours)",
    ),
    "namespace()": (
        "{% set ns = namespace(p=none) %}{% for i in range(100) %}"
        '{% set ns.p = namespace(p=ns.p, s="x" * 2000000 ~ i) %}{% endfor %}{{ ns.p.s|length }}',
        "200 M characters kept through a chain of namespaces (tens of GB with 20 M each)",
    ),
    "a macro's varargs": (
        "{% macro f(k) %}{% if k %}{{ f(k - 1, varargs, varargs) }}{% else %}{{ varargs|unique|list|length }}"
        "{% endif %}{% endmacro %}{{ f(24, 1) }}",
        "a hash of 2**24 tuples, in C (2**31 in 40 s, past the deadline)",
    ),
    "==": (
        "{% set a = namespace(x=1) %}{% set b = namespace(x=1) %}{% set la = [a] * 300 %}{% set lb = [b] * 300 %}"
        "{% set a.x = range(100000)|list %}{% set b.x = range(100000)|list %}"
        "{{ la|map(attribute='x')|list == lb|map(attribute='x')|list }}",
        "a comparison of 300 lists of 100000 items, in C",
    ),
    "a comparing test": (
        "{% set a = namespace(x=1) %}{% set b = namespace(x=1) %}{% set la = [a] * 300 %}{% set lb = [b] * 300 %}"
        "{% set a.x = range(100000)|list %}{% set b.x = range(100000)|list %}"
        "{{ la|map(attribute='x')|list is eq(lb|map(attribute='x')|list) }}",
        "a comparison of 300 lists of 100000 items, in C",
    ),
    "sort filter": (GROWN + "{{ l|map(attribute='x')|sort|length }}", "a sort of 300 lists of 100000 items, in C"),
    "min filter": (GROWN + "{{ l|map(attribute='x')|min|length }}", "300 lists of 100000 items compared, in C"),
    "sort by an attribute": (  # a cycler measures small: what is compared is its current item's x
        GROWN + "{{ c|sort(attribute='current.x')|length }}",
        "a sort of 300 lists of 100000 items, in C",
    ),
    "groupby's default": (
        GROWN + "{{ l|groupby('y', default=a.x)|length }}",
        "a sort and groupby of 300 keys of 100000 items, in C",
    ),
    "list.count": (
        GROWN + "{{ (l|map(attribute='x')|list).count(a.x) }}",
        "300 lists of 100000 items compared, in C",
    ),
    "output": (
        "{% set ns = namespace(a=1) %}{% for i in range(21) %}{% set ns.a = namespace(x=ns.a, y=ns.a) %}"
        "{% endfor %}{{ ns.a }}",
        "the text of 2**21 namespaces: 50 M characters",
    ),
    "a macro's output": (
        BIG + "{% macro m() %}{% for i in range(1000) %}{{ s ~ i }}{% endfor %}{% endmacro %}{{ m()|length }}",
        "30 G characters kept before they are joined",
    ),
    "a {% set %} block": (
        BIG + "{% set b %}{% for i in range(1000) %}{{ s ~ i }}{% endfor %}{% endset %}{{ b|length }}",
        "30 G characters kept before they are joined",
    ),
    "self.block()": (
        "{% set ns = namespace(go=false) %}"
        '{% block b %}{% if ns.go %}{% for i in range(1000) %}{{ "x" * 30000000 ~ i }}{% endfor %}{% endif %}'
        "{% endblock %}{% set ns.go = true %}{{ self.b()|length }}",
        "30 G characters kept before they are joined",
    ),
}


@pytest.mark.parametrize("template", TOO_BIG.values(), ids=TOO_BIG.keys())
def test_an_operation_past_the_bound_is_refused_before_it_is_made(monkeypatch, template):
    """Timed in this process's CPU seconds, the wall-clock deadline widened: on a
    machine busy with other work the refusal is still this check's, and still cheap."""
    source, would_make = template
    monkeypatch.setattr(templates, "TEMPLATE_DEADLINE_S", 30)  # a net for a planted fault, past a loaded machine
    started = time.process_time()
    with pytest.raises(TemplateTooBig, match=r"of more than \d+ (characters|bits)|grows past \d+ characters"):
        render_bounded(compile_chat_template(source), messages=[])
    assert time.process_time() - started < 5, would_make


# Each runs for a second or more without the clock check of its kind (a loop step, a call, an
# operator, a filter), and nothing else in it would stop it (with 30000 characters, 900 M steps;
# with f(40), 2**40 calls).
TOO_SLOW = {
    "loops": '{% set s = "x" * 3000 %}{% for a in s %}{% for b in s %}{% endfor %}{% endfor %}',
    "calls": (
        "{% macro f(n) %}{% if n %}{% set a = f(n - 1) %}{% set b = f(n - 1) %}{% endif %}{% endmacro %}"
        "{% set c = f(20) %}"
    ),
    "operators": '{% set s = "x" * 1000000 %}' + "{% set t = s + s %}" * 4000,
    "~": '{% set s = "x" * 1000000 %}' + "{% set t = s ~ s %}" * 4000,
    "filters": "{% set l = range(100000)|list %}" + "{% set t = l|sort %}" * 200,
}


@pytest.mark.parametrize("source", TOO_SLOW.values(), ids=TOO_SLOW.keys())
def test_a_rendering_stops_at_its_deadline(monkeypatch, source):
    template = compile_chat_template(source)
    monkeypatch.setattr(templates, "TEMPLATE_DEADLINE_S", 0.05)
    started = time.process_time()  # CPU seconds: the deadline is wall-clock, the work between its checks is not
    with pytest.raises(TemplateTooSlow, match=r"its rendering takes more than 0.05 s"):
        render_bounded(template, messages=[])
    assert time.process_time() - started < 2


def test_the_deadline_is_the_renderings_own():
    """Past a rendering, its deadline is gone: a template rendered on its own is not stopped."""
    template = compile_chat_template("{% for c in 'abc' %}{{ c }}{% endfor %}")
    assert render_bounded(template, messages=[]) == "abc"
    assert template.render() == "abc"


def test_a_template_past_a_bound_fails_as_the_models_template(tmp_path):
    """render_chat says which model's template failed and why, in one line (run and chat print it,
    serve answers it with a 400), as for any error a template raises."""
    import tiny_models as tm

    from specllm.llama.model import Model

    path = tm.write_model(tmp_path / "templated.gguf", chat_template='{{ "x" * 2000000000 }}')
    model = Model(path, vocab_only=True)
    try:
        with pytest.raises(ChatTemplateFailed) as failed:
            model.render_chat([{"role": "user", "content": "hi"}])
    finally:
        model.close()
    assert (
        str(failed.value)
        == "the chat template of templated.gguf failed: it makes a value of more than 33554432 characters"
    )


def long_conversation(turns: int) -> list[dict]:
    text = "lorem ipsum dolor sit amet " * 80
    messages = [{"role": "system", "content": "You are terse."}]
    for turn in range(turns):
        messages.append({"role": "user", "content": f"{turn} {text}"})
        if turn % 5 == 4:
            call = {"name": "get_weather", "arguments": {"city": "Paris", "days": 2}}
            messages.append(
                {
                    "role": "assistant",
                    "content": "",
                    "tool_calls": [{"type": "function", "id": f"c{turn:08d}", "function": call}],
                }
            )
            messages.append(
                {"role": "tool", "tool_call_id": f"c{turn:08d}", "name": "get_weather", "content": '{"t": 21}'}
            )
        messages.append({"role": "assistant", "content": f"answer {turn} {text}"})
    return messages + [{"role": "user", "content": "And tomorrow?"}]


TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "The weather in a city",
            "parameters": {
                "type": "object",
                "properties": {"city": {"type": "string", "description": "a city"}, "days": {"type": "integer"}},
                "required": ["city"],
            },
        },
    }
]
REAL_TEMPLATES = {name: getattr(tool_templates, name) for name in dir(tool_templates) if name.isupper()}


@pytest.mark.parametrize("source", [*REAL_TEMPLATES.values(), CHATML_TEMPLATE], ids=[*REAL_TEMPLATES, "CHATML"])
def test_real_templates_render_as_llama_cpp_pythons(source):
    """Calls' arguments as objects, or as JSON text for a template that joins them to its text
    (functionary v3.2's), which fails on objects in both renderers alike."""
    messages = long_conversation(40)
    variables = {"messages": messages, "add_generation_prompt": True, "bos_token": "<s>", "eos_token": "</s>"}
    try:
        Formatter(source, eos_token="</s>", bos_token="<s>")(messages=messages)
    except TypeError as refused:
        with pytest.raises(TypeError, match=re.escape(str(refused))):
            render_bounded(compile_chat_template(source), **variables)
        variables["messages"] = with_text_arguments(messages)
    for tools in (None, TOOLS):
        expected = Formatter(source, eos_token="</s>", bos_token="<s>")(
            messages=variables["messages"], tools=tools
        ).prompt
        assert render_bounded(compile_chat_template(source), tools=tools, **variables) == expected


def with_text_arguments(messages: list[dict]) -> list[dict]:
    """The conversation with each call's arguments as JSON text, as OpenAI's API sends them."""

    def call_as_text(call: dict) -> dict:
        function = call["function"] | {"arguments": json.dumps(call["function"]["arguments"])}
        return call | {"function": function}

    return [
        m | {"tool_calls": [call_as_text(c) for c in m["tool_calls"]]} if "tool_calls" in m else m for m in messages
    ]


def test_a_turns_end_that_a_model_may_spell_out_is_a_stop_string():
    """Ling 3.0's "<|role_end|>" and Laguna's "</assistant>", control tokens that a model may write
    in text tokens, which end no generation: llama.cpp adds them to a chat request's stop strings
    (additional_stops). No other template needs one."""
    assert templates.turn_stops(tool_templates.LING3) == ("<|role_end|>",)
    assert templates.turn_stops(tool_templates.LAGUNA_XS2) == ("</assistant>",)
    others = {name for name, source in REAL_TEMPLATES.items() if templates.turn_stops(source)}
    assert others == {"LING3", "LAGUNA_XS2"}


def test_the_filters_that_sort_and_compare_give_what_jinjas_give():
    """They measure what they compare first (a map's generator taken as a list), then sort as Jinja's."""
    source = (
        "{% set ns = namespace(x=[2, 1]) %}{{ messages|map(attribute='content')|sort|join(',') }} "
        "{{ messages|sort(attribute='role,content', reverse=true)|map(attribute='content')|join(',') }} "
        "{{ messages|map(attribute='role')|unique|list }} {{ messages|min(attribute='content') }} "
        "{{ messages|map(attribute='content')|max }} {{ messages|groupby('name', default='x')|list }} "
        "{{ messages[0]|dictsort(by='value') }} {{ [ns, ns]|map(attribute='x')|map('sort')|list }}"
    )
    messages = [{"role": role, "content": text} for role, text in (("user", "b"), ("assistant", "a"), ("user", "C"))]
    expected = Formatter(source, eos_token="</s>", bos_token="<s>")(messages=messages).prompt
    assert render_bounded(compile_chat_template(source), messages=messages) == expected


def test_reasoning_effort_is_also_the_templates_reasoning_strength(tmp_path):
    """Muse Glimmer's template reads the effort as reasoning_strength: llama.cpp passes it by both
    names, so --reasoning-effort (and serve's field) reach it; a reasoning_strength of the
    caller's own stays."""
    import thinking_templates
    import tiny_models as tm

    from specllm.llama.model import Model

    path = tm.write_model(tmp_path / "muse.gguf", chat_template=thinking_templates.MUSE_GLIMMER)
    model = Model(path, vocab_only=True)
    messages = [{"role": "user", "content": "hi"}]
    try:
        assert "Reasoning strength: high." in model.render_chat(messages)  # the template's default
        assert "Reasoning strength: low." in model.render_chat(messages, variables={"reasoning_effort": "low"})
        both = {"reasoning_effort": "low", "reasoning_strength": "medium"}
        assert "Reasoning strength: medium." in model.render_chat(messages, variables=both)
    finally:
        model.close()


# Gemma 2's template, as the model ships it
GEMMA2 = (
    "{{ bos_token }}{% if messages[0]['role'] == 'system' %}{{ raise_exception('System role not supported') }}"
    "{% endif %}{% for message in messages %}{% if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}"
    "{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}{% endif %}"
    "{% if (message['role'] == 'assistant') %}{% set role = 'model' %}{% else %}{% set role = message['role'] %}"
    "{% endif %}{{ '<start_of_turn>' + role + '\n' + message['content'] | trim + '<end_of_turn>\n' }}{% endfor %}"
    "{% if add_generation_prompt %}{{'<start_of_turn>model\n'}}{% endif %}"
)


def test_a_template_that_refuses_a_system_message_gets_it_in_the_first_user_message(tmp_path):
    """Gemma 2's raises "System role not supported" (run --system, chat's /system and serve's
    system messages failed with it): llama.cpp puts the system message's text before the first
    user message's, and so does specllm. A template that takes one is given it as it is."""
    import tiny_models as tm

    from specllm.llama.model import Model

    path = tm.write_model(tmp_path / "gemma2.gguf", chat_template=GEMMA2)
    model = Model(path, vocab_only=True)
    system, user = {"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}
    try:
        merged = model.render_chat([system, user, {"role": "assistant", "content": "Hello"}, user])
        assert (
            merged == "<s><start_of_turn>user\nBe brief.\nHi<end_of_turn>\n<start_of_turn>model\nHello<end_of_turn>\n"
            "<start_of_turn>user\nHi<end_of_turn>\n<start_of_turn>model\n"
        )
    finally:
        model.close()
    assert not templates.refuses_system(tool_templates.QWEN25)
    assert templates.as_template_takes(tool_templates.QWEN25, [system, user]) == [system, user]

"""Lists a template writes: as llama.cpp's engine, a template may append to them and pop from them
(Kimi K2's queues its tool call ids so), within the sandbox's bounds (specllm/llama/sandbox.py);
the caller's messages and tools stay as they were. And `tojson` takes what map gives, as a list."""

# ruff: noqa: E501 (Kimi K2's template, line for line as the model ships it)

import copy
import json
import time

import pytest
from jinja2.exceptions import SecurityError

from specllm.llama.sandbox import TemplateTooBig
from specllm.llama.templates import compile_chat_template, render_bounded

# Kimi K2 Instruct's template, as llama.cpp's models/templates/Kimi-K2-Instruct.jinja has it
KIMI_K2_INSTRUCT = r"""{% macro render_content(msg) -%}
    {%- set c = msg.get('content') -%}
    {%- if c is string -%}
      {{ c }}
    {%- elif c is not none -%}
      {% for content in c -%}
        {% if content['type'] == 'image' or 'image' in content or 'image_url' in content -%}
          <|media_start|>image<|media_content|><|media_pad|><|media_end|>
        {% else -%}
          {{ content['text'] }}
        {%- endif -%}
      {%- endfor -%}
    {%- endif -%}
{%- endmacro %}

{%- set tool_response_queue = namespace(ids=[]) -%}
{%- set tool_call_counter = namespace(value=0) -%}

{%- if tools -%}
  <|im_system|>tool_declare<|im_middle|>{{ tools | tojson }}<|im_end|>
{%- endif -%}
{% for message in messages %}
  {%- if loop.first and messages[0]['role'] != 'system' -%}
  <|im_system|>system<|im_middle|>You are Kimi, an AI assistant created by Moonshot AI.<|im_end|>
  {% endif %}

  {%- set role_name =  message.get('name') or  message['role'] -%}
  {%- if message['role'] == 'user' -%}
    <|im_user|>{{role_name}}<|im_middle|>
  {%- elif message['role'] == 'assistant' -%}
    <|im_assistant|>{{role_name}}<|im_middle|>
  {%- else -%}
    <|im_system|>{{role_name}}<|im_middle|>
  {%- endif -%}

  {%- if message['role'] == 'assistant' and message.get('tool_calls') -%}
    {{render_content(message)}}<|tool_calls_section_begin|>
    {%- for tool_call in message['tool_calls'] -%}
      {%- set formatted_id = 'functions.' + tool_call['function']['name'] + ':' + (tool_call_counter.value | string) -%}
      {%- set tool_call_counter.value = tool_call_counter.value + 1 -%}
      {%- set _ = tool_response_queue.ids.append(formatted_id) -%}
      <|tool_call_begin|>{{ formatted_id }}<|tool_call_argument_begin|>{% if tool_call['function']['arguments'] is string %}{{ tool_call['function']['arguments'] }}{% else %}{{ tool_call['function']['arguments'] | tojson }}{% endif %}<|tool_call_end|>
    {%- endfor -%}
    <|tool_calls_section_end|>
  {%- elif message['role'] == 'tool' -%}
    {%- if tool_response_queue.ids -%}
      {%- set tool_call_id = tool_response_queue.ids.pop(0) -%}
    {%- else -%}
      {%- set tool_call_id = 'functions.' + message.get('name', 'unknown') + ':' + (tool_call_counter.value | string) -%}
    {%- endif -%}
    ## Return of {{ tool_call_id }}
{{render_content(message)}}
  {%- elif message['content'] is not none -%}
    {{render_content(message)}}
  {%- endif -%}
  <|im_end|>
{%- endfor -%}
{%- if add_generation_prompt -%}
  <|im_assistant|>assistant<|im_middle|>
{%- endif -%}
"""

SPECIAL_FUNCTION = {
    "type": "function",
    "function": {
        "name": "special_function",
        "description": "I'm special",
        "parameters": {"type": "object", "properties": {"arg1": {"type": "integer"}}, "required": ["arg1"]},
    },
}
CONVERSATION = [
    {"role": "system", "content": "Be brief."},
    {"role": "user", "content": "Hi"},
    {"role": "assistant", "content": "Hello"},
    {"role": "user", "content": "Call it"},
    {
        "role": "assistant",
        "content": "",
        "tool_calls": [
            {"type": "function", "id": "x", "function": {"name": "special_function", "arguments": {"arg1": 1}}}
        ],
    },
    {"role": "tool", "tool_call_id": "x", "content": "done"},
    {"role": "assistant", "content": "It is done."},
]


def render(source: str, messages=(), tools=None) -> str:
    return render_bounded(compile_chat_template(source), tools=tools, messages=messages, add_generation_prompt=True)


def test_kimi_k2_renders_a_call_and_its_result_as_llama_cpp_does():
    """The call is written as llama.cpp's test-chat.cpp expects it (functions.NAME:0, its id from
    a counter, appended to a queue); the result's id is popped from that queue. The caller's
    messages and tools are left as they were."""
    messages, tools = copy.deepcopy(CONVERSATION), [copy.deepcopy(SPECIAL_FUNCTION)]
    declared = json.dumps(tools)
    assert render(KIMI_K2_INSTRUCT, messages, tools) == (
        f"<|im_system|>tool_declare<|im_middle|>{declared}<|im_end|>"
        "<|im_system|>system<|im_middle|>Be brief.<|im_end|><|im_user|>user<|im_middle|>Hi<|im_end|>"
        "<|im_assistant|>assistant<|im_middle|>Hello<|im_end|><|im_user|>user<|im_middle|>Call it<|im_end|>"
        "<|im_assistant|>assistant<|im_middle|><|tool_calls_section_begin|><|tool_call_begin|>"
        'functions.special_function:0<|tool_call_argument_begin|>{"arg1": 1}<|tool_call_end|>'
        "<|tool_calls_section_end|><|im_end|>"
        "<|im_system|>tool<|im_middle|>## Return of functions.special_function:0\ndone<|im_end|>"
        "<|im_assistant|>assistant<|im_middle|>It is done.<|im_end|><|im_assistant|>assistant<|im_middle|>"
    )
    assert messages == CONVERSATION and tools == [SPECIAL_FUNCTION]


@pytest.mark.parametrize(
    "source",
    [
        "{{ messages.append(1) }}",
        "{{ messages[0].content.append(1) }}",
        "{{ tools.pop() }}",
        "{% set m = messages|list %}{{ m.append(1) }}",  # a filter's list: the caller's items in it
        "{{ messages[0].update(role='system') }}",
        "{% set d = {'a': 1} %}{{ d.update(a=2) }}",  # llama.cpp's engine changes no dict either
        "{% set l = [3, 1] %}{{ l.sort() }}",  # nor a list but by append and pop
    ],
)
def test_only_a_list_the_template_wrote_changes(source):
    messages, tools = [{"role": "user", "content": ["a"]}], [{"type": "function"}]
    with pytest.raises(SecurityError, match="is unsafe"):
        render(source, messages, tools)
    assert messages == [{"role": "user", "content": ["a"]}] and tools == [{"type": "function"}]


def test_append_and_pop_as_pythons():
    source = (
        "{% set ns = namespace(ids=[]) %}{% set l = [1, 2] %}{% set _ = l.append('x') %}{% set _ = ns.ids.append(l|length) %}"
        "{{ l }} {{ l.pop() }} {{ l.pop(0) }} {{ l }} {{ ns.ids }}"
    )
    assert render(source) == "[1, 2, 'x'] x 1 [2] [3]"


def test_a_list_a_namespace_holds_itself_is_appended_to_as_a_variables():
    """A namespace's attributes are its template's variables: what it holds is measured, but a
    list it holds itself stays the template's to change."""
    source = (
        "{% set l = [] %}{% set ns = namespace(a=l) %}{% set ns.b = l %}{% set ns.c = [] %}"
        "{% set _ = ns.a.append(1) %}{% set _ = ns.b.append(2) %}{% set _ = ns.c.append(3) %}{{ l }} {{ ns.c }}"
    )
    assert render(source) == "[1, 2] [3]"


def test_a_list_appended_to_in_a_loop_is_stopped_at_the_bound():
    """A loop over a list that appends to it never ends, and the list would take all memory
    before the deadline: it is refused once its size passes the bound, in a second or so."""
    source = "{% set l = ['x' * 1000] %}{% for item in l %}{% set _ = l.append(item) %}{% endfor %}"
    started = time.perf_counter()
    with pytest.raises(TemplateTooBig, match=r"^it grows a list past 33554432 characters$"):
        render(source)
    assert time.perf_counter() - started < 5


def test_what_is_popped_is_no_longer_counted():
    """A queue that takes and gives back items, 100 M characters of them in all, holds few at a time."""
    source = (
        "{% set s = 'x' * 1000 %}{% set l = [] %}"
        "{% for i in range(100000) %}{% set _ = l.append(s) %}{% set _ = l.pop() %}{% endfor %}{{ l|length }}"
    )
    assert render(source) == "0"


# Each puts a list in another container, then appends to it. Were it allowed, a list that holds
# another twice, made again from that one 60 times while each is still empty, would be measured
# small and compare 2**60 items, in C (where no deadline reaches), once filled.
SEALED = {
    "a list written": "{% set a = [] %}{% set b = [a] %}{{ a.append(1) }}",
    "a tuple written": "{% set a = [] %}{% set b = (a, a) %}{{ a.append(1) }}",
    "a dict written": "{% set a = [] %}{% set b = {'k': a} %}{{ a.append(1) }}",
    "dict()": "{% set a = [] %}{% set b = dict(k=a) %}{{ a.append(1) }}",
    "append": "{% set a = [] %}{% set b = [] %}{% set _ = b.append(a) %}{{ a.append(1) }}",
    "through a namespace": "{% set a = [] %}{% set b = [namespace(k=a)] %}{{ a.append(1) }}",
    "a namespace in a namespace": "{% set a = [] %}{% set b = namespace(k=namespace(k=a)) %}{{ a.append(1) }}",
    "a namespace's attribute": (
        "{% set a = [] %}{% set b = namespace() %}{% set b.k = namespace(k=a) %}{{ a.append(1) }}"
    ),
    "a macro's varargs": "{% macro m() %}{{ varargs }}{% endmacro %}{% set a = [] %}{% set _ = m(a) %}{{ a.append(1) }}",
    "a macro's kwargs": "{% macro m() %}{{ kwargs }}{% endmacro %}{% set a = [] %}{% set _ = m(k=a) %}{{ a.append(1) }}",
    "cycler": "{% set a = [] %}{% set c = cycler(a, a) %}{{ a.append(1) }}",
    "pop": "{% set a = [] %}{% set b = [a] %}{{ a.pop() }}",
    "60 levels": (
        "{% set ns = namespace(l=[]) %}{% for i in range(60) %}{% set n = [] %}"
        "{% set _ = ns.l.append(n) %}{% set _ = ns.l.append(n) %}{% set ns.l = n %}{% endfor %}"
    ),
}


@pytest.mark.parametrize("source", SEALED.values(), ids=SEALED.keys())
def test_a_list_in_another_container_is_sealed(source):
    with pytest.raises(SecurityError, match=r"^a list's (append|pop) is unsafe once the list is in another container$"):
        render(source)


def test_a_macros_named_arguments_are_not_sealed():
    source = "{% macro m(l) %}{% set _ = l.append(varargs|length) %}{% endmacro %}{% set a = [] %}{{ m(a, 1) }}{{ a }}"
    assert render(source) == "[1]"


def test_tojson_takes_a_map_as_a_list():
    """llama.cpp's map gives a list (llama-cpp-deepseek-r1.jinja declares its tools with
    `tools | map(attribute='function') | tojson`); Jinja's, a generator, which json refused."""
    tools = [SPECIAL_FUNCTION]
    source = "{{ tools | map(attribute='function') | tojson(indent=2) }} {{ [3, 1]|reverse|tojson }}"
    assert render(source, tools=tools) == json.dumps([SPECIAL_FUNCTION["function"]], indent=2) + " [1, 3]"

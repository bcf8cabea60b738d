"""tool_calls.py on fixed model outputs: every form, the edge cases, and streaming split at every
chunk boundary giving what the whole text gives. Templates are rendered as `serve` renders them."""

import json
import random

import pytest
import tiny_models
import tool_templates

from specllm.engine.reasoning import split_reasoning
from specllm.llama.templates import compile_chat_template, render_bounded
from specllm.serve import tool_calls
from specllm.serve.openai_api import ToolReply
from specllm.serve.tool_calls import (
    Parsed,
    ToolCall,
    ToolCallParser,
    ToolTemplate,
    _balanced_end,
    inspect_template,
    parse_tool_calls,
    text_arguments,
)

NAMES = ["get_weather", "get_time"]
PARIS = ToolCall("get_weather", '{"city": "Paris"}')
LONDON = ToolCall("get_weather", '{"city": "London"}')
UTC = ToolCall("get_time", '{"timezone": "UTC"}')
W = '{"name": "get_weather", "arguments": {"city": "Paris"}}'  # a call as JSON
L = '{"name": "get_weather", "arguments": {"city": "London"}}'
X = "<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n</function>"  # a call as XML
XL = "<function=get_weather>\n<parameter=city>\nLondon\n</parameter>\n</function>"
H, HH = "<|start|>assistant to=functions.", "<|channel|>commentary json<|message|>"  # a harmony call's head
Q = '<|"|>'  # Gemma 4's string quote
GK, GV, GE = "<arg_key>", "</arg_key><arg_value>", "</arg_value>"  # GLM's argument tags
MI, MP = '<invoke name="', '<parameter name="'  # MiniMax M2's
LS, LE = "<|tool_call_start|>", "<|tool_call_end|>"  # LFM2's markers
KB, KC = "<|tool_calls_section_begin|>", "<|tool_call_begin|>"  # Kimi K2's
KA, KE = "<|tool_call_argument_begin|>", "<|tool_call_end|>"
DB, DBE = "<｜tool▁calls▁begin｜>", "<｜tool▁calls▁end｜>"  # DeepSeek's
DC, DS, DE = "<｜tool▁call▁begin｜>", "<｜tool▁sep｜>", "<｜tool▁call▁end｜>"
DP, DPE = '<｜DSML｜parameter name="', "</｜DSML｜parameter>"
M3 = "]<]minimax[>["  # MiniMax M3's namespace before each tag
K3T, K3C = "<|open|>tools<|sep|>", '<|open|>call tool="'  # Kimi K3's
K3A, K3AE, K3CE, K3TE = (
    '<|open|>argument key="',
    "<|close|>argument<|sep|>",
    "<|close|>call<|sep|>",
    "<|close|>tools<|sep|>",
)
HB, HC, HS = "<tool_calls:opensource>", "<tool_call:opensource>", "<tool_sep:opensource>"  # Tencent Hy3's
HK, HV, HE = "<arg_key:opensource>", "</arg_key:opensource><arg_value:opensource>", "</arg_value:opensource>"
SB, SN, SA, SE = "<|tool_call:begin|>", "<|tool_call:name|>", "<|tool_call:args|>", "<|tool_call:end|>"  # Solar Open's
FN, FP = '<function name="', '<param name="'  # MiniCPM5's
ATEM = (
    '<atem:function_calls>\n<atem:invoke name="get_weather">\n<atem:parameter name="city">Paris</atem:parameter>\n'
    "</atem:invoke>\n</atem:function_calls>"
)  # muse-glimmer's call to get_weather

# (model output, the content expected, the calls expected)
CASES = [
    # Hermes / Qwen
    (f"<tool_call>\n{W}\n</tool_call>", None, [PARIS]),
    (f"Let me check.\n<tool_call>\n{W}\n</tool_call>\nOne moment.", "Let me check.\n\nOne moment.", [PARIS]),
    (f"<tool_call>\n{W}\n</tool_call>\n<tool_call>\n{L}\n</tool_call>", None, [PARIS, LONDON]),
    (f"<tool_call>\n{W}", None, [PARIS]),  # the reply ended before the closing tag
    (f"<tool_call>{W}<tool_call>{L}</tool_call>", None, [PARIS, LONDON]),  # a closing tag left out
    (
        '<tool_call>{"name": "get_weather", "arguments": {"city": "Paris"}</tool_call>',
        "<tool_call>" + W[:-1] + "</tool_call>",
        [],
    ),
    ('<tool_call>\n{"name": "get_weather", "arguments": "{\\"city\\": \\"Paris\\"}"}\n</tool_call>', None, [PARIS]),
    ("<tool_call>\n" + W, None, [PARIS]),
    ("<tool_call>\nnot json\n</tool_call>", "<tool_call>\nnot json\n</tool_call>", []),
    # Qwen3.5, Qwen3-Coder: XML, an argument on lines of its own, JSON when it reads as JSON
    (f"<tool_call>\n{X}\n</tool_call>", None, [PARIS]),
    (
        f"Let me check.\n\n<tool_call>\n{X}\n</tool_call>\n<tool_call>\n{XL}\n</tool_call>",
        "Let me check.",
        [PARIS, LONDON],
    ),
    (f"<tool_call>\n{X}", None, [PARIS]),  # the reply ended before the closing tag
    (
        "<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n<parameter=days>\n3\n"
        '</parameter>\n<parameter=units>\n{"t": "C"}\n</parameter>\n<parameter=note>\nNaN\n</parameter>\n</function>',
        None,
        [ToolCall("get_weather", '{"city": "Paris", "days": 3, "units": {"t": "C"}, "note": "NaN"}')],
    ),
    ("<tool_call>\n<function=get_time>\n</function>\n</tool_call>", None, [ToolCall("get_time", "{}")]),
    ("<tool_call>\n<function=brave_search>\n</function>", "<tool_call>\n<function=brave_search>\n</function>", []),
    (f"<tool_call>\n{X[:-12]}", f"<tool_call>\n{X[:-12]}", []),  # no </function>: text
    # Llama 3.x
    ('{"name": "get_weather", "parameters": {"city": "Paris"}}', None, [PARIS]),
    ('<|python_tag|>{"name": "get_weather", "parameters": {"city": "Paris"}}', None, [PARIS]),
    (
        '<|python_tag|>{"name": "get_weather", "parameters": {"city": "Paris"}}; '
        '{"name": "get_time", "parameters": {"timezone": "UTC"}}',
        None,
        [PARIS, UTC],
    ),
    ('<|python_tag|>brave_search.call(query="Paris")', '<|python_tag|>brave_search.call(query="Paris")', []),
    # Mistral
    ('[TOOL_CALLS][{"name": "get_weather", "arguments": {"city": "Paris"}, "id": "abcDEF123"}]', None, [PARIS]),
    (f"[TOOL_CALLS] [{W}, {L}]", None, [PARIS, LONDON]),
    ('[TOOL_CALLS]get_weather[ARGS]{"city": "Paris"}', None, [PARIS]),
    ('[TOOL_CALLS]get_weather[ARGS]{"city": "Paris"}[TOOL_CALLS]get_time[ARGS]{"timezone": "UTC"}', None, [PARIS, UTC]),
    ('[TOOL_CALLS]get_weather[CALL_ID]a1b2c3d4e[ARGS]{"city": "Paris"}', None, [PARIS]),
    ('[TOOL_CALLS]get_weather[ARGS]{"city": "Paris"', '[TOOL_CALLS]get_weather[ARGS]{"city": "Paris"', []),
    ('[TOOL_CALLS]launch[ARGS]{"when": "now"}', '[TOOL_CALLS]launch[ARGS]{"when": "now"}', []),
    # drift: fenced or bare JSON naming an offered tool
    (f"```json\n{W}\n```", None, [PARIS]),
    (f"Sure:\n```\n{W}\n```\nDone.", "Sure:\n\nDone.", [PARIS]),
    (f"```json\n{W}\n{L}\n```", None, [PARIS, LONDON]),  # two calls in one block
    (f"```json\n[{W}, {L}]\n```", None, [PARIS, LONDON]),
    (f"```json\n{W}\n", None, [PARIS]),  # the reply ended inside the block
    (W, None, [PARIS]),
    (f"[{W}, {L}]", None, [PARIS, LONDON]),
    (f"I will call it: {W}", "I will call it:", [PARIS]),
    ('{"tool_call": {"name": "get_weather", "arguments": {"city": "Paris"}}}', None, [PARIS]),
    ('{"tool_calls": [{"name": "get_weather", "arguments": {"city": "Paris"}}]}', None, [PARIS]),
    ('{"type": "function", "function": {"name": "get_weather", "arguments": {"city": "Paris"}}}', None, [PARIS]),
    ('{"name": "get_time"}', None, [ToolCall("get_time", "{}")]),  # no arguments: an empty object
    # not calls: they stay text
    (
        '{"name": "launch_rocket", "arguments": {"when": "now"}}',
        '{"name": "launch_rocket", "arguments": {"when": "now"}}',
        [],
    ),
    (
        "```json\n" + W.replace("get_weather", "nope") + "\n```",
        "```json\n" + W.replace("get_weather", "nope") + "\n```",
        [],
    ),
    (
        "<tool_call>\n" + W.replace("get_weather", "nope") + "\n</tool_call>",
        "<tool_call>\n" + W.replace("get_weather", "nope") + "\n</tool_call>",
        [],
    ),
    (
        '{"name": "get_weather", "description": "Get the weather", "parameters": {"type": "object"}}',
        None,
        None,
    ),  # an echoed schema
    ('{"name": "get_weather", "arguments": [1, 2]}', None, None),
    ('{"name": "get_weather", "arguments": "not json"}', None, None),
    ('{"name": "get_weather", "arguments": {"city": "Paris"}, "parameters": {}}', None, None),
    ('{"name": ["get_weather"], "arguments": {}}', None, None),
    ('{"name": "get_weather", "arguments": {"days": NaN}}', None, None),  # not standard JSON
    ('{"name": "get_weather", "arguments": {"days": 1e999}}', None, None),  # Infinity
    ('{"name": "get_weather", "arguments": {"city": "\\ud800"}}', None, None),  # no UTF-8 carries it
    ('{"name": "get_weather", "arguments": "{\\"city\\": \\"\\\\udc00\\"}"}', None, None),
    ('{"name": "get_weather", "arguments": {"city": "Paris"}', None, None),  # unfinished JSON
    # a JSON value that is not all calls is text, all of it: no call is read from inside it
    (f'[{W}, {{"name": "nope", "arguments": {{}}}}]', None, None),
    (f'{{"example": {W}}}', None, None),
    (f'<tool_call>\n[{W}, {{"name": "nope"}}]\n</tool_call>', None, None),
    (f'[TOOL_CALLS][{W}, {{"name": "nope", "arguments": {{}}}}]', None, None),
    (f'Not this: {{"example": {W}}} but this: {L}', 'Not this: {"example": ' + W + "} but this:", [LONDON]),
    ("```python\ndef f(x):\n    return {'a': [1, 2]}\n```", None, None),
    ("if a < b and c[0] > d: print({x})", None, None),
    ("", None, []),
    ("  \n ", None, []),
    # GLM 4.5 to 4.7: the name, then tagged keys and values; a value that reads as JSON is JSON
    (f"<tool_call>get_weather{GK}city{GV}Paris{GE}</tool_call>", None, [PARIS]),
    (
        f"Let me check.\n<tool_call>get_weather\n{GK}city{GV}Paris{GE}\n</tool_call>\n<tool_call>get_time"
        f"\n{GK}timezone{GV}UTC{GE}\n</tool_call>",
        "Let me check.",
        [PARIS, UTC],
    ),
    (
        f'<tool_call>get_weather{GK}city{GV}Paris{GE}{GK}days{GV}3{GE}{GK}opts{GV}{{"t": "C"}}{GE}</tool_call>',
        None,
        [ToolCall("get_weather", '{"city": "Paris", "days": 3, "opts": {"t": "C"}}')],
    ),
    ("<tool_call>get_time</tool_call>", None, [ToolCall("get_time", "{}")]),  # no arguments
    (f"<tool_call>get_weather{GK}city{GV}Paris{GE}", None, [PARIS]),  # the reply ended before the closing tag
    ("<tool_call>get_weather is a tool</tool_call>", None, None),  # a name, then prose
    (f"<tool_call>nope{GK}city{GV}Paris{GE}</tool_call>", None, None),
    (f"<tool_call>get_weather{GK}city{GV}Paris</tool_call>", None, None),  # a value never closed
    # MiniMax M2: invokes in one block
    (
        f'\n<minimax:tool_call>\n{MI}get_weather">\n{MP}city">Paris</parameter>\n</invoke>\n{MI}get_time">\n'
        f'{MP}timezone">UTC</parameter>\n</invoke>\n</minimax:tool_call>',
        None,
        [PARIS, UTC],
    ),
    (f'Sure.<minimax:tool_call>{MI}get_weather">{MP}city">Paris</parameter></invoke>', "Sure.", [PARIS]),  # cut
    (f'<minimax:tool_call>{MI}get_weather">{MP}city">Paris</parameter></invoke>{MI}nope"></invoke>', None, None),
    ("<minimax:tool_call>Hello</minimax:tool_call>", None, None),
    # Gemma 4: its own notation for values
    (f"<|tool_call>call:get_weather{{city:{Q}Paris{Q}}}<tool_call|>", None, [PARIS]),
    (
        f"Let me check.<|tool_call>call:get_weather{{city:{Q}Paris{Q}}}<tool_call|>"
        f"<|tool_call>call:get_time{{timezone:{Q}UTC{Q}}}<tool_call|>",
        "Let me check.",
        [PARIS, UTC],
    ),
    (
        f"<|tool_call>call:get_weather{{city:{Q}x}},y{Q}, days:3,opts:{{hourly:true,at:[1.5e3, -2, null]}},n:{{}}}}"
        "<tool_call|>",
        None,
        [
            ToolCall(
                "get_weather",
                '{"city": "x},y", "days": 3, "opts": {"hourly": true, "at": [1500.0, -2, null]}, "n": {}}',
            )
        ],
    ),
    (f"<|tool_call>call:get_weather{{city:{Q}Paris{Q}}}", None, None),  # no end marker: cut short
    ("<|tool_call>call:get_weather{city:Paris}<tool_call|>", None, None),  # an unquoted string
    ("<|tool_call>call:get_weather{city:12a}<tool_call|>", None, None),
    ("<|tool_call>call:get_weather{days:1.}<tool_call|>", None, None),
    (f"<|tool_call>call:nope{{city:{Q}Paris{Q}}}<tool_call|>", None, None),
    (f"<|tool_call>call:get_weather[{Q}Paris{Q}]<tool_call|>", None, None),  # arguments that are no dict
    # gpt-oss: a harmony message to a function, in the form engine/harmony.py gives each one
    (f'{H}get_weather{HH}{{"city": "Paris"}}<|call|>', None, [PARIS]),
    (
        f'Let me check.\n\n{H}get_weather{HH}{{"city": "Paris"}}\n<|call|>{H}get_time{HH}'
        f'{{"timezone": "UTC"}}<|call|>Done.',
        "Let me check.\n\nDone.",
        [PARIS, UTC],
    ),
    (f'{H}get_weather{HH}{{"city": "Paris"}} and more<|call|>', None, None),  # more than the arguments
    (f'{H}get_weather{HH}{{"city": "Paris"}}', None, None),  # no end: the body was cut
    (f'{H}nope{HH}{{"city": "Paris"}}<|call|>', None, None),  # a tool not offered
    (f"{H}get_weather{HH}Paris<|call|>", None, None),  # arguments that are no JSON object
    (f"{H}get_weather<|channel|>analysis<|message|>{{}}<|call|>", None, None),  # not the form given
    # LFM2, LFM2.5: a Python list of calls, read with ast (its literals, and JSON's true, false, null)
    (f'{LS}[get_weather(city="Paris")]{LE}', None, [PARIS]),
    (f"Let me check.{LS}[get_weather(city='Paris'), get_time(timezone=\"UTC\")]{LE}", "Let me check.", [PARIS, UTC]),
    (
        f'{LS}[get_weather(city="a\\nb", days=-3, hourly=True, at=None, opts={{"t": [1, 2.5, true, null]}}, '
        f"span=(1, +2))]{LE}",
        None,
        [
            ToolCall(
                "get_weather",
                '{"city": "a\\nb", "days": -3, "hourly": true, "at": null, "opts": {"t": [1, 2.5, true, null]}, '
                '"span": [1, 2]}',
            )
        ],
    ),
    (f"{LS}[get_time()]{LE}", None, [ToolCall("get_time", "{}")]),
    (f'{LS}[get_weather(city="Paris")]', None, None),  # no end marker: cut short
    (f'{LS}get_weather(city="Paris"){LE}', None, None),  # not a list
    (f'{LS}[get_weather("Paris")]{LE}', None, None),  # a positional argument
    (f'{LS}[get_weather(city=__import__("os").getcwd())]{LE}', None, None),  # no literal: never run
    (f"{LS}[get_weather(city=Paris)]{LE}", None, None),  # a bare name
    (f"{LS}[get_weather(opts={{1: 2}})]{LE}", None, None),  # a key that is no string
    (f"{LS}[get_weather(days=1e999)]{LE}", None, None),  # Infinity
    (f'{LS}[get_weather(city="Paris"), launch(when="now")]{LE}', None, None),  # a tool not offered
    (f"{LS}[get_weather(city='Paris'){LE}", None, None),  # no Python
    # the Hermes forms behind other markers: Nemotron Nano v2, Granite 3.3, Apriel, Seed-OSS,
    # Command R7B (its own keys), Apertus ({NAME: arguments}), GigaChat 3.1
    (f"Checking.\n<TOOLCALL>[{W}, {L}]</TOOLCALL>", "Checking.", [PARIS, LONDON]),
    (f"<|tool_call|>[{W}]", None, [PARIS]),
    (f"<|tool_call|>[{W}] Done.", "Done.", [PARIS]),
    (f"\n<tool_calls>[{W}]</tool_calls>", None, [PARIS]),
    (f"<seed:tool_call>\n{X}\n</seed:tool_call>", None, [PARIS]),
    (
        '<|START_ACTION|>[\n    {"tool_call_id": "0", "tool_name": "get_weather", "parameters": {"city": "Paris"}},\n'
        '    {"tool_call_id": "1", "tool_name": "get_time", "parameters": {"timezone": "UTC"}}\n]<|END_ACTION|>',
        None,
        [PARIS, UTC],
    ),
    ('<|START_ACTION|>[{"tool_call_id": "0", "tool_name": "nope", "parameters": {}}]<|END_ACTION|>', None, None),
    (
        '<|tools_prefix|>[{"get_weather": {"city": "Paris"}}, {"get_time": {"timezone": "UTC"}}]<|tools_suffix|>',
        None,
        [PARIS, UTC],
    ),
    ('<|tools_prefix|>[{"get_weather": "Paris"}]<|tools_suffix|>', None, None),  # arguments that are no object
    ('{"nope": {"city": "Paris"}}', None, None),
    (f"<|function_call|>{W}", None, [PARIS]),
    # Kimi K2: calls with ids functions.NAME:N in a section (which, and each call's end, are optional)
    (
        f'{KB}{KC}functions.get_weather:0{KA}{{"city": "Paris"}}{KE}{KC}functions.get_time:1{KA}'
        f'{{"timezone": "UTC"}}{KE}<|tool_calls_section_end|>',
        None,
        [PARIS, UTC],
    ),
    (f'Let me check.{KC}functions.get_weather:0{KA}{{"city": "Paris"}}', "Let me check.", [PARIS]),
    (f'{KB}{KC}functions.get_weather{KA}{{"city": "Paris"}}{KE}', None, None),  # no index
    (f'{KB}{KC}functions.get_weather:{KA}{{"city": "Paris"}}{KE}', None, None),  # an index without digits
    (f'{KB}{KC}functions.nope:0{KA}{{"city": "Paris"}}{KE}', None, None),
    (f"{KB}Hello", None, None),  # a section with no call
    # DeepSeek V3.1, and R1's (a fenced block after the name); V3.2's DSML (MiniMax M2's form)
    (
        f'{DB}{DC}get_weather{DS}{{"city": "Paris"}}{DE}{DC}get_time{DS}{{"timezone": "UTC"}}{DE}{DBE}',
        None,
        [PARIS, UTC],
    ),
    (f'Sure.{DB}{DC}function{DS}get_weather\n```json\n{{"city": "Paris"}}\n```{DE}{DBE}', "Sure.", [PARIS]),
    (f'{DB}{DC}get_weather{DS}"Paris"{DE}{DBE}', None, None),
    (f'{DB}{DC}nope{DS}{{"city": "Paris"}}{DE}{DBE}', None, None),
    (
        f'<｜DSML｜function_calls>\n<｜DSML｜invoke name="get_weather">\n{DP}city" string="true">10001{DPE}\n'
        f'{DP}days" string="false">3{DPE}\n</｜DSML｜invoke>\n</｜DSML｜function_calls>',
        None,
        [ToolCall("get_weather", '{"city": "10001", "days": 3}')],
    ),
    (
        f'<｜DSML｜tool_calls>\n<｜DSML｜invoke name="get_time">\n{DP}timezone" string="true">UTC{DPE}\n'
        "</｜DSML｜invoke>\n</｜DSML｜tool_calls>",
        None,
        [UTC],
    ),
    # MiniMax M1: calls one per line in one <tool_calls>
    (f"<tool_calls>\n{W}\n{L}\n</tool_calls>", None, [PARIS, LONDON]),
    (f"Checking.<tool_calls>\n{W}\n{L}", "Checking.", [PARIS, LONDON]),  # cut before the closing tag
    (f'<tool_calls>\n{W}\n{{"name": "nope", "arguments": {{}}}}\n</tool_calls>', None, None),
    (f"<tool_call>{W}\n{{x}} is a set", "{x} is a set", [PARIS]),  # prose after a call: no JSON value of it
    # GigaChat 3: the call as a message of its own
    (f"Sure.<|message_sep|>\n\nfunction call<|role_sep|>\n{W}", "Sure.", [PARIS]),
    # functionary v3.1: JSON arguments in <function=NAME>
    (
        '<function=get_weather>{"city": "Paris"}</function><function=get_time>{"timezone": "UTC"}</function>',
        None,
        [PARIS, UTC],
    ),
    ('<function=get_weather>{"city": "Paris"}', None, None),  # no end: cut short
    ('<function=nope>{"city": "Paris"}</function>', None, None),
    # Solar Open: the call's id before the name
    (
        f'<|tool_calls|>{SB}call00001{SN}get_weather{SA}{{"city": "Paris"}}{SE}{SB}x_2{SN}get_time{SA}'
        f'{{"timezone": "UTC"}}{SE}<|calls|>',
        None,
        [PARIS, UTC],
    ),
    (f'Sure.<|tool_calls|>{SB}{SN}get_weather{SA}{{"city": "Paris"}}{SE}', "Sure.", [PARIS]),  # no id
    (f'<|tool_calls|>{SB}call00001{SA}{{"city": "Paris"}}{SE}', None, None),  # no name
    (f'<|tool_calls|>{SB}call00001{SN}nope{SA}{{"city": "Paris"}}{SE}', None, None),
    # MiniCPM5: MiniMax M2's invokes as <function name=...>, one by one; a CDATA section is text as written
    (
        f'{FN}get_weather">{FP}city">Paris</param></function>\n{FN}get_time">{FP}timezone">UTC</param></function>',
        None,
        [PARIS, UTC],
    ),
    (f'{FN}get_time"></function>', None, [ToolCall("get_time", "{}")]),
    (
        f'{FN}get_weather">{FP}city"><![CDATA[<a href="/x">hi</a> </param>]]></param>{FP}days">3</param>'
        f'{FP}note"><![CDATA[3]]></param></function>',
        None,
        [ToolCall("get_weather", '{"city": "<a href=\\"/x\\">hi</a> </param>", "days": 3, "note": "3"}')],
    ),
    (f'{FN}get_weather">{FP}city">Paris</param>', None, None),  # no </function>: cut short
    (f'{FN}get_weather">{FP}city"><![CDATA[Paris</param></function>', None, None),  # a CDATA never closed
    (f'{FN}nope">{FP}city">Paris</param></function>', None, None),
    # muse-glimmer: MiniMax M2's invokes behind atem: tags
    (ATEM, None, [PARIS]),
    # muse-glimmer's call as engine/harmony.py gives it: a message to the tool, its body the invokes
    (
        f"Checking.\n\n<|start|>assistant to=get_weather{HH}{ATEM}<|call|>",
        "Checking.",
        [PARIS],
    ),
    (f"<|start|>assistant to=get_time{HH}{ATEM}<|call|>", None, None),  # a recipient that is not the invoked tool
    # no end (engine/harmony.py gives every message one): the invokes are read on their own
    (f"<|start|>assistant to=get_weather{HH}{ATEM}", f"<|start|>assistant to=get_weather{HH}", [PARIS]),
    # MiniMax M3: its namespace before each tag, a parameter's tag its key
    (
        f'{M3}<tool_call>\n{M3}<invoke name="get_weather">{M3}<city>Paris{M3}</city>{M3}<days>3{M3}</days>'
        f'{M3}</invoke>\n{M3}<invoke name="get_time">{M3}</invoke>\n{M3}</tool_call>',
        None,
        [ToolCall("get_weather", '{"city": "Paris", "days": 3}'), ToolCall("get_time", "{}")],
    ),
    (f'Sure.{M3}<tool_call>\n{M3}<invoke name="get_weather">{M3}<city>Paris{M3}</city>{M3}</invoke>', "Sure.", [PARIS]),
    (f'{M3}<tool_call>\n{M3}<invoke name="get_weather">{M3}<city>Paris{M3}</town>{M3}</invoke>', None, None),
    (f'{M3}<tool_call>\n{M3}<invoke name="nope">{M3}</invoke>\n{M3}</tool_call>', None, None),
    # Kimi K3: tags of <|open|>, <|close|> and <|sep|>; an argument typed "string" is text as written
    (
        f'{K3T}{K3C}get_weather" index="1"<|sep|>{K3A}city" type="string"<|sep|>10001{K3AE}{K3A}days" '
        f'type="number"<|sep|>3{K3AE}{K3CE}{K3C}get_time" index="2"<|sep|>{K3CE}{K3TE}',
        None,
        [ToolCall("get_weather", '{"city": "10001", "days": 3}'), ToolCall("get_time", "{}")],
    ),
    (f'{K3T}{K3C}nope" index="1"<|sep|>{K3CE}{K3TE}', None, None),
    # Tencent Hy3: GLM's calls behind :opensource tags, a separator after the name
    (
        f"{HB}\n{HC}get_weather{HS}\n{HK}city{HV}Paris{HE}\n</tool_call:opensource>\n{HC}get_time{HS}\n"
        "</tool_call:opensource>\n</tool_calls:opensource>",
        None,
        [PARIS, ToolCall("get_time", "{}")],
    ),
    (f"Sure.{HB}{HC}get_weather{HS}{HK}city{HV}Paris{HE}", "Sure.", [PARIS]),  # cut short
    (f"{HB}{HC}get_weather{HK}city{HV}Paris{HE}</tool_call:opensource></tool_calls:opensource>", None, None),
    (f"{HB}{HC}nope{HS}{HK}city{HV}Paris{HE}</tool_call:opensource></tool_calls:opensource>", None, None),
]
CASES = [(text, text if calls is None else content, calls or []) for text, content, calls in CASES]


def streamed(pieces: list[str]) -> Parsed:
    parser = ToolCallParser(NAMES)
    content, calls = "", []
    for piece in pieces:
        text, found = parser.feed(piece)
        content, calls = content + text, calls + found
    text, found = parser.finish()
    return Parsed(content + text or None, calls + found)


@pytest.mark.parametrize("text,content,calls", CASES, ids=range(len(CASES)))
def test_a_reply_parsed_whole(text, content, calls):
    assert parse_tool_calls(text, NAMES) == Parsed(content, calls)


@pytest.mark.parametrize("text,content,calls", CASES, ids=range(len(CASES)))
def test_any_split_into_chunks_gives_the_same(text, content, calls):
    whole = Parsed(content, calls)
    for cut in range(len(text) + 1):
        assert streamed([text[:cut], text[cut:]]) == whole, cut
    assert streamed(list(text)) == whole
    rng = random.Random(0)
    for _ in range(20):
        cuts = sorted(rng.sample(range(len(text) + 1), min(4, len(text) + 1)))
        assert streamed([text[a:b] for a, b in zip([0, *cuts], [*cuts, len(text)])]) == whole


def in_order(pieces: list[str]) -> list:
    """The parts ToolCallParser hands out for these pieces, in order, the texts in a row joined."""
    parser = ToolCallParser(NAMES)
    parts: list = []
    for part in [p for piece in pieces for p in parser.feed_in_order(piece)] + parser.finish_in_order():
        if isinstance(part, str) and parts and isinstance(parts[-1], str):
            parts[-1] += part
        else:
            parts.append(part)
    return parts


TEXT_CALL_TEXT = f"Let me check.\n<tool_call>\n{W}\n</tool_call>\nThen London: <tool_call>{L}</tool_call> and time. "


def test_text_and_calls_are_handed_out_in_the_order_written():
    """Text after a call comes after it; the whitespace before a call is held back as the text's
    end, and handed out with the text after the call (the texts joined are the message's content)."""
    expected = ["Let me check.", PARIS, "\n\nThen London:", LONDON, "  and time."]
    assert in_order([TEXT_CALL_TEXT]) == expected
    for cut in range(len(TEXT_CALL_TEXT) + 1):
        assert in_order([TEXT_CALL_TEXT[:cut], TEXT_CALL_TEXT[cut:]]) == expected, cut
    assert in_order(list(TEXT_CALL_TEXT)) == expected
    parsed = parse_tool_calls(TEXT_CALL_TEXT, NAMES)
    assert parsed == Parsed("".join(p for p in expected if isinstance(p, str)), [PARIS, LONDON])


@pytest.mark.parametrize("text,content,calls", CASES, ids=range(len(CASES)))
def test_every_form_keeps_its_order_at_any_split(text, content, calls):
    whole = in_order([text])
    assert [p for p in whole if not isinstance(p, str)] == calls
    assert "".join(p for p in whole if isinstance(p, str)) == (content or "")
    for cut in range(len(text) + 1):
        assert in_order([text[:cut], text[cut:]]) == whole, cut
    assert in_order(list(text)) == whole


def test_json_nested_deeper_than_python_reads_is_text():
    """A model in a loop may nest a JSON value deeper than json.loads can read: it is no call (it
    raised RecursionError, a failed request)."""
    deep = '{"a": ' * 5000 + "1" + "}" * 5000
    as_object = f'{{"name": "get_weather", "arguments": {deep}}}'
    as_string = f'{{"name": "get_weather", "arguments": {json.dumps(deep)}}}'
    for text in (deep, as_object, as_string):
        assert parse_tool_calls(text, NAMES) == Parsed(text, [])
        assert streamed([text[: len(text) // 2], text[len(text) // 2 :]]) == Parsed(text, [])


def test_arguments_as_an_object_or_as_a_string_are_the_same_text():
    as_object = parse_tool_calls('{"name": "get_weather", "arguments": {"city": "Zürich", "days": 2}}', NAMES)
    as_string = parse_tool_calls(
        '{"name": "get_weather", "arguments": "{\\"city\\":\\"Zürich\\",\\"days\\":2}"}', NAMES
    )
    assert as_object == as_string
    assert json.loads(as_object.calls[0].arguments) == {"city": "Zürich", "days": 2}


def test_text_is_handed_out_as_soon_as_it_cannot_start_a_call():
    parser = ToolCallParser(NAMES)
    assert parser.feed("The answer is {x} and [1] ") == ("The answer is {x} and [1]", [])  # the space waits
    assert parser.feed("<tool") == ("", [])  # may open a call: held back
    assert parser.feed("box> is a tag ") == (" <toolbox> is a tag", [])
    assert parser.feed("```") == ("", [])
    assert parser.feed("python\nx = 1") == (" ```python\nx = 1", [])  # code, not JSON: at once
    assert parser.feed('\n{"name": "get_weather"') == ("", [])  # may be a bare call
    assert parser.feed(', "arguments": {"city": "Paris"}}') == ("", [PARIS])
    assert parser.finish() == ("", [])


def test_a_marker_followed_by_no_json_is_text_at_once():
    """Llama 3.1 writes its built-in tools' calls after <|python_tag|> as Python, not JSON: that
    is text from there, handed out as it comes, not held back to the reply's end. Likewise a
    Mistral [ARGS] or a harmony call's body that is no JSON."""
    for head in ("<|python_tag|>", "[TOOL_CALLS]get_weather[ARGS]", f"{H}get_weather{HH}"):
        parser = ToolCallParser(NAMES)
        assert parser.feed(head) == ("", [])
        assert parser.feed(' brave_search.call(query="Paris")') == (f'{head} brave_search.call(query="Paris")', [])


def test_an_argument_typed_as_a_string_stays_text_in_the_forms_that_write_values_bare():
    """GLM's, MiniMax's and the XML form's values are bare: one that reads as JSON is taken as
    JSON, unless the tool's schema says the argument is a string, as llama-server reads them (a
    zip code, a file's JSON content, "true" given as numbers, objects, booleans broke the tool)."""
    tool = {
        "type": "function",
        "function": {
            "name": "get_weather",
            "parameters": {
                "type": "object",
                "properties": {
                    "city": {"type": "string"},
                    "days": {"type": "integer"},
                    "note": {"type": ["string", "null"]},
                },
            },
        },
    }
    texts = text_arguments([tool])
    assert texts == {"get_weather": frozenset({"city", "note"})}
    expected = [ToolCall("get_weather", '{"city": "10001", "days": 3, "note": "{\\"a\\": 1}"}')]
    written = [
        f'<tool_call>get_weather{GK}city{GV}10001{GE}{GK}days{GV}3{GE}{GK}note{GV}{{"a": 1}}{GE}</tool_call>',
        f'<minimax:tool_call>{MI}get_weather">{MP}city">10001</parameter>{MP}days">3</parameter>'
        f'{MP}note">{{"a": 1}}</parameter></invoke></minimax:tool_call>',
        "<tool_call><function=get_weather><parameter=city>\n10001\n</parameter><parameter=days>\n3\n</parameter>"
        '<parameter=note>\n{"a": 1}\n</parameter></function></tool_call>',
    ]
    for text in written:
        assert parse_tool_calls(text, NAMES, texts) == Parsed(None, expected), text
        assert json.loads(parse_tool_calls(text, NAMES).calls[0].arguments)["city"] == 10001  # no schema: JSON
        reply = ToolReply(NAMES, texts=texts)
        reply.feed(text), reply.finish()
        assert reply.message()["tool_calls"][0]["function"]["arguments"] == expected[0].arguments


def test_call_markup_is_never_handed_out_as_text():
    text = f"Checking.\n<tool_call>\n{W}\n</tool_call>"
    parser = ToolCallParser(NAMES)
    handed = [parser.feed(c)[0] for c in text] + [parser.finish()[0]]
    assert "".join(handed) == "Checking." and not any("<" in piece or "{" in piece for piece in handed)


def renderer(source: str):
    """A template rendered as `serve` renders it (the same sandbox and variables)."""
    template = compile_chat_template(source)

    def render(messages, tools, add_generation_prompt):
        return render_bounded(
            template,
            messages=messages,
            tools=tools,
            add_generation_prompt=add_generation_prompt,
            bos_token="<s>",
            eos_token="</s>",
        )

    return render


def test_what_a_template_does_with_tools():
    qwen = inspect_template(renderer(tool_templates.QWEN25))
    assert qwen == ToolTemplate(True, True, '<tool_call>\n{"name": "', '", "arguments": ')
    assert qwen.prefill("get_weather") == '<tool_call>\n{"name": "get_weather", "arguments": '
    assert qwen.prefill(None) == '<tool_call>\n{"name": "'
    assert inspect_template(renderer(tool_templates.LLAMA31)) == ToolTemplate(
        True, True, '{"name": "', '", "parameters": '
    )
    mistral = inspect_template(renderer(tool_templates.MISTRAL_V3))
    assert mistral == ToolTemplate(True, True, '[TOOL_CALLS] [{"name": "', '", "arguments": ')
    # XML calls: a forced call begins with the function's tag, up to its first <parameter=...>
    # (the generic JSON separator after the name would make a call no such template writes).
    # (Their calls end a think block left open, as llama.cpp reads them: call_openings.)
    qwen35 = inspect_template(renderer(tool_templates.QWEN35))
    assert qwen35 == ToolTemplate(True, True, "\n</think>\n\n<tool_call>\n<function=", ">\n", ("<tool_call>",))
    assert qwen35.prefill("get_weather") == "\n</think>\n\n<tool_call>\n<function=get_weather>\n"
    # Nemotron 3's prompt opens a think block its own turns write as "<think></think>": its calls'
    # form is found all the same (it was the generic JSON one, which no such template writes).
    nemotron = inspect_template(renderer(tool_templates.NEMOTRON3))
    assert nemotron == ToolTemplate(True, True, "<think></think>\n<tool_call>\n<function=", ">\n", ("<tool_call>",))
    # GLM 4.7's prompt opens a think block its turns write as "</think>"; MiniMax M2's, one they do not write.
    # Ling 3.0 writes GLM's calls, and a call of its ends a think block left open (llama.cpp's Ling parser).
    assert inspect_template(renderer(tool_templates.GLM47)) == ToolTemplate(True, True, "</think><tool_call>", "")
    ling3 = inspect_template(renderer(tool_templates.LING3))
    assert ling3 == ToolTemplate(True, True, "</think><tool_call>", "\n", ("<tool_call>",))
    minimax = inspect_template(renderer(tool_templates.MINIMAX_M2))
    assert minimax == ToolTemplate(True, True, '\n<minimax:tool_call>\n<invoke name="', '">\n')
    # Gemma 4's prompt ends with an empty thought channel (thinking off) that its turns do not write
    gemma4 = inspect_template(renderer(tool_templates.GEMMA4))
    assert gemma4 == ToolTemplate(True, True, "<|tool_call>call:", "")
    # gpt-oss writes a call's recipient in the role header its prompt ends with
    gpt_oss = inspect_template(renderer(tool_templates.GPT_OSS))
    assert gpt_oss == ToolTemplate(True, True, " to=functions.", "<|channel|>commentary json<|message|>")
    # LFM2.5 writes Python calls: the arguments begin at the parenthesis, and its strings' single
    # quotes are no sign of an object printed as Python's repr
    lfm25 = inspect_template(renderer(tool_templates.LFM25))
    assert lfm25 == ToolTemplate(True, True, "<|tool_call_start|>[", "")
    assert inspect_template(renderer(tool_templates.NEMOTRON_NANO_V2)) == ToolTemplate(
        True, True, '<TOOLCALL>[{"name": "', '", "arguments": '
    )
    kimi = inspect_template(renderer(tool_templates.KIMI_K2))
    assert kimi.prefill("get_weather") == (
        "<|tool_calls_section_begin|><|tool_call_begin|>functions.get_weather:0<|tool_call_argument_begin|>"
    )
    deepseek = inspect_template(renderer(tool_templates.DEEPSEEK_V32))
    assert deepseek.prefill(None) == '</think>\n\n<｜DSML｜function_calls>\n<｜DSML｜invoke name="'
    assert deepseek.call_openings == ("<｜DSML｜function_calls>",)
    seed = inspect_template(renderer(tool_templates.SEED_OSS))
    assert seed == ToolTemplate(True, True, "<seed:tool_call>\n<function=", ">\n")
    command = inspect_template(renderer(tool_templates.COMMAND_R7B))
    assert command.prefill("get_weather") == (
        '<|START_ACTION|>[\n    {"tool_call_id": "0", "tool_name": "get_weather", "parameters": '
    )
    apertus = inspect_template(renderer(tool_templates.APERTUS))
    assert apertus == ToolTemplate(True, True, '<|tools_prefix|>[{"', '": ')
    assert inspect_template(renderer(tool_templates.MINICPM5)) == ToolTemplate(True, True, '<function name="', '">')
    hy3 = inspect_template(renderer(tool_templates.HY3))
    assert (
        hy3.prefill("get_weather")
        == "<tool_calls:opensource>\n<tool_call:opensource>get_weather<tool_sep:opensource>\n"
    )
    solar = inspect_template(renderer(tool_templates.SOLAR_OPEN))
    assert solar.prefill("get_weather") == f"<|tool_calls|>{SB}call00001{SN}get_weather{SA}"
    m3 = inspect_template(renderer(tool_templates.MINIMAX_M3))
    assert m3.prefill("get_weather") == f'</mm:think>{M3}<tool_call>\n{M3}<invoke name="get_weather">{M3}'
    k3 = inspect_template(renderer(tool_templates.KIMI_K3))
    assert k3.prefill("get_weather").endswith(f'{K3T}{K3C}get_weather" index="1"<|sep|>')
    # muse-glimmer writes the name twice, as the recipient and in its invoke: both are the tool's
    muse = inspect_template(renderer(tool_templates.MUSE_GLIMMER))
    assert muse.prefill("get_weather") == (
        ' to=get_weather<|message|><atem:function_calls>\n<atem:invoke name="get_weather">\n'
    )
    assert inspect_template(renderer(tool_templates.FUNCTIONARY_V31)).prefill("get_weather") == "<function=get_weather>"
    # functionary v3.2's prompt ends with the ">>>" before a recipient: a call begins with the name alone
    functionary = inspect_template(renderer(tool_templates.FUNCTIONARY_V32))
    assert functionary == ToolTemplate(True, False, "", "\n")
    assert (functionary.prefill(None), functionary.prefill("get_weather")) == ("", "get_weather\n")
    assert inspect_template(renderer(tool_templates.MINIMAX_M1)).prefill(None) == '<tool_calls>\n{"name": "'
    gigachat3 = inspect_template(renderer(tool_templates.GIGACHAT3))
    assert gigachat3.prefill(None) == '<|message_sep|>\n\nfunction call<|role_sep|>\n{"name": "'
    # Granite 3.3's renders the tools but not the calls: the generic start
    assert inspect_template(renderer(tool_templates.GRANITE33)) == ToolTemplate(True, False)
    assert inspect_template(renderer(tool_templates.RAW_ARGUMENTS)).object_arguments is False
    assert inspect_template(renderer(tiny_models.CHATML_TEMPLATE)).renders_tools is False
    assert inspect_template(renderer("{{ raise_exception('no tools here') }}")).renders_tools is False


@pytest.mark.parametrize(
    "source",
    [
        tool_templates.QWEN25,
        tool_templates.LLAMA31,
        tool_templates.MISTRAL_V3,
        tool_templates.QWEN35,
        tool_templates.NEMOTRON3,
        tool_templates.GEMMA4,
        tool_templates.GLM47,
        tool_templates.MINIMAX_M2,
        tool_templates.LFM25,
        tool_templates.NEMOTRON_NANO_V2,
        tool_templates.KIMI_K2,
        tool_templates.DEEPSEEK_V32,
        tool_templates.SEED_OSS,
        tool_templates.COMMAND_R7B,
        tool_templates.APERTUS,
        tool_templates.MINIMAX_M1,
        tool_templates.GIGACHAT3,
        tool_templates.FUNCTIONARY_V31,
        tool_templates.SOLAR_OPEN,
        tool_templates.MINICPM5,
        tool_templates.MUSE_GLIMMER,
        tool_templates.MINIMAX_M3,
        tool_templates.KIMI_K3,
        tool_templates.HY3,
        tool_templates.LING3,
    ],
    ids=[
        "qwen25",
        "llama31",
        "mistral_v3",
        "qwen35",
        "nemotron3",
        "gemma4",
        "glm47",
        "minimax_m2",
        "lfm25",
        "nemotron_nano_v2",
        "kimi_k2",
        "deepseek_v32",
        "seed_oss",
        "command_r7b",
        "apertus",
        "minimax_m1",
        "gigachat3",
        "functionary_v31",
        "solar_open",
        "minicpm5",
        "muse_glimmer",
        "minimax_m3",
        "kimi_k3",
        "hy3",
        "ling3",
    ],
)
def test_a_prefilled_call_completed_as_the_template_writes_it_is_read_back(source):
    """tool_choice "required" / named: the reply begins with the prefill, the model finishes the call."""
    form = inspect_template(renderer(source))
    rest = {
        tool_templates.QWEN25: '{"city": "Paris"}}\n</tool_call>',
        tool_templates.LLAMA31: '{"city": "Paris"}}',
        tool_templates.MISTRAL_V3: '{"city": "Paris"}, "id": "abcDEF123"}]',
        tool_templates.QWEN35: "<parameter=city>\nParis\n</parameter>\n</function>\n</tool_call>",
        tool_templates.NEMOTRON3: "<parameter=city>\nParis\n</parameter>\n</function>\n</tool_call>",
        tool_templates.GEMMA4: f"{{city:{Q}Paris{Q}}}<tool_call|>",
        tool_templates.GLM47: f"{GK}city{GV}Paris{GE}</tool_call>",
        tool_templates.MINIMAX_M2: f'{MP}city">Paris</parameter>\n</invoke>\n</minimax:tool_call>',
        tool_templates.LFM25: f"(city='Paris')]{LE}",
        tool_templates.NEMOTRON_NANO_V2: '{"city": "Paris"}}]</TOOLCALL>',
        tool_templates.KIMI_K2: f'{{"city": "Paris"}}{KE}<|tool_calls_section_end|>',
        tool_templates.DEEPSEEK_V32: f'{DP}city" string="true">Paris{DPE}\n</｜DSML｜invoke>\n'
        "</｜DSML｜function_calls>",
        tool_templates.SEED_OSS: "<parameter=city>Paris</parameter>\n</function>\n</seed:tool_call>",
        tool_templates.COMMAND_R7B: '{"city": "Paris"}}\n]<|END_ACTION|>',
        tool_templates.APERTUS: '{"city": "Paris"}}]<|tools_suffix|>',
        tool_templates.MINIMAX_M1: '{"city": "Paris"}}\n</tool_calls>',
        tool_templates.GIGACHAT3: '{"city": "Paris"}}',
        tool_templates.FUNCTIONARY_V31: '{"city": "Paris"}</function>',
        tool_templates.SOLAR_OPEN: f'{{"city": "Paris"}}{SE}',
        tool_templates.MINICPM5: f'{FP}city">Paris</param></function>',
        tool_templates.MUSE_GLIMMER: '<atem:parameter name="city">Paris</atem:parameter>\n</atem:invoke>\n'
        "</atem:function_calls>",
        tool_templates.MINIMAX_M3: f"<city>Paris{M3}</city>{M3}</invoke>\n{M3}</tool_call>",
        tool_templates.KIMI_K3: f'{K3A}city" type="string"<|sep|>Paris{K3AE}{K3CE}{K3TE}',
        tool_templates.HY3: f"{HK}city{HV}Paris{HE}\n</tool_call:opensource>\n</tool_calls:opensource>",
        tool_templates.LING3: f"{GK}city{GV}Paris{GE}\n</tool_call>",
    }[source]
    # Some prefills hold a think block's end: read alone, that is text.
    content = {
        tool_templates.QWEN35: "</think>",
        tool_templates.NEMOTRON3: "<think></think>",
        tool_templates.GLM47: "</think>",
        tool_templates.LING3: "</think>",
        tool_templates.DEEPSEEK_V32: "</think>",
        tool_templates.MINIMAX_M3: "</mm:think>",
        tool_templates.KIMI_K3: "<|close|>think<|sep|><|open|>response<|sep|><|close|>response<|sep|>",
    }.get(source)
    reply = form.prefill("get_weather") + rest
    if source == tool_templates.MUSE_GLIMMER:  # its replies are messages: engine/harmony.py reads them first
        reply = split_reasoning(reply).answer
    assert parse_tool_calls(reply, NAMES) == Parsed(content, [PARIS])


WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Get the weather in a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    },
}


@pytest.mark.parametrize(
    "name",
    [
        "QWEN25", "LLAMA31", "MISTRAL_V3", "QWEN35", "NEMOTRON3", "GEMMA4", "GLM47", "MINIMAX_M2", "GPT_OSS",
        "LFM25", "NEMOTRON_NANO_V2", "KIMI_K2", "DEEPSEEK_V32", "SEED_OSS", "COMMAND_R7B", "APERTUS", "MINIMAX_M1",
        "GIGACHAT3", "FUNCTIONARY_V31", "SOLAR_OPEN", "MINICPM5", "MUSE_GLIMMER", "MINIMAX_M3", "KIMI_K3", "HY3",
        "LING3",
    ],
)  # fmt: skip
def test_an_earlier_call_as_the_template_writes_it_is_read_back_as_that_call(name):
    """A conversation with a call and its result, rendered by the model's template with the tool
    offered: read for calls, it holds that call and no other (the tool's schema is none), and the
    result is text. So a model that writes its calls as its template does is understood."""
    render = renderer(getattr(tool_templates, name))
    arguments = {"city": "Paris"} if inspect_template(render).object_arguments else '{"city": "Paris"}'
    call = {"id": "abc123XYZ", "type": "function", "function": {"name": "get_weather", "arguments": arguments}}
    messages = [
        {"role": "user", "content": "What is the weather in Paris?"},
        {"role": "assistant", "content": "", "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "abc123XYZ", "content": "18 C, cloudy"},
    ]
    prompt = render(messages, [WEATHER_TOOL], True)
    assert "get_weather" in prompt.split("What is the weather in Paris?")[0]  # the tool, offered
    parsed = parse_tool_calls(prompt, NAMES, text_arguments([WEATHER_TOOL]))
    assert parsed.calls == [PARIS] and "18 C, cloudy" in parsed.content


def test_lfm2_names_a_tool_with_dots_as_python_does():
    """LFM2's calls may name a tool with dots (Calendar.create_event), an attribute in Python."""
    text = f'{LS}[Calendar.create_event(title="demo", people=["Ann", "Bo"])]{LE}'
    expected = ToolCall("Calendar.create_event", '{"title": "demo", "people": ["Ann", "Bo"]}')
    assert parse_tool_calls(text, ["Calendar.create_event"]) == Parsed(None, [expected])
    assert parse_tool_calls(text, ["create_event"]) == Parsed(text, [])


def test_a_held_back_value_resumes_its_scan_where_it_stopped():
    """A value read again as the reply grows resumes the scan of the text seen before: whatever
    the point it stopped at (inside a string, after an escape, between brackets), it ends where a
    scan from the start ends."""
    text = '{"a": "x\\"}{[", "b": [1, {"c": "]\\\\"}], "d": {}} tail'
    whole = _balanced_end(text, 0)
    assert whole == text.index(" tail")
    for cut in range(1, len(text)):
        scans: dict = {}
        first = _balanced_end(text[:cut], 0, scans)
        assert first == (whole if cut >= whole else None)
        assert _balanced_end(text, 0, scans) == whole, cut


def test_a_held_back_gemma_call_is_read_on_from_where_it_stopped(monkeypatch):
    """A streamed Gemma 4 call is read on from where the last step stopped, not from its start
    at every step: read again whole, 9k characters of small items took seconds (quadratic)."""
    items = ",".join(f"{{n:{i},ok:true,s:{Q}x{Q}}}" for i in range(300))
    text = f"<|tool_call>call:get_weather{{list:[{items}]}}<tool_call|>"
    reads = 0
    scalar = tool_calls._gemma_scalar

    def counted(text: str, i: int):
        nonlocal reads
        reads += 1
        return scalar(text, i)

    whole = parse_tool_calls(text, NAMES)
    monkeypatch.setattr(tool_calls, "_gemma_scalar", counted)
    chunks = [text[i : i + 4] for i in range(0, len(text), 4)]
    assert streamed(chunks) == whole and whole.calls
    # Each value is read once, and again only where a step ended inside it (once a step at most).
    assert reads <= 3 * 300 + len(chunks)


def test_a_gemma_value_read_in_steps_is_the_value_read_whole():
    """Wherever the text is cut, a reader that read the part goes on to what one reading the
    whole text gives (keys and strings holding brackets, nesting, numbers cut mid-way)."""
    text = f"{{a:[1, -2.5e3, {{b c:{Q}}}],{Q}}}], d:[], e: {{}}, f:true, g:[[null], [{Q}{Q}]]}}<tool_call|>"
    whole = tool_calls.gemma_value(text, 0)
    assert whole[0] == {"a": [1, -2500.0, {"b c": "}],"}], "d": [], "e": {}, "f": True, "g": [[None], [""]]}
    for cut in range(1, len(text)):
        reader = tool_calls._GemmaReader(0)
        try:
            assert reader.read(text[:cut]) == whole, cut  # complete already
            continue
        except tool_calls._Cut:
            pass
        assert reader.goes_on(text, 0) and reader.read(text) == whole, cut


def test_a_lt_sign_of_prose_is_tried_by_no_form(monkeypatch):
    """Every form is tried only where one of their openings begins (one check for all): a `<` of
    prose (a comparison, an HTML tag) costs no more as forms are added. Text that may still grow
    into an opening waits (the partial marker at the end)."""
    tried = []
    match = ToolCallParser._match
    monkeypatch.setattr(ToolCallParser, "_match", lambda self, text: tried.append(text) or match(self, text))
    prose = "If a < b and <em>c</em> <= d, see <https://example.org> and <tool>s. " * 20
    assert parse_tool_calls(prose + "<tool_c", NAMES) == Parsed((prose + "<tool_c").strip(), [])
    assert tried == ["<tool_c"]  # only where the text may still become <tool_call>, before the reply ended


@pytest.mark.parametrize(
    ("template", "marker"),
    [
        (tool_templates.QWEN25, "<tool_call>"),
        (tool_templates.QWEN35, "<tool_call>"),  # after the think block its call start holds
        (tool_templates.MISTRAL_V3, "[TOOL_CALLS]"),
        (tool_templates.SOLAR_OPEN, "<|tool_calls|>"),  # not the probe call's id after it
        (tool_templates.KIMI_K3, "<|open|>response<|sep|><|close|>response<|sep|><|open|>tools<|sep|>"),
        (tool_templates.FUNCTIONARY_V31, "<function="),
        (tool_templates.LLAMA31, '{"name": "'),
        (tool_templates.FUNCTIONARY_V32, ""),
    ],
    ids=["qwen25", "qwen35", "mistral", "solar", "kimi-k3", "functionary-v31", "llama31", "functionary-v32"],
)
def test_the_marker_a_call_begins_with(template, marker):
    assert inspect_template(renderer(template)).call_marker == marker

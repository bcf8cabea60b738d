"""Chat templates of thinking models whose think blocks, or whose ways of taking an earlier turn's
reasoning back, differ from Qwen's: for the chat, run and reasoning tests. Each is abridged from
the model's own template (as llama.cpp's models/templates holds it) to what those tests read, its
markup and its logic for them kept as they are: how the generation prompt opens the reasoning, and
how an assistant turn writes its reasoning and its answer. tool_templates.py holds templates for
tool calls, whole: LFM2.5's, Hunyuan 3's, Kimi K3's and Muse Glimmer's are taken from there."""

import tool_templates

# Apriel 1.6 Thinker: the generation prompt opens the reasoning with a sentence of text, and the
# model ends it with a line, "[BEGIN FINAL RESPONSE]"; an earlier turn keeps its answer only.
APRIEL16 = r"""{%- set add_generation_prompt = add_generation_prompt or false -%}
{%- set add_thoughts = true -%}
{%- set reasoning_prompt -%}
    You are a thoughtful, systematic AI assistant. Analyze each question carefully, then provide
    the final response after the marker [BEGIN FINAL RESPONSE].
{%- endset -%}
{%- set reasoning_asst_turn_start = 'Here are my reasoning steps:\n' -%}
{%- if messages|length > 0 and messages[0]['role'] != 'system' -%}
    {{ bos_token + '<|begin_system|>\n' + reasoning_prompt + '\n' }}
{%- endif -%}
{%- for message in messages -%}
    {%- if message['role'] == 'user' -%}
        {{ '<|begin_user|>\n' + message['content'] }}
    {%- elif message['role'] == 'system' -%}
        {{ bos_token + '<|begin_system|>\n' + reasoning_prompt + '\n' + message['content'] + '\n' }}
    {%- elif message['role'] == 'assistant' -%}
        {{ '\n<|begin_assistant|>\n' }}
        {%- if add_thoughts and message.get('reasoning_content') and loop.last -%}
            {{ message['reasoning_content'] + '\n[BEGIN FINAL RESPONSE]\n' }}
        {%- endif -%}
        {%- set asst_text = message.get('content', '') -%}
        {%- if not loop.last and '[BEGIN FINAL RESPONSE]' in asst_text -%}
            {{- asst_text.split('[BEGIN FINAL RESPONSE]')[-1] | trim -}}
        {%- else -%}
            {{- asst_text -}}
        {%- endif -%}
        {%- if not loop.last -%}
            {{ '\n<|end|>\n' }}
        {%- endif -%}
    {%- endif -%}
    {%- if loop.last and add_generation_prompt and message['role'] != 'assistant' -%}
        {{ '\n<|begin_assistant|>\n' + reasoning_asst_turn_start }}
    {%- endif -%}
{%- endfor -%}"""

# Hunyuan 3 (Hy3): its own think block's markers; reasoning_effort high or low opens it in the
# generation prompt, no_think (its default) writes it empty.
HY3 = tool_templates.HY3

# MiniMax M3: its own think block's markers; thinking_mode "enabled" opens it in the generation
# prompt, and every earlier turn writes its reasoning back.
MINIMAX_M3 = r"""{%- set bos_token = ']~b]' -%}
{%- set eos_token = '[e~[' -%}
{%- set think_begin_token = '<mm:think>' -%}
{%- set think_end_token = '</mm:think>' -%}
{%- for message in messages -%}
    {%- if message.role == 'assistant' -%}
        {{- bos_token ~ 'ai' ~ '\n' }}
        {%- set reasoning_content = '' %}
        {%- set content = message.content %}
        {%- if message.reasoning_content is string %}
            {%- set reasoning_content = message.reasoning_content %}
        {%- elif think_end_token in content %}
            {%- set reasoning_content = content.split(think_end_token)[0].strip('\n').split(think_begin_token)[-1].strip('\n') %}
            {%- set content = content.split(think_end_token)[-1].strip('\n') %}
        {%- endif %}
        {%- if reasoning_content -%}
            {{- think_begin_token ~ reasoning_content ~ think_end_token }}
        {%- else -%}
            {{- think_end_token }}
        {%- endif -%}
        {{- content }}
        {{- eos_token ~ '\n' }}
    {%- else -%}
        {{- bos_token ~ message.role ~ '\n' ~ message.content ~ eos_token ~ '\n' }}
    {%- endif -%}
{%- endfor -%}
{%- if add_generation_prompt -%}
{{- bos_token ~ 'ai' ~ '\n' }}
{%- if thinking_mode is defined and thinking_mode == "disabled" -%}
    {{- think_end_token }}
{%- elif thinking_mode is defined and thinking_mode == "enabled" -%}
    {{- think_begin_token }}
{%- endif -%}
{%- endif -%}"""

# Ministral 3 Reasoning: an assistant's reasoning is a "thinking" block of its content, which it
# writes back in every turn; the model writes "[THINK]...[/THINK]" itself.
MINISTRAL3 = r"""{{- bos_token }}
{%- if messages[0]['role'] == 'system' %}
    {{- '[SYSTEM_PROMPT]' + messages[0]['content'] + '[/SYSTEM_PROMPT]' -}}
    {%- set loop_messages = messages[1:] %}
{%- else %}
    {%- set loop_messages = messages %}
{%- endif %}
{%- for message in loop_messages %}
    {%- if message['role'] == 'user' %}
        {{- '[INST]' + message['content'] + '[/INST]' }}
    {%- elif message['role'] == 'assistant' %}
        {%- if (message['content'] is none or message['content'] == '' or message['content']|length == 0) %}
            {{- raise_exception('Assistant message must have a string or a list of chunks in content or a list of tool calls.') }}
        {%- endif %}
        {%- if message['content'] is string and message['content'] != '' %}
            {{- message['content'] }}
        {%- elif message['content'] | length > 0 %}
            {%- for block in message['content'] %}
                {%- if block['type'] == 'text' %}
                    {{- block['text'] }}
                {%- elif block['type'] == 'thinking' %}
                    {{- '[THINK]' + block['thinking'] + '[/THINK]' }}
                {%- else %}
                    {{- raise_exception('Only text and thinking chunks are supported in assistant message contents.') }}
                {%- endif %}
            {%- endfor %}
        {%- endif %}
        {{- eos_token }}
    {%- endif %}
{%- endfor %}"""

# LFM2.5 (8B-A1B): reads an assistant's reasoning from `thinking`, and writes it back for the
# turns after the last user message, or for every turn with preserve_thinking (its whole template,
# which the tool-call tests use too).
LFM25 = tool_templates.LFM25

# Muse Glimmer: harmony's messages without channels (engine/harmony.py), the reasoning effort read
# as reasoning_strength; an earlier turn's reasoning is a message to "self" (its whole template,
# which the tool-call tests use too).
MUSE_GLIMMER = tool_templates.MUSE_GLIMMER

# Kimi K3: sections of a message; the generation prompt opens the think section (thinking, its
# default) or the response section, which the model closes; every earlier turn writes its
# reasoning back in its think section.
KIMI_K3 = tool_templates.KIMI_K3

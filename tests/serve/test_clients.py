"""The requests that editors, agents and chat front-ends send to an OpenAI-compatible (or
llama-server) endpoint, as their own code builds them, replayed against serve: each request names
its client and the file it comes from. One tiny model has both Qwen2.5-Coder's fill-in-the-middle
tokens and Qwen2.5's chat template with tools, so that every client's requests go to one server.
What each client reads of the answers is checked with them; docs/serve.md's Clients section says,
per client, how to point it at serve."""

import json

import pytest
import tiny_models as tm
import tool_templates
from serving import CTX, Server

import specllm

FIM_PROMPT = "<|fim_prefix|>def total(values):\n    result = 0\n<|fim_suffix|>\n    return result\n<|fim_middle|>"

# Continue's autocompletion stops, for a Qwen coder model: its FIM template's
# (core/autocomplete/templating/AutocompleteTemplate.ts, qwenCoderFimTemplate) and its own
# (core/autocomplete/templating/getStopTokens.ts, commonStops). Its OpenAI provider sends them all
# to any host but OpenAI's, Groq's and Azure's (core/llm/llms/OpenAI.ts, getMaxStopWords).
CONTINUE_STOPS = [
    "<|endoftext|>", "<|fim_prefix|>", "<|fim_middle|>", "<|fim_suffix|>", "<|fim_pad|>", "<|repo_name|>",
    "<|file_sep|>", "<|im_start|>", "<|im_end|>", "/src/", "#- coding: utf-8", "```",
]  # fmt: skip

READ_FILE = {
    "type": "function",
    "function": {
        "name": "read_file",
        "description": "Read a file of the project",
        "parameters": {"type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]},
    },
}
READ_CALL = {"id": "call_0", "type": "function", "function": {"name": "read_file", "arguments": '{"path": "a.py"}'}}
AGENT_TURNS = [
    {"role": "system", "content": "You are a coding agent."},
    {"role": "user", "content": "What is in a.py?"},
    {"role": "assistant", "content": None, "tool_calls": [READ_CALL]},
    {"role": "tool", "tool_call_id": "call_0", "content": "x = 1\n"},
]
USAGE = {"stream_options": {"include_usage": True}}

# A client's representative chat requests: (client and file, body). max_tokens is each client's
# setting; a small one here keeps the tiny model's replies short.
CHAT_REQUESTS = [
    (  # chat, through its OpenAI adapter: packages/openai-adapters/src/apis/OpenAI.ts (modifyChatBody)
        "Continue, core/llm/openaiTypeConverters.ts (toChatBody)",
        {"model": "specllm", "messages": [{"role": "user", "content": [{"type": "text", "text": "Explain it"}]}],
         "max_tokens": 8, "stream": True, "tools": [READ_FILE], "parallel_tool_calls": False} | USAGE,
    ),
    (  # Cline and opencode: the AI SDK's openai-compatible provider, includeUsage set by both
        "AI SDK, packages/openai-compatible/src/chat/openai-compatible-chat-language-model.ts (getArgs, doStream)",
        {"model": "specllm", "max_tokens": 8, "temperature": 0, "messages": AGENT_TURNS,
         "tools": [READ_FILE | {"function": READ_FILE["function"] | {"strict": True}}], "tool_choice": "auto",
         "stream": True} | USAGE,
    ),
    (
        "Roo Code, src/api/providers/openai.ts (createMessage; tools from base-provider.ts)",
        {"model": "specllm", "temperature": 0, "messages": AGENT_TURNS, "stream": True, "tools": [READ_FILE],
         "tool_choice": "auto", "parallel_tool_calls": True, "max_completion_tokens": 8} | USAGE,
    ),
    (  # its Request struct: crates/open_ai/src/open_ai.rs
        "Zed, crates/open_ai/src/completion.rs (into_open_ai)",
        {"model": "specllm", "messages": AGENT_TURNS, "stream": True, "max_completion_tokens": 8, "temperature": 1.0,
         "tools": [READ_FILE], "tool_choice": "auto", "prompt_cache_key": "thread-1"} | USAGE,
    ),
    (  # litellm sends what Aider gives it, for an openai/ model with a base URL
        "Aider, aider/models.py (send_completion)",
        {"model": "specllm", "stream": True, "temperature": 0, "max_tokens": 8,
         "messages": [{"role": "system", "content": "Act as an expert developer."}, {"role": "user", "content": "Hi"}]},
    ),
    (
        "Open WebUI, backend/open_webui/routers/openai.py (generate_chat_completion)",
        {"model": "code.gguf", "messages": [{"role": "user", "content": "Hi"}], "stream": True,
         "max_tokens": 8} | USAGE,
    ),
    (  # its title, tags and follow-ups are asked for in words, not with response_format
        "Open WebUI, backend/open_webui/routers/tasks.py (generate_title)",
        {"model": "code.gguf", "messages": [{"role": "user", "content": "### Task:\nGenerate a concise title"}],
         "stream": False, "max_completion_tokens": 8},
    ),
    (
        "LangChain, libs/partners/openai/langchain_openai/chat_models/base.py (_default_params)",
        {"model": "specllm", "stream": False, "n": 1, "temperature": 0.7, "max_tokens": 8,
         "messages": [{"role": "user", "content": "Hi"}]},
    ),
    (  # the Agents SDK with chat completions: an assistant message of calls has no content at all
        "openai-agents-python, src/agents/models/openai_chatcompletions.py (_fetch_response)",
        {"model": "specllm", "messages": [{k: v for k, v in m.items() if v is not None} for m in AGENT_TURNS],
         "tools": [READ_FILE], "stream": True, "max_tokens": 8},
    ),
    (
        "llama.vscode, src/llama-server.ts (createToolsRequestPayload)",
        {"messages": AGENT_TURNS, "stream": True, "tools": [READ_FILE], "tool_choice": "auto", "max_tokens": 8},
    ),
    (
        "llama.vscode, src/llama-server.ts (createChatEditRequestPayload)",
        {"messages": [{"role": "system", "content": "You are an expert coder.\n"}, {"role": "user", "content": "x"}],
         "stream": False, "cache_prompt": True, "temperature": 0.8, "top_p": 0.95, "max_tokens": 8},
    ),
    (
        "llama.vim, autoload/llama.vim (llama#inst_send)",
        {"id_slot": 1, "messages": [{"role": "user", "content": "Rewrite it"}], "min_p": 0.1, "temperature": 0.1,
         "samplers": ["min_p", "temperature"], "stream": True, "cache_prompt": True, "max_tokens": 8},
    ),
]  # fmt: skip


@pytest.fixture(scope="module")
def engine(tmp_path_factory):
    path = tmp_path_factory.mktemp("clients") / "code.gguf"
    tm.write_model(path, seed=0, vocab="code", chat_template=tool_templates.QWEN25)
    engine = specllm.load(str(path), n_ctx=CTX, n_threads=1)
    yield engine
    engine.close()


@pytest.fixture(scope="module")
def srv(engine):
    s = Server(engine)
    yield s
    s.stop()


def greedy_cut(engine, stops: list[str]) -> tuple[str, str]:
    """The greedy completion of FIM_PROMPT cut at its first stop string, and a stop string of a
    user's own (the one that cuts it, after all of Continue's)."""
    whole = engine.generate(FIM_PROMPT, max_tokens=24, temperature=0, drafter="none").text
    user_stop = whole[8:11]
    cut = min((whole.find(s) for s in [*stops, user_stop] if s in whole), default=len(whole))
    assert cut == whole.index(user_stop)  # the user's stop, past OpenAI's four, is the one that cuts
    return whole[:cut], user_stop


def test_continues_autocompletion_with_a_dozen_stop_strings(srv, engine):
    """Continue's OpenAI provider completes at the cursor on /v1/completions with its FIM prompt
    and its stop strings (core/llm/llms/OpenAI.ts, _legacystreamComplete; temperature 0.01 in
    core/autocomplete/CompletionProvider.ts, greedy here to compare): serve took at most 4."""
    cut, user_stop = greedy_cut(engine, CONTINUE_STOPS)
    body = {"model": "specllm", "prompt": FIM_PROMPT, "max_tokens": 24, "temperature": 0, "stream": True}
    events = srv.post_events("/v1/completions", body | {"stop": [*CONTINUE_STOPS, user_stop]})
    *chunks, done = events
    assert done == "[DONE]" and "".join(chunk["choices"][0]["text"] for chunk in chunks) == cut
    assert chunks[-1]["choices"][0]["finish_reason"] == "stop"


def test_continues_llama_cpp_provider_with_a_dozen_stop_strings(srv, engine):
    """Continue's llama.cpp provider sends the same prompt and stops to /completion
    (core/llm/llms/LlamaCpp.ts, _streamComplete and _convertArgs), and reads `content`."""
    cut, user_stop = greedy_cut(engine, CONTINUE_STOPS)
    body = {"model": "specllm", "prompt": FIM_PROMPT, "stream": True, "n_predict": 24, "temperature": 0}
    *chunks, last = srv.post_events("/completion", body | {"stop": [*CONTINUE_STOPS, user_stop]})
    assert "".join(chunk["content"] for chunk in chunks) == cut and last["stop_type"] == "word"


def test_stop_strings_past_the_limit_are_one_400(srv):
    status, data = srv.post("/v1/completions", json.dumps({"prompt": "x", "stop": ["a"] * 65}).encode())
    assert status == 400 and (data["error"]["param"], data["error"]["message"]) == (
        "stop",
        "at most 64 stop strings, got 65",
    )


def test_llama_vims_warm_up_chat_samples_one_token(srv):
    """llama.vim sends the chat of an instruction ahead with n_predict 0, to fill the KV cache while
    its user types (autoload/llama.vim, llama#inst): serve generated a whole reply, to the end of
    the context, and the instruction itself waited for it."""
    warm = {
        "id_slot": 1, "messages": [{"role": "user", "content": "Rewrite it"}], "samplers": [], "n_predict": 0,
        "stream": False, "cache_prompt": True, "response_fields": [""],
    }  # fmt: skip
    status, data = srv.post("/v1/chat/completions", json.dumps(warm).encode())
    assert status == 200 and data["usage"]["completion_tokens"] == 1
    # llama-server's n_predict goes over max_tokens, on OpenAI's endpoints as on its own
    body = {"prompt": "def", "max_tokens": 2, "n_predict": 5, "temperature": 0}
    assert srv.post("/v1/completions", json.dumps(body).encode())[1]["usage"]["completion_tokens"] == 5


def test_models_lists_the_context_under_the_names_clients_read(srv):
    """Continue's vllm provider reads max_model_len (core/llm/llms/Vllm.ts) and llama.vscode's agent
    context_length (src/language-model-token-limits.ts), to fit their prompts to the context."""
    (model,) = srv.get("/v1/models")["data"]
    assert model["id"] == "tiny" and model["object"] == "model" and model["owned_by"] == "specllm"
    assert model["max_model_len"] == model["context_length"] == CTX


@pytest.mark.parametrize(("client", "body"), CHAT_REQUESTS, ids=[client.split(",")[0] for client, _ in CHAT_REQUESTS])
def test_clients_chat_requests_get_the_answers_they_read(srv, client, body):
    if body["stream"]:
        check_chat_stream(srv.post_events("/v1/chat/completions", body), "stream_options" in body)
    else:
        status, data = srv.post("/v1/chat/completions", json.dumps(body).encode())
        assert status == 200, data
        (choice,) = data["choices"]
        assert data["id"].startswith("chatcmpl-") and isinstance(data["created"], int)
        assert choice["message"]["role"] == "assistant" and isinstance(choice["message"]["content"], str)
        assert choice["finish_reason"] in ("length", "stop") and data["usage"]["completion_tokens"] <= 8


def check_chat_stream(events: list, with_usage: bool) -> None:
    """What the clients read of a stream: one id, a role in the first delta, a finish_reason in
    the last choice only (the AI SDK calls a stream without one an error), the usage after it
    when asked for (no choices), and [DONE]."""
    assert isinstance(events[0], dict) and "error" not in events[0], events[0]
    *chunks, done = events
    usage = chunks.pop()["usage"] if with_usage else None
    assert done == "[DONE]" and len({chunk["id"] for chunk in chunks}) == 1
    assert all(isinstance(chunk["created"], int) and chunk["model"] for chunk in chunks)
    choices = [chunk["choices"][0] for chunk in chunks]
    assert choices[0]["delta"]["role"] == "assistant"
    *going, last = [c["finish_reason"] for c in choices]
    assert going == [None] * len(going) and last in ("length", "stop")
    if with_usage:
        assert usage["completion_tokens"] <= 8
        assert usage["total_tokens"] == usage["prompt_tokens"] + usage["completion_tokens"]


def test_llama_vscodes_completion_with_its_own_fields(srv):
    """llama.vscode's completion at the cursor (src/llama-server.ts, createRequestPayload): the
    fields llama-server takes and serve ignores (id_slot, n_cmpl, samplers, cache_prompt,
    t_max_prompt_ms) come with it. One completion comes back; the plugin reads `content` of one as
    of several (src/completion.ts, getComplFromContent)."""
    body = {
        "id_slot": 0, "input_prefix": "def total(values):\n", "input_suffix": "\n    return result\n",
        "input_extra": [{"filename": "a.py", "text": "x = 1\n"}], "prompt": "    res", "n_predict": 8,
        "n_cmpl": 3, "top_k": 40, "top_p": 0.99, "stream": False, "samplers": ["top_k", "top_p", "infill"],
        "cache_prompt": True, "n_indent": 4, "t_max_prompt_ms": 500, "t_max_predict_ms": 1000, "model": "specllm",
    }  # fmt: skip
    status, data = srv.post("/infill", json.dumps(body).encode())
    assert status == 200 and isinstance(data["content"], str) and data["stop"] is True
    assert {"tokens_cached", "truncated", "timings"} <= set(data)

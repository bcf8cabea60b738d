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

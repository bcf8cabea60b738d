"""A Model and a target's MtpHead on the tiny real GGUF models: what they refuse once closed."""

import contextlib

import pytest

import specllm
from specllm.errors import ChatTemplateFailed, SpecllmError


@pytest.mark.parametrize("name", ["target", "qwen35", "mamba", "qwen35_mtp"])
def test_a_closed_model_refuses_every_call_on_its_kv_cache_in_one_line(name, request):
    """The engine's models stay reachable after engine.close() (engine.target): their vocabulary
    calls said "closed", but evaluating, cutting back or checkpointing used llama.cpp's freed
    context (a segmentation fault)."""
    models = request.getfixturevalue("tiny_models" if name == "target" else "tiny_recurrent_models")
    engine = specllm.load(str(getattr(models, name)), n_ctx=256, n_threads=1)
    engine.generate("Hello world", max_tokens=4, temperature=0)
    engine.close()
    target = engine.target
    calls = [
        lambda: target.eval([1, 2]),
        lambda: target.sync([1, 2, 3], n_logits=1),
        lambda: target.truncate(0),
        lambda: target.checkpoint(),
    ]
    if engine.mtp is not None:
        calls += [
            lambda: engine.mtp.sync([1, 2], n_logits=1),
            lambda: engine.mtp.eval([1]),
            lambda: engine.mtp.truncate(0),
        ]
    for call in calls:
        with pytest.raises(SpecllmError, match=r"\.gguf is closed: load the model again"):
            call()
    with contextlib.suppress(SpecllmError):  # known before the close, or refused
        assert target.state_bytes >= 0


USER = {"role": "user", "content": "hi"}


@pytest.mark.parametrize(
    "messages, tools, message",
    [
        ("hi", None, "^messages are a list of .* dicts, not str$"),
        (USER, None, "^messages are a list of .* dicts, not dict$"),
        (None, None, "^messages are a list of .* dicts, not NoneType$"),
        ([("user", "hi")], None, r"^messages\[0\] is a tuple, not a dict with a role and content$"),
        ([USER, {"content": "hi"}], None, r"^messages\[1\] has no role \(a str such as 'user'\)$"),
        ([{"role": 5, "content": "hi"}], None, r"^messages\[0\] has no role"),
        ([{"role": "user"}], None, r"^messages\[0\] \(user\) has no content$"),
        ([{"role": "user", "content": None}], None, r"^messages\[0\] \(user\) has no content$"),
        ([{"role": "assistant", "content": None}], None, r"^messages\[0\] \(assistant\) has no content$"),
        ([{"role": "user", "content": 5}], None, r"^messages\[0\]'s content is text or a list of parts, not int$"),
        ([USER], "get_weather", r"^tools are a list of dicts \(OpenAI's function tools\), not str$"),
        ([USER], ["get_weather"], r"^tools are a list of dicts"),
    ],
)
def test_a_conversation_in_a_wrong_shape_is_refused_as_such_not_blamed_on_the_template(
    tiny_models, messages, tools, message
):
    """It was "the chat template of target.gguf failed: 'tuple object' has no attribute 'role'",
    which points at the model file; a str for tools was rendered as no tools."""
    with specllm.load(str(tiny_models.target), n_ctx=256, n_threads=1) as engine:
        with pytest.raises(SpecllmError, match=message):
            engine.target.render_chat(messages, tools=tools)
        answer = {"role": "assistant", "content": "hello"}
        assert engine.target.render_chat([USER, answer, USER], add_generation_prompt=False).count("user") == 2
        call = {"role": "assistant", "content": None, "tool_calls": [{"type": "function", "function": {}}]}
        with pytest.raises(ChatTemplateFailed, match="concatenate str"):  # the shape is right: ChatML's own limit
            engine.target.render_chat([USER, call])

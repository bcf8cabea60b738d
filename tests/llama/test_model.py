"""A Model and a target's MtpHead on the tiny real GGUF models: what they refuse once closed."""

import contextlib

import pytest

import specllm
from specllm.errors import SpecllmError


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

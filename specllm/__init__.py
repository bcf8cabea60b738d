"""specllm: speculative decoding for llama.cpp GGUF models.

    import specllm
    engine = specllm.load(target="t.gguf", draft="d.gguf")
    result = engine.generate("raw prompt text", max_tokens=64, temperature=0.0, drafter="model", gamma=4)
    result.tokens, result.text, result.stats
"""

from .backend import ModelOptions
from .engine import Engine, Finished, GenerationConfig, Result, Stats, Step
from .errors import SpecllmError
from .sampling import SamplerSettings

__all__ = [
    "Engine",
    "Finished",
    "GenerationConfig",
    "ModelOptions",
    "Result",
    "SamplerSettings",
    "SpecllmError",
    "Stats",
    "Step",
    "load",
]


def load(
    target: str,
    draft: str | None = None,
    *,
    n_ctx: int = 4096,
    n_threads: int | None = None,
    n_gpu_layers: int | None = None,
    draft_gpu_layers: int | None = None,
) -> Engine:
    """Load a target GGUF (and optionally a draft GGUF with a compatible vocabulary)."""
    from .backend import Model

    target_model = Model(target, ModelOptions(n_ctx=n_ctx, n_threads=n_threads, n_gpu_layers=n_gpu_layers))
    draft_model = None
    if draft is not None:
        options = ModelOptions(n_ctx=n_ctx, n_threads=n_threads, n_gpu_layers=draft_gpu_layers)
        draft_model = Model(draft, options)
    return Engine(target_model, draft_model)

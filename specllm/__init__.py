"""specllm: speculative decoding for llama.cpp GGUF models.

import specllm
engine = specllm.load(target="t.gguf", draft="d.gguf")
result = engine.generate("raw prompt text", max_tokens=64, temperature=0.0)   # drafter="auto"
result.tokens, result.text, result.stats
"""

import importlib
import os
from collections.abc import Sequence
from typing import TYPE_CHECKING

from specllm._version import __version__
from specllm.errors import SpecllmError

# The rest of the API is imported when first used, not with the package: the `specllm` command
# imports the package before it can handle a Ctrl-C, and llama_cpp takes half a second to import.
_LAZY = {
    "ModelOptions": "llama.options",
    "Engine": "engine.loop",
    "Finished": "engine.loop",
    "GenerationConfig": "engine.loop",
    "Result": "engine.loop",
    "Stats": "engine.loop",
    "Step": "engine.loop",
    "SamplerSettings": "engine.sampling",
}

if TYPE_CHECKING:  # the names _LAZY gives, as a type checker must see them (not as Any)
    from specllm.engine.loop import Engine, Finished, GenerationConfig, Result, Stats, Step
    from specllm.engine.sampling import SamplerSettings
    from specllm.llama.options import ModelOptions
else:  # hidden from type checkers, which would take any misspelt name for one it returns

    def __getattr__(name: str) -> object:
        if name in _LAZY:
            return getattr(importlib.import_module(f".{_LAZY[name]}", __name__), name)
        try:  # a subpackage (specllm.engine.loop, ...), as when the package imported them all
            return importlib.import_module(f".{name}", __name__)
        except ModuleNotFoundError as e:
            if e.name != f"{__name__}.{name}":  # one the submodule needs: say that
                raise
            raise AttributeError(f"module {__name__!r} has no attribute {name!r}") from None


def __dir__() -> list[str]:
    """The lazy names too: help(specllm) lists what dir() does."""
    return sorted({*globals(), *_LAZY})


__all__ = [
    "Engine",
    "Finished",
    "GenerationConfig",
    "ModelOptions",
    "Result",
    "SamplerSettings",
    "SpecllmError",
    "__version__",
    "Stats",
    "Step",
    "load",
]


def load(
    target: str | os.PathLike[str],
    draft: str | os.PathLike[str] | None = None,
    *,
    n_ctx: int = 4096,
    n_threads: int | None = None,
    n_gpu_layers: int | None = None,
    draft_gpu_layers: int | None = None,
    defer_draft: bool = False,
    rpc: str | Sequence[str] = (),
    draft_rpc: str | Sequence[str] = (),
    snapshots: int = 8,  # llama.options.DEFAULT_SNAPSHOTS
) -> "Engine":
    """Load a target GGUF (and optionally a draft GGUF with a compatible vocabulary). With
    defer_draft, only the draft's vocabulary is checked now and the model itself is loaded when a
    generation first needs it: the `auto` drafter does not load a draft that cannot pay here.
    `rpc` (["host:port", ...] or "host:port,...") puts the target's offloaded layers (all, unless
    n_gpu_layers says otherwise) on those llama.cpp rpc-servers; `draft_rpc` the draft's.
    `snapshots`: how many rejected draft tokens a hybrid or recurrent target can take back after a
    verify call (the longest draft on such a target; each costs a copy of its recurrent state).
    `target` and `draft` may be hf:OWNER/REPO/FILE.gguf (downloaded to the cache unless it is
    there) or name a model in another tool's store: ollama:NAME[:TAG],
    lmstudio:PUBLISHER/REPO/FILE.gguf, llamacpp:FILE.gguf (used in place, never copied)."""
    from specllm import report
    from specllm.engine.loop import Engine
    from specllm.llama.model import Model
    from specllm.llama.options import ModelOptions
    from specllm.llama.vocab import ensure_compatible
    from specllm.models.hub import resolve_models

    if not isinstance(defer_draft, bool):  # defer_draft="no" would defer it
        raise SpecllmError(f"defer_draft must be True or False, got {defer_draft!r}")

    def model_file(spec: object, what: str) -> str:
        if isinstance(spec, str):  # read as the command line reads --target: "~/m.gguf" is in the home folder
            return str(resolve_models(target=spec, progress=False)[0])
        path = os.fspath(spec) if isinstance(spec, os.PathLike) else None
        if not isinstance(path, str):  # not "file not found: None"
            raise SpecllmError(f"{what} is a model file's path (a str or a Path), not {type(spec).__name__}")
        return path  # as it is, never a store's name

    target_path = model_file(target, "target")
    draft_path = None if draft is None else model_file(draft, "draft")

    options = ModelOptions(n_ctx=n_ctx, n_threads=n_threads, n_gpu_layers=n_gpu_layers, rpc=rpc, snapshots=snapshots)
    target_model = Model(target_path, options)
    if target_model.pre_tokenizer_missing:  # (a draft's text is never split into tokens: no matter there)
        report.say(
            f"warning: {target_model.path.name} names no pre-tokenizer (tokenizer.ggml.pre, which GGUFs "
            "converted before May 2024 lack): llama.cpp splits its text by default rules that may not be "
            "the model's, and its answers can be worse; a newer conversion of the model has it"
        )
    if draft_path is None:
        return Engine(target_model)
    # A draft never uses snapshots: its one-token steps leave none to go back to (see ModelDrafter).
    options = ModelOptions(n_ctx=n_ctx, n_threads=n_threads, n_gpu_layers=draft_gpu_layers, rpc=draft_rpc, snapshots=0)
    if defer_draft:
        ensure_compatible(target_path, draft_path, target=target_model)  # refuse a bad pair now, not mid-chat
        # absolute: the program may change its working directory before the draft is loaded
        return Engine(target_model, draft_file=(os.path.abspath(draft_path), options))
    return Engine(target_model, Model(draft_path, options))

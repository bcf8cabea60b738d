"""Structured output by its definition, one token at a time: what a grammar allows found by
asking it about each token alone, and target-only greedy decoding as the argmax over those. The
engine's masks (engine/constrained.py, sampling.masked) are checked against these."""

import numpy as np


def brute_force_mask(grammar, n_vocab: int) -> np.ndarray:
    """Which tokens the grammar (a Grammar or an OutputGrammar) allows, asked one token at a time."""
    return np.array([grammar.allowed(np.array([t]))[0] for t in range(n_vocab)])


def greedy_by_brute_force(model, prompt_ids: list[int], grammar, max_tokens: int) -> list[int]:
    """Target-only greedy decoding under `grammar` (advanced as it goes): each row masked by
    brute_force_mask, one model call per token, up to an end of generation."""
    out: list[int] = []
    while len(out) < max_tokens:
        row = model.sync(prompt_ids + out, n_logits=1)[0].copy()
        row[~brute_force_mask(grammar, model.n_vocab)] = -np.inf
        token = int(np.argmax(row))
        if model.is_eog(token):
            break
        grammar.accept(token)
        out.append(token)
    return out


def accepts(grammar, text: str) -> bool:
    """Whether `text` is in the grammar's language, by llama.cpp's own grammar sampler: its bytes
    fed one byte token at a time (tiny_models' byte-fallback tokens), then whether the end of
    generation is allowed. `grammar` is left as it was (each test runs on a clone)."""
    import tiny_models as tm

    state = grammar.clone()
    try:
        for byte in text.encode("utf-8"):
            token = tm.byte_token_id(byte)
            if not state.allowed(np.array([token]))[0]:
                return False
            state.accept(token)
        return bool(state.allowed(np.array([tm.EOS_ID]))[0])
    finally:
        state.close()

"""Prompt reuse across generations: which tokens of a new prompt the target's KV cache already
holds. Chat (a conversation turn after turn) and serve (requests that continue a conversation)
both render a conversation to text and ask a PromptCache for its tokens.

Staying fast turn after turn rests on the engine's KV reuse: a prompt is the whole conversation
rendered with the target's chat template, and the engine evaluates only what its caches do not
already hold. To make that "only the new tokens", a prompt whose text extends the previous
generation's transcript (its prompt text plus the text it generated) exactly reuses that
generation's tokens as they were, the generated tokens included, and tokenizes only the text
after them. Re-tokenizing the whole text instead would re-prefill every reply whose text
tokenizes differently from how it was generated (invalid UTF-8, non-canonical merges). When the
text does not extend it (a template that trims or rewrites history, a changed system prompt,
dropped turns, an interrupted reply, another client's prompt), the whole text is tokenized and the
engine falls back to the longest common token prefix with what its KV cache holds.

A generation cut by a stop string (or by an editor's limit, which cuts the text within a token
too) is not remembered. Its text ends where the stop string begins,
but its tokens go on: the token that completed the stop string spells the stop string (and maybe
more), and tokens accepted with it may follow. Reusing those tokens for a prompt whose text merely
extends the cut text would put tokens in front of the model that its transcript does not hold,
and the reply would differ from a fresh run's. So after a stop string, as after an interrupted
generation, the next prompt is tokenized whole and reuses only the common token prefix, which is
always safe.
"""

from dataclasses import dataclass

from specllm.engine.loop import Engine, Result
from specllm.llama.model import common_prefix


@dataclass(frozen=True)
class PromptTokens:
    """A prompt's tokens and how they relate to what the KV cache holds."""

    tokens: list[int]
    reused: int  # leading tokens the KV cache already holds (after a restore: not yet)
    extended: bool  # the text extended the remembered transcript (its tokens reused as they were)


class PromptCache:
    """The transcript of the engine's last generation: its prompt + generated text and the tokens
    its KV cache holds for them, remembered only when the two spell the same thing."""

    def __init__(self, engine: Engine):
        self.engine = engine
        self._last: tuple[str, list[int]] | None = None

    @property
    def tokens(self) -> list[int] | None:
        """The remembered transcript's tokens, or None when nothing is remembered."""
        return self._last[1] if self._last else None

    def forget(self) -> None:
        """Nothing of the KV cache may be reused as text: it changes, or was cut short."""
        self._last = None

    def remember(self, prompt_text: str | None, prompt_tokens: list[int], result: Result | None) -> None:
        """Keep the transcript of a generation that has ended (result None: cut short; forgotten,
        as is one whose prompt was token ids, with no text). A generation cut by a stop string or
        a limit is forgotten too: see the module docstring."""
        if prompt_text is None or result is None or result.stop_reason in ("stop", "limit"):
            self._last = None
        else:
            self._last = (prompt_text + result.text, prompt_tokens + result.tokens)

    def restore(self, text: str, tokens: list[int]) -> None:
        """Take `tokens` as the transcript `text` (a saved conversation), for the next prompt to
        extend; the caller has checked that they spell it."""
        self._last = (text, list(tokens))

    def prompt(self, text: str, full: list[int] | None = None) -> PromptTokens:
        """The prompt tokens of `text`. See the module docstring for why a text that extends the
        remembered transcript reuses its tokens. `full`: the text's own tokens (text_tokens), when
        made already (a server tokenizes a request's text before the engine is its)."""
        target = self.engine.target
        full = self.engine.prompt_tokens(text) if full is None else full
        if self._last is not None:
            last_text, last_tokens = self._last
            if text.startswith(last_text):
                tail = target.tokenize(text[len(last_text) :], add_special=False, parse_special=True)
                # The tail must tokenize on its own as it does at the end of the whole text, or
                # the split would put tokens the model never sees in a fresh run.
                if tail and full[-len(tail) :] == tail:
                    return PromptTokens(last_tokens + tail, len(last_tokens), True)
        # What the engine will reuse: the longest common prefix with what the KV cache holds.
        return PromptTokens(full, common_prefix(target.tokens, full), False)

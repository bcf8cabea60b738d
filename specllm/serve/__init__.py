"""`specllm serve`: an OpenAI-compatible HTTP server, its tool calls and the page in the browser."""

# Requests that may wait for the engine at once, by default: a queue this long is minutes at a
# CPU's speed, and each waiting request holds its body (up to 1 MiB, or 64 bytes a context token).
MAX_WAITING = 64

# Seconds a grammar's first mask over the vocabulary may take, by default (serve --grammar-budget):
# real schemas take milliseconds on Qwen2.5's 152k tokens (docs/serve.md), a hostile grammar
# seconds to minutes a token, all of them on the engine's thread.
GRAMMAR_BUDGET = 1.0

# Bytes of other conversations' KV caches kept in memory, by default (serve --cache-ram): a 4,000-
# token conversation of the default 1.5B target is 109 MiB, and a side request that cut it back
# would cost its next turn a minute of prefill on a small CPU.
CACHE_RAM = 2048 * 2**20


def default_cache_ram(available: int | None) -> int:
    """--cache-ram's default: CACHE_RAM, or a quarter of the memory the machine has left once the
    models are loaded (`available`, bytes) where that is less. Saved states only spare a prefill:
    they must not push a laptop into swap, or a container past its memory limit."""
    return CACHE_RAM if available is None else max(0, min(CACHE_RAM, available // 4))

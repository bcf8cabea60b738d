"""`specllm serve`: an OpenAI-compatible HTTP server, its tool calls and the page in the browser."""

# Requests that may wait for the engine at once, by default: a queue this long is minutes at a
# CPU's speed, and each waiting request holds its body (up to 1 MiB, or 64 bytes a context token).
MAX_WAITING = 64

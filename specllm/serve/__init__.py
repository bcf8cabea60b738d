"""`specllm serve`: an OpenAI-compatible HTTP server, its tool calls and the page in the browser."""

"""`specllm bench`: side-by-side measurements of drafting configurations, and their views."""

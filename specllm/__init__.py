"""specllm: speculative decoding for llama.cpp GGUF models."""

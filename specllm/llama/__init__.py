"""The only package that talks to llama.cpp (through llama-cpp-python's low-level API), split by
concern: options, memory, model, templates, vocab, huge_pages, devices, system, rpc, log, gguf_header."""

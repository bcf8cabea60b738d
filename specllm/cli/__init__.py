"""The `specllm` command line (Typer). Adds the flag hints to the library's errors."""

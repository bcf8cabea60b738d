"""Slowing llama.cpp's calls down by a known amount, to check what the engine counts as theirs."""

import time

import llama_cpp

from specllm.llama import model

SLOW_CALL = 0.005  # seconds each slowed call sleeps: more than the loop's own work a step on a tiny model


def _slow(real):
    def slow(*args):
        time.sleep(SLOW_CALL)
        return real(*args)

    return slow


def slowed(monkeypatch, *names: str) -> None:
    """Make each named llama.cpp function sleep SLOW_CALL before it runs: llama_cpp's binding, and
    specllm's own where it binds the function again."""
    for name in names:
        for module in (llama_cpp, model):
            if hasattr(module, name):
                monkeypatch.setattr(module, name, _slow(getattr(module, name)))

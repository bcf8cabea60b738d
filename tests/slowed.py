"""Slowing llama.cpp's calls down by a known amount, to check what the engine counts as theirs."""

import time

import llama_cpp

SLOW_CALL = 0.005  # seconds each slowed call sleeps: more than the loop's own work a step on a tiny model


def _slow(real):
    def slow(*args):
        time.sleep(SLOW_CALL)
        return real(*args)

    return slow


def slowed(monkeypatch, *names: str) -> None:
    """Make each named llama.cpp function sleep SLOW_CALL before it runs."""
    for name in names:
        monkeypatch.setattr(llama_cpp, name, _slow(getattr(llama_cpp, name)))

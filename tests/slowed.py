"""Slowing llama.cpp's calls down by a known amount, to check what the engine counts as theirs."""

import threading
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


def closed_from_another_thread(generation) -> list:
    """Consume `generation` in a thread of its own and close it from this one once its first step
    is out (slowed, the consumer is then most likely inside the next); the steps it saw."""
    first_step, steps = threading.Event(), []

    def consume():
        for step in generation:
            steps.append(step)
            first_step.set()

    worker = threading.Thread(target=consume)
    worker.start()
    first_step.wait()
    generation.close()
    worker.join()
    return steps

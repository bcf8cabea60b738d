"""What bounding a chat template's rendering costs: each model's own template renders a long
conversation in llama-cpp-python's sandbox (as llama-cpp-python renders it) and in specllm's bounded
one, alternately; the two texts must be equal.

    python benchmarks/template_cost.py [MODEL.gguf ...] [--turns 100] [--rounds 15]

Without models, the built-in ChatML template. Prints one row a template: its rendered characters and
the median render time of each sandbox, in milliseconds."""

import argparse
import statistics
import time
from pathlib import Path

import jinja2
from llama_cpp.llama_chat_format import Jinja2ChatFormatter as Formatter

from specllm.llama.gguf_header import read_metadata
from specllm.llama.templates import CHATML_TEMPLATE, compile_chat_template, render_bounded


def conversation(turns: int) -> list[dict]:
    messages = [{"role": "system", "content": "You are a helpful assistant."}]
    for i in range(turns):
        messages.append({"role": "user", "content": f"Question {i}: " + "word " * 200})
        messages.append({"role": "assistant", "content": f"Answer {i}: " + "text " * 200})
    return messages


def timed(render) -> tuple[str, float]:
    start = time.perf_counter()
    text = render()
    return text, time.perf_counter() - start


def measure(name: str, source: str, messages: list[dict], rounds: int) -> str:
    plain, bounded = Formatter(source, eos_token="</s>", bos_token="<s>"), compile_chat_template(source)
    variables = {"messages": messages, "add_generation_prompt": True, "bos_token": "<s>", "eos_token": "</s>"}
    before, after = [], []
    for _ in range(rounds):
        text, seconds = timed(lambda: plain(messages=messages).prompt)
        before.append(seconds)
        bounded_text, seconds = timed(lambda: render_bounded(bounded, **variables))
        after.append(seconds)
        if bounded_text != text:
            raise SystemExit(f"{name}: the bounded sandbox rendered another text")
    ms_before, ms_after = statistics.median(before) * 1e3, statistics.median(after) * 1e3
    return f"{name:40} {len(text):9} {ms_before:12.2f} {ms_after:12.2f}"


def templates(models: list[Path]) -> list[tuple[str, str]]:
    if not models:
        return [("ChatML (built in)", CHATML_TEMPLATE)]
    found = []
    for model in models:
        source = read_metadata(model, {"tokenizer.chat_template"}).get("tokenizer.chat_template")
        if source is None:
            raise SystemExit(f"{model} carries no chat template")
        found.append((model.name, source))
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("models", nargs="*", type=Path)
    parser.add_argument("--turns", type=int, default=100)
    parser.add_argument("--rounds", type=int, default=15)
    args = parser.parse_args()
    messages = conversation(args.turns)
    print(f"{'template':40} {'chars':>9} {'plain ms':>12} {'bounded ms':>12}")
    for name, source in templates(args.models):
        try:
            print(measure(name, source, messages, args.rounds), flush=True)
        except (ValueError, jinja2.TemplateError) as e:  # a bound, or the template's own error
            raise SystemExit(f"{name}: the template failed: {e}") from None


if __name__ == "__main__":
    main()

"""`specllm serve` against `specllm run`: decode speed, and time to first token with KV reuse.

    python benchmarks/serve_speed.py                        # the default pair, 128 tokens, 3 rounds
    python benchmarks/serve_speed.py --pair NAME --max-tokens 256 --rounds 5 --drafter none
    python benchmarks/serve_speed.py --target T.gguf --draft D.gguf --json out.json

It starts `specllm serve` on a free loopback port and, round by round (alternating which goes
first), streams one greedy chat request through the real `openai` client and runs `specllm run
--json` on the same prompt with the same settings. Decode speed is reported three ways: `run`'s
tokens_per_second, the server's (the same engine-time measure, from the `specllm` stats of the
stream), and the client's (generated tokens / the stream's wall time less the server's prefill).

Then time to first token (TTFT) of a chat's second turn, three ways: the first turn cold, the
second turn right after it (the conversation extends the previous request: only its new tokens
are prefilled), and the same second turn again after an unrelated request (prefilled whole).
"""

import argparse
import json
import re
import signal
import statistics
import subprocess
import sys
import threading
import time

import openai

SPECLLM = [sys.executable, "-m", "specllm"]
PROMPT = "Write a Python function that parses an ISO 8601 date string and returns a datetime."
SYSTEM = "You are a careful senior Python engineer. Answer with code first, then one short paragraph."
CODE = """Review this function and say what it does wrong:

def load_config(path):
    data = {}
    for line in open(path):
        if line.strip() == "" or line.startswith("#"):
            continue
        key, value = line.split("=")
        data[key.strip()] = value.strip()
    if "port" in data:
        data["port"] = int(data["port"])
    if "debug" in data:
        data["debug"] = data["debug"] == "true"
    return data
"""


def model_args(args) -> list[str]:
    out = []
    for flag, value in (
        ("--pair", args.pair),
        ("--target", args.target),
        ("--draft", args.draft),
        ("--drafter", args.drafter),
        ("--gamma", args.gamma),
        ("--threads", args.threads),
        ("--ctx-size", args.ctx_size),
    ):
        if value is not None:
            out += [flag, str(value)]
    return out


class Served:
    """`specllm serve --port 0` in a subprocess; its stderr (startup and access-log lines) is kept."""

    def __init__(self, args):
        self.proc = subprocess.Popen(
            SPECLLM + ["serve", "--port", "0", *model_args(args)], stderr=subprocess.PIPE, text=True
        )
        self.lines: list[str] = []
        while not any(line.startswith("specllm serve:") for line in self.lines):
            line = self.proc.stderr.readline()
            if not line:
                sys.exit("specllm serve did not start:\n" + "".join(self.lines))
            self.lines.append(line)
        print(self.lines[-1].strip(), file=sys.stderr)
        self.url = re.search(r"http://\S+?/v1", self.lines[-1])[0]
        threading.Thread(target=self._drain, daemon=True).start()
        self.client = openai.OpenAI(base_url=self.url, api_key="-", max_retries=0, timeout=600)

    def _drain(self):
        for line in self.proc.stderr:
            self.lines.append(line)

    def chat(self, messages, max_tokens, seed) -> dict:
        """One streamed greedy chat request, timed from the client."""
        start = time.perf_counter()
        first, text, stats, usage = None, "", None, None
        chunks = self.client.chat.completions.create(
            model="specllm",
            messages=messages,
            max_tokens=max_tokens,
            temperature=0,
            seed=seed,
            stream=True,
            stream_options={"include_usage": True},
        )
        for chunk in chunks:
            for choice in chunk.choices:
                if choice.delta.content:
                    first = first or time.perf_counter()
                    text += choice.delta.content
            usage = chunk.usage or usage
            stats = chunk.to_dict().get("specllm", stats)
        wall = time.perf_counter() - start
        s = stats["stats"]
        decode_wall = wall - s["prefill_seconds"] - s["calibration_seconds"]
        return {
            "text": text,
            "ttft": first - start,
            "wall": wall,
            "tokens": usage.completion_tokens,
            "prompt_tokens": usage.prompt_tokens,
            "cached_tokens": usage.prompt_tokens_details.cached_tokens,
            "prefill_tokens": s["prefill_tokens"],
            "prefill_seconds": s["prefill_seconds"],
            "server_tok_s": s["tokens_per_second"],
            "client_tok_s": usage.completion_tokens / decode_wall,
        }

    def stop(self):
        self.proc.send_signal(signal.SIGINT)
        self.proc.wait(60)


def run_json(args, seed) -> dict:
    cmd = SPECLLM + ["run", PROMPT, "--json", "--temperature", "0", "-n", str(args.max_tokens), "--seed", str(seed)]
    proc = subprocess.run(cmd + model_args(args), capture_output=True, text=True)
    if proc.returncode:
        sys.exit(f"specllm run failed: {proc.stderr}")
    out = json.loads(proc.stdout)
    return {"text": out["text"], "tokens": len(out["tokens"]), "tok_s": out["stats"]["tokens_per_second"]}


def decode_rounds(args, served: Served) -> dict:
    rounds = []
    for r in range(args.rounds):
        seed = r
        serve_first = r % 2 == 0
        results = {}
        for which in ["serve", "run"] if serve_first else ["run", "serve"]:
            if which == "serve":
                results[which] = served.chat([{"role": "user", "content": PROMPT}], args.max_tokens, seed)
            else:
                results[which] = run_json(args, seed)
        s, run = results["serve"], results["run"]
        rounds.append({"serve": s, "run": run, "same_text": s["text"] == run["text"]})
        print(
            f"round {r + 1}: run {run['tok_s']:.2f} tok/s · serve {s['server_tok_s']:.2f} tok/s (engine), "
            f"{s['client_tok_s']:.2f} tok/s (client) · {s['tokens']} tokens · same text: {s['text'] == run['text']}"
        )
    med = lambda key, side: statistics.median(r[side][key] for r in rounds)  # noqa: E731
    summary = {
        "run_tok_s": med("tok_s", "run"),
        "serve_engine_tok_s": med("server_tok_s", "serve"),
        "serve_client_tok_s": med("client_tok_s", "serve"),
    }
    summary["serve_engine_vs_run"] = summary["serve_engine_tok_s"] / summary["run_tok_s"]
    summary["serve_client_vs_run"] = summary["serve_client_tok_s"] / summary["run_tok_s"]
    print(
        f"median: run {summary['run_tok_s']:.2f} tok/s · serve {summary['serve_engine_tok_s']:.2f} (engine, "
        f"{summary['serve_engine_vs_run']:.1%} of run) · {summary['serve_client_tok_s']:.2f} (client, "
        f"{summary['serve_client_vs_run']:.1%} of run)"
    )
    return {"rounds": rounds, "median": summary}


def ttft(args, served: Served) -> dict:
    n = args.ttft_tokens
    first = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": CODE}]
    cold_first = served.chat(first, n, 0)
    second = first + [
        {"role": "assistant", "content": cold_first["text"]},
        {"role": "user", "content": "Now rewrite it to fix those problems."},
    ]
    extended = served.chat(second, n, 0)
    served.chat([{"role": "user", "content": "Unrelated: what is a monad?"}], 4, 0)  # the KV cache moves on
    cold_second = served.chat(second, n, 0)
    out = {"first turn, cold": cold_first, "second turn, extending it": extended, "second turn, cold": cold_second}
    for name, r in out.items():
        print(
            f"{name}: TTFT {r['ttft'] * 1000:.0f} ms · prompt {r['prompt_tokens']} tokens, "
            f"{r['prefill_tokens']} prefilled in {r['prefill_seconds'] * 1000:.0f} ms, {r['cached_tokens']} from the "
            "KV cache"
        )
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--pair")
    ap.add_argument("--target")
    ap.add_argument("--draft")
    ap.add_argument("--drafter", help="default: serve's and run's default (auto)")
    ap.add_argument("--gamma", type=int)
    ap.add_argument("--threads", type=int)
    ap.add_argument("--ctx-size", type=int)
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--ttft-tokens", type=int, default=8, help="tokens per request in the TTFT part")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--json", help="write every measurement to this file")
    args = ap.parse_args()
    served = Served(args)
    try:
        served.chat([{"role": "user", "content": "Say hi."}], 8, 0)  # warm-up: calibration, page cache
        results = {"decode": decode_rounds(args, served), "ttft": ttft(args, served), "args": vars(args)}
    finally:
        served.stop()
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=2)


if __name__ == "__main__":
    main()

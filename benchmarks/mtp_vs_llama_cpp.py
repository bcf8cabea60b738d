"""specllm's MTP drafting against llama.cpp's own (llama-speculative-simple --spec-type draft-mtp)
on the same tiny qwen35 with an MTP block, greedy: the generated text, tokens drafted and accepted.

usage: python benchmarks/mtp_vs_llama_cpp.py [--bin DIR] [--tokens 64]

DIR holds llama-speculative-simple, as built by benchmarks/build_llama_cpp_tools.sh from the
sources of the installed llama-cpp-python (the default: that script's folder for this version).
The models are written by tests/tiny_models.py: "mimic" (MTP layers that often predict the target's
next token) and "random" (MTP weights that predict nothing). Both loops draft the same number of
tokens each step (llama.cpp: --spec-draft-n-max K; specllm: --drafter mtp --gamma K); llama.cpp
stops a step short of the end differently, so counts may differ by a step at the end of a text.
"""

import argparse
import re
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

import tiny_models as tm  # noqa: E402

import specllm  # noqa: E402

PROMPTS = ["Hello world", "def return self", "the value of data is", "import list"]


def llama_cpp(binary: Path, model: Path, prompt: str, k: int, n: int) -> dict:
    cmd = [str(binary), "-m", str(model), "-p", prompt, "--spec-type", "draft-mtp", "--spec-draft-n-max", str(k),
           "-n", str(n), "--temp", "0", "--top-k", "1", "-c", "1024", "-t", "2", "-ngl", "0"]  # fmt: skip
    for _ in range(3):  # llama.cpp's logger thread now and then loses its last lines at exit
        with tempfile.TemporaryFile() as err:
            run = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=err, timeout=300)
            err.seek(0)
            log = err.read().decode(errors="replace")
        if run.returncode:
            sys.exit(f"llama-speculative-simple failed:\n{log[-2000:]}")
        found = {key: re.search(rf"{key}\s*=\s*(\d+)", log) for key in ("n_drafted", "n_accept")}
        if all(found.values()):
            break
    else:
        sys.exit("llama-speculative-simple printed no n_drafted / n_accept lines")
    count = {key: int(match.group(1)) for key, match in found.items()}
    text = run.stdout.decode("utf-8", errors="replace").split(prompt, 1)[-1].strip()
    return {"drafted": count["n_drafted"], "accepted": count["n_accept"], "text": text}


def specllm_mtp(engine, prompt: str, k: int, n: int) -> dict:
    r = engine.generate(prompt, max_tokens=n, temperature=0, drafter="mtp", gamma=k)
    return {"drafted": r.stats.n_drafted, "accepted": r.stats.n_accepted, "text": r.text.strip()}


def main() -> None:
    default_bin = Path.home() / ".cache/specllm-anchor" / __import__("llama_cpp").__version__ / "bin"
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--bin", type=Path, default=default_bin)
    parser.add_argument("--tokens", type=int, default=64)
    args = parser.parse_args()
    binary = args.bin / "llama-speculative-simple"
    if not binary.exists():
        sys.exit(f"{binary} not found: build it with bash benchmarks/build_llama_cpp_tools.sh")
    folder = Path(tempfile.mkdtemp())
    models = {
        "mimic": tm.write_model(folder / "mimic.gguf", arch="qwen35", n_nextn=1, mtp_mimic=True),
        "random": tm.write_model(folder / "random.gguf", arch="qwen35", n_nextn=1),
    }
    print("| model | K | prompt | llama.cpp drafted / accepted | specllm drafted / accepted | same text |")
    print("|---|---|---|---|---|---|")
    totals = {"llama.cpp": [0, 0], "specllm": [0, 0]}
    for name, path in models.items():
        engine = specllm.load(str(path), n_ctx=1024, n_threads=2, snapshots=8)
        for k in (1, 3, 5):
            for prompt in PROMPTS:
                theirs = llama_cpp(binary, path, prompt, k, args.tokens)
                ours = specllm_mtp(engine, prompt, k, args.tokens)
                same = ours["text"] and theirs["text"].startswith(ours["text"][: len(ours["text"]) - 8])
                for who, r in (("llama.cpp", theirs), ("specllm", ours)):
                    totals[who][0] += r["drafted"]
                    totals[who][1] += r["accepted"]
                print(f"| {name} | {k} | {prompt} | {theirs['drafted']} / {theirs['accepted']} | "
                      f"{ours['drafted']} / {ours['accepted']} | {'yes' if same else 'NO'} |")  # fmt: skip
        engine.close()
    for who, (drafted, accepted) in totals.items():
        print(f"{who}: {accepted} of {drafted} drafted tokens accepted ({accepted / max(1, drafted):.1%})")


if __name__ == "__main__":
    main()

"""specllm on a hybrid target against llama.cpp's own speculative decoding (llama-speculative-simple)
on the same tiny Qwen3.5 files, greedy: MTP drafting (--spec-type draft-mtp: the generated text,
tokens drafted and accepted) and a hybrid draft model (--spec-type draft-simple: the text).

usage: python benchmarks/hybrid_vs_llama_cpp.py [--bin DIR] [--tokens 64]

DIR holds llama-speculative-simple, as built by benchmarks/build_llama_cpp_tools.sh from the
sources of the installed llama-cpp-python (the default: that script's folder for this version).
The models are written by tests/tiny_models.py: "mimic" (MTP layers that often predict the target's
next token) and "random" (MTP weights that predict nothing). Both loops draft the same number of
tokens each step (llama.cpp: --spec-draft-n-max K; specllm: --drafter mtp --gamma K); llama.cpp
stops a step short of the end differently, so counts may differ by a step at the end of a text.
With a draft model, llama.cpp takes a hybrid target's rejections back from a checkpoint and counts
the kept tokens again as a draft, so only the texts compare (each must be the target's own).
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


def llama_cpp(binary: Path, model: Path, prompt: str, k: int, n: int, draft: Path | None = None) -> dict:
    spec = ["-md", str(draft), "--spec-type", "draft-simple"] if draft else ["--spec-type", "draft-mtp"]
    cmd = [
        str(binary),
        "-m",
        str(model),
        "-p",
        prompt,
        *spec,
        "--spec-draft-n-max",
        str(k),
        "-n",
        str(n),
        "--temp",
        "0",
        "--top-k",
        "1",
        "-c",
        "1024",
        "-t",
        "2",
        "-ngl",
        "0",
    ]
    for _ in range(3):  # llama.cpp's logger thread now and then loses its last lines at exit
        with tempfile.TemporaryFile() as err:
            run = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=err, timeout=300)
            err.seek(0)
            log = err.read().decode(errors="replace")
        if run.returncode:
            sys.exit(f"llama-speculative-simple failed:\n{log[-2000:]}")
        found = {key: re.search(rf"{key}\s*=\s*(\d+)", log) for key in ("n_drafted", "n_accept")}
        if all(found.values()) or draft:
            break
    else:
        sys.exit("llama-speculative-simple printed no n_drafted / n_accept lines")
    count = {key: int(match.group(1)) if match else None for key, match in found.items()}
    text = run.stdout.decode("utf-8", errors="replace").split(prompt, 1)[-1].strip()
    return {"drafted": count["n_drafted"], "accepted": count["n_accept"], "text": text}


def specllm_run(engine, prompt: str, k: int, n: int, drafter: str = "mtp") -> dict:
    r = engine.generate(prompt, max_tokens=n, temperature=0, drafter=drafter, gamma=k)
    return {"drafted": r.stats.n_drafted, "accepted": r.stats.n_accepted, "text": r.text.strip()}


def same_text(ours: str, theirs: str) -> bool:
    """specllm's text is a prefix of llama.cpp's (which runs a step further), but for the last
    few characters: the last token may be cut where llama.cpp's output is not."""
    return bool(ours) and theirs.startswith(ours[: len(ours) - 8])


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
                ours = specllm_run(engine, prompt, k, args.tokens)
                same = same_text(ours["text"], theirs["text"])
                for who, r in (("llama.cpp", theirs), ("specllm", ours)):
                    totals[who][0] += r["drafted"]
                    totals[who][1] += r["accepted"]
                print(
                    f"| {name} | {k} | {prompt} | {theirs['drafted']} / {theirs['accepted']} | "
                    f"{ours['drafted']} / {ours['accepted']} | {'yes' if same else 'NO'} |"
                )
        engine.close()
    for who, (drafted, accepted) in totals.items():
        print(f"{who}: {accepted} of {drafted} drafted tokens accepted ({accepted / max(1, drafted):.1%})")
    draft_model_texts(binary, folder, args.tokens)


def draft_model_texts(binary: Path, folder: Path, n: int) -> None:
    """A hybrid target drafted by a hybrid draft model (a noisy copy): the same text as llama.cpp."""
    target = tm.write_model(folder / "target.gguf", arch="qwen35")
    draft = tm.write_model(folder / "draft.gguf", arch="qwen35", noise=tm.DRAFT_NOISE, noise_seed=1)
    engine = specllm.load(str(target), str(draft), n_ctx=1024, n_threads=2, snapshots=8)
    same = 0
    runs = [(k, prompt) for k in (2, 4, 8) for prompt in PROMPTS]
    for k, prompt in runs:
        ours = specllm_run(engine, prompt, k, n, drafter="model")
        same += same_text(ours["text"], llama_cpp(binary, target, prompt, k, n, draft)["text"])
    engine.close()
    print(f"draft model on a hybrid target (draft-simple), K = 2, 4, 8: the same text in {same} of {len(runs)} runs")


if __name__ == "__main__":
    main()

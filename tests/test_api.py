"""The Python API as a user's script meets it: its names, their types for a type checker, help()."""

import os
import pydoc
import subprocess
import sys
import textwrap
from pathlib import Path

import specllm

ROOT = Path(__file__).resolve().parent.parent

# docs/python-api.md's calls, typed as a user would type them: all of them must check.
USER_SCRIPT = """
    import json
    from pathlib import Path

    import specllm
    from specllm import Engine, Finished, GenerationConfig, Result, SamplerSettings, SpecllmError, Stats, Step
    from specllm.engine.reasoning import closing_marker, split_reasoning


    def main() -> None:
        engine: Engine = specllm.load(target="t.gguf", draft=Path("d.gguf"), n_ctx=512)
        result: Result = engine.generate("raw prompt text", max_tokens=64, temperature=0.0, seed=0, stop=["\\n"])
        stats: Stats = result.stats
        print(json.dumps(stats.to_dict()), result.tokens, result.text, stats.acceptance_rate)
        ids: list[int] = engine.prompt_tokens("Explain KV caches", chat=True)
        for event in engine.stream(ids, max_tokens=64, drafter="ngram", gamma=None):
            if isinstance(event, Step):
                print(event.source, event.token_text)
            elif isinstance(event, Finished):
                print(event.result.stop_reason)
        config = GenerationConfig(max_tokens=64, sampler=SamplerSettings(temperature=0), drafter="ngram", stop="\\n")
        prompt: str = engine.chat_prompt("hi", None, variables={"enable_thinking": False})
        split = split_reasoning(engine.generate(prompt, config).text, closing_marker(prompt) or False)
        with engine.start(ids, max_tokens=8) as generation:
            for step in generation:
                print(step.accepted_text)
        print(split.reasoning, split.answer, generation.result.text, specllm.ModelOptions().n_ctx)
        try:
            engine.close()
        except SpecllmError as e:
            print(e)
"""

# Mistakes a type checker should name, one a line, and what it says of each.
MISTAKES = {
    'specllm.lod("t.gguf")': 'Module has no attribute "lod"',
    'specllm.load("t.gguf").generate("x", max_token=3)': 'Unexpected keyword argument "max_token"',
    'specllm.load("t.gguf").generate("x", max_tokens="3")': 'Argument "max_tokens" to "generate"',
    'specllm.GenerationConfig(gamma="4")': 'Argument "gamma" to "GenerationConfig"',
}


def _mypy(folder: Path, source: str) -> subprocess.CompletedProcess:
    """mypy --strict on a user's script, with specllm as an installed package is seen (its own
    code not checked): the names, signatures and types it exports."""
    (folder / "script.py").write_text(textwrap.dedent(source), encoding="utf-8")
    command = [sys.executable, "-m", "mypy", "--strict", "--follow-imports=silent", "--no-incremental", "script.py"]
    environment = dict(os.environ, MYPYPATH=str(ROOT))
    return subprocess.run(command, cwd=folder, env=environment, capture_output=True, text=True, timeout=300)


def test_a_users_type_checker_sees_the_documented_api_and_names_its_mistakes(tmp_path):
    """specllm.GenerationConfig, Result, ... were Any to a type checker (the package's lazy
    __getattr__), so any name and any argument passed; a Path for load() and a list of stop
    strings were false errors."""
    checked = _mypy(tmp_path, USER_SCRIPT)
    assert checked.returncode == 0, checked.stdout
    source = "import specllm\n" + "".join(f"{line}\n" for line in MISTAKES)
    errors = [line for line in _mypy(tmp_path, source).stdout.splitlines() if ": error: " in line]
    said = {int(line.split(":")[1]) - 2: line for line in errors}  # by mistake, as MISTAKES lists them
    assert len(errors) == len(MISTAKES), errors
    for i, expected in enumerate(MISTAKES.values()):
        assert expected in said[i], errors


def test_help_lists_the_public_names():
    """help(specllm) listed SpecllmError and load alone: the rest is imported when first used."""
    page = pydoc.render_doc(specllm, renderer=pydoc.plaintext)
    classes = set(specllm.__all__) - {"load", "__version__"}
    assert [name for name in sorted(classes) if f"\n    class {name}(" not in page] == []
    assert "\n    load(target: str | os.PathLike[str]" in page

"""Shared fixtures: tiny real GGUF models, written once per test session.

`tiny_models` writes a handful of llama-architecture GGUF files (random F32 weights, ~0.6 MB each,
see tests/tiny_models.py) into a session temporary directory, so every test runs real llama.cpp
without downloading anything. Its attributes are paths:

    target        seed 0, standard vocab, ChatML template
    draft         target's weights plus noise (DRAFT_NOISE): agrees with target's greedy choice ~80%
    incompatible  same vocab size, different token texts from id 261 on (vocab check must fail)
    extended      standard vocab plus N_EXTRA_TOKENS appended pieces (compatible: size diff <= 128)
    extra_heavy   extended, whose output layer favours the appended ids (it produces them often)
    no_template   target, without tokenizer.chat_template
    bytes         target whose output layer favours byte tokens (partial / invalid UTF-8 output)
    not_gguf      a small text file
    truncated     the target file cut to half its length

`tiny_recurrent_models` (written only when a test asks for it) holds the other architectures:

    qwen35        Qwen3.5 hybrid (gated delta net + full attention), seed 0, standard vocab
    qwen35_draft  qwen35 plus noise (DRAFT_NOISES["qwen35"]): agrees with it ~80%
    qwen35_mtp    qwen35 with one MTP ("nextn") block; its trunk is qwen35's, weight for weight
    mamba         Mamba 1 (fully recurrent), seed 0, standard vocab
    mamba_draft   mamba plus noise (DRAFT_NOISES["mamba"]): agrees with it ~80%

`tiny_code_models` holds a target and draft of the "code" vocabulary, which has Qwen2.5-Coder's
fill-in-the-middle tokens.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))

import tiny_models as tm  # noqa: E402

pytest_plugins = ["fakehub"]  # the fake Hub and package index fixtures, for every test

EXTRA_SCALE = 1.3  # extra_heavy: the appended ids get ~14% of the mass at temperature 1, and ~16% of greedy picks


@dataclass(frozen=True)
class TinyModels:
    target: Path
    draft: Path
    incompatible: Path
    extended: Path
    extra_heavy: Path
    no_template: Path
    bytes: Path
    not_gguf: Path
    truncated: Path


@pytest.fixture(autouse=True)
def _own_specllm_cache(request, tmp_path_factory, monkeypatch):
    """No test reads or writes the user's specllm cache (the auto policy's calibration lives
    there): every test gets an empty one of its own unless it sets SPECLLM_CACHE itself. The slow
    tests use the real one, where the real model pair is cached."""
    if request.node.get_closest_marker("slow") is None:
        monkeypatch.setenv("SPECLLM_CACHE", str(tmp_path_factory.mktemp("specllm-cache")))


@pytest.fixture(autouse=True)
def _own_state_dir(tmp_path_factory, monkeypatch):
    """No test reads or writes the user's chat history: every test gets a state folder of its own
    (XDG_STATE_HOME) unless it sets one itself."""
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path_factory.mktemp("state")))


@pytest.fixture(autouse=True)
def _no_stores_of_the_user(tmp_path_factory, monkeypatch):
    """No test lists or loads the models of the user's Ollama, LM Studio or llama.cpp cache:
    every test gets empty ones (folders that do not exist yet) unless it sets its own."""
    stores = tmp_path_factory.mktemp("stores")
    monkeypatch.setenv("OLLAMA_MODELS", str(stores / "ollama"))
    monkeypatch.setenv("SPECLLM_LMSTUDIO_HOME", str(stores / "lmstudio"))
    monkeypatch.setenv("LLAMA_CACHE", str(stores / "llama.cpp"))


@pytest.fixture(scope="session")
def tiny_models(tmp_path_factory: pytest.TempPathFactory) -> TinyModels:
    d = tmp_path_factory.mktemp("tiny_models")
    write = tm.write_model
    target = write(d / "target.gguf", seed=0)
    models = TinyModels(
        target=target,
        draft=write(d / "draft.gguf", seed=0, noise=tm.DRAFT_NOISE, noise_seed=1),
        incompatible=write(d / "incompatible.gguf", seed=0, vocab="incompatible"),
        extended=write(d / "extended.gguf", seed=0, vocab="extended"),
        extra_heavy=write(d / "extra_heavy.gguf", seed=0, vocab="extended", extra_scale=EXTRA_SCALE),
        no_template=write(d / "no_template.gguf", seed=0, chat_template=None),
        bytes=write(d / "bytes.gguf", seed=0, byte_bias=True),
        not_gguf=d / "not_gguf.gguf",
        truncated=d / "truncated.gguf",
    )
    models.not_gguf.write_text("this is not a GGUF model file\n")
    data = target.read_bytes()
    models.truncated.write_bytes(data[: len(data) // 2])
    return models


@dataclass(frozen=True)
class TinyRecurrentModels:
    qwen35: Path
    qwen35_draft: Path
    qwen35_mtp: Path
    mamba: Path
    mamba_draft: Path


@pytest.fixture(scope="session")
def tiny_recurrent_models(tmp_path_factory: pytest.TempPathFactory) -> TinyRecurrentModels:
    d = tmp_path_factory.mktemp("tiny_recurrent_models")
    write = tm.write_model
    return TinyRecurrentModels(
        qwen35=write(d / "qwen35.gguf", arch="qwen35", seed=0),
        qwen35_draft=write(
            d / "qwen35_draft.gguf", arch="qwen35", seed=0, noise=tm.DRAFT_NOISES["qwen35"], noise_seed=1
        ),
        qwen35_mtp=write(d / "qwen35_mtp.gguf", arch="qwen35", seed=0, n_nextn=1),
        mamba=write(d / "mamba.gguf", arch="mamba", seed=0),
        mamba_draft=write(d / "mamba_draft.gguf", arch="mamba", seed=0, noise=tm.DRAFT_NOISES["mamba"], noise_seed=1),
    )


@dataclass(frozen=True)
class TinyCodeModels:
    target: Path
    draft: Path


@pytest.fixture(scope="session")
def tiny_code_models(tmp_path_factory: pytest.TempPathFactory) -> TinyCodeModels:
    """A target and draft with the "code" vocabulary: Qwen2.5-Coder's fill-in-the-middle tokens."""
    d = tmp_path_factory.mktemp("tiny_code_models")
    return TinyCodeModels(
        target=tm.write_model(d / "code.gguf", seed=0, vocab="code"),
        draft=tm.write_model(d / "code_draft.gguf", seed=0, vocab="code", noise=tm.DRAFT_NOISE, noise_seed=1),
    )


@pytest.fixture
def ling3_turn_end(monkeypatch):
    """A function that takes Ling 3.0's end of a turn to be spelled `text` in the stop strings
    of its replies (templates.TURN_ENDS_SPELLED): a tiny model writes no "<|role_end|>", but it
    writes its own text, and a reply that spells the turn's end stops there."""
    import specllm.llama.templates as templates

    def spelled(text: str) -> None:
        (marks, _), *others = templates.TURN_ENDS_SPELLED
        monkeypatch.setattr(templates, "TURN_ENDS_SPELLED", ((marks, text), *others))

    return spelled

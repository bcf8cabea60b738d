"""Hybrid (Qwen3.5: gated delta net + attention) and recurrent (Mamba) models, as target and
draft, on tiny generated models: rollback, speculative output, the limits on drafts."""

import numpy as np
import pytest
import tiny_models as tm
from stats import first_three_tokens_pvalue

import specllm
from specllm.engine.loop import Engine
from specllm.errors import SpecllmError
from specllm.llama.model import Model
from specllm.llama.options import ModelOptions

PROMPTS = ["Hello world", "def f(x): return", "the cat is in the house and the cat is in the", "import os"]
ARCHS = ("qwen35", "mamba")


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    d = tmp_path_factory.mktemp("recurrent")
    out = {}
    for arch in ARCHS:
        noise = tm.DRAFT_NOISES[arch]
        out[arch] = (
            tm.write_model(d / f"{arch}.gguf", arch=arch, seed=0),
            tm.write_model(d / f"{arch}-draft.gguf", arch=arch, seed=0, noise=noise, noise_seed=1),
        )
    return out


def fresh_logits(path, tokens):
    """The logits after `tokens`, from a model that has seen nothing else."""
    m = Model(path, ModelOptions(n_ctx=256, n_threads=1))
    try:
        return np.array(m.sync(tokens, n_logits=1)[0])
    finally:
        m.close()


@pytest.mark.parametrize("arch", ARCHS)
def test_cutting_back_gives_the_logits_of_a_fresh_decode(models, arch):
    """Calls of random widths, each cut back by a random depth (past the snapshots, past what
    the last call could take back, one-token calls then a deeper cut: llama.cpp's trap), then
    the next token's logits against a fresh model's."""
    path = models[arch][0]
    m = Model(path, ModelOptions(n_ctx=256, n_threads=1, snapshots=4))
    rng = np.random.default_rng(0)
    tokens = m.tokenize("the cat is in the house", add_special=True) + [int(t) for t in rng.integers(261, 500, 60)]
    m.sync(tokens[:8])
    worst, depths = 0.0, set()
    for _ in range(24):
        width = int(rng.integers(1, 7))
        for _ in range(int(rng.integers(1, 3))):  # one call or two in a row
            m.eval(tokens[len(m.tokens) : len(m.tokens) + width], 0)
        back = int(rng.integers(0, 2 * width + 2))
        n = max(1, len(m.tokens) - back)
        depths.add(len(m.tokens) - n)
        m.truncate(n)
        got = np.array(m.eval([tokens[n]], 1)[0])
        worst = max(worst, float(np.abs(got - fresh_logits(path, tokens[: n + 1])).max()))
        m.truncate(n)
        if len(m.tokens) > 40:
            m.truncate(8)
    m.close()
    assert len(depths) >= 8  # cuts of many depths were taken
    assert worst < 1e-2  # batch shapes move llama.cpp's logits by ~1e-4; a wrong state by ~10


def test_the_snapshots_take_back_only_what_the_last_call_wrote(models):
    """One-token calls write no snapshot: taking back two tokens after them must not use them."""
    path = models["qwen35"][0]
    m = Model(path, ModelOptions(n_ctx=256, n_threads=1, snapshots=4))
    assert m.recurrent and m.max_draft == 4
    tokens = m.tokenize("the cat is in the house and the", add_special=True)
    m.sync(tokens[:5])
    for t in tokens[5:9]:
        m.eval([t], 1)
    m.truncate(7)
    got = np.array(m.eval([tokens[7]], 1)[0])
    assert np.abs(got - fresh_logits(path, tokens[:8])).max() < 1e-2
    m.close()


def test_llama_cpp_keeps_no_snapshots_for_mamba(models):
    m = Model(models["mamba"][0], ModelOptions(n_ctx=256, n_threads=1, snapshots=8))
    assert m.recurrent and m.snapshots == 0 and m.max_draft == 0
    assert m.state_bytes > 0
    m.close()


def greedy(engine, prompt, drafter, gamma, max_tokens=40):
    return engine.generate(prompt, max_tokens=max_tokens, temperature=0, drafter=drafter, gamma=gamma)


@pytest.mark.parametrize("arch", ARCHS)
def test_greedy_speculative_equals_target_only(models, arch):
    """Every drafter, drafts of 1 to 16 tokens, on a hybrid or recurrent target with a draft of
    its kind: rejections at every depth, the same tokens as the target alone."""
    target, draft = models[arch]
    engine = specllm.load(str(target), str(draft), n_ctx=512, n_threads=1, snapshots=16)
    drafted = rejected = 0
    for prompt in PROMPTS:
        expected = greedy(engine, prompt, "none", None).tokens
        for drafter in ("model", "ngram", "auto"):
            for gamma in (1, 2, 3, 5, 8, 16):
                stats = greedy(engine, prompt, drafter, gamma).stats
                assert greedy(engine, prompt, drafter, gamma).tokens == expected, (prompt, drafter, gamma)
                drafted += stats.n_drafted
                rejected += stats.n_drafted - stats.n_accepted
    engine.close()
    assert drafted > 500 and rejected > 100  # really speculated, and often wrong


@pytest.mark.parametrize("arch", ARCHS)
def test_sampled_tokens_follow_the_target_distribution(models, arch):
    """The joint distribution of the first three tokens with three-token model drafts."""
    target, draft = models[arch]
    engine = specllm.load(str(target), str(draft), n_ctx=256, n_threads=1, snapshots=4)
    pvalue, stats = first_three_tokens_pvalue(engine, target, engine.prompt_tokens("the cat"), "model")
    engine.close()
    assert sum(s.n_accepted < s.n_drafted for s in stats) > len(stats) / 10
    assert pvalue > 0.01


def test_a_fixed_draft_longer_than_the_snapshots_is_one_clear_error(models):
    engine = specllm.load(str(models["qwen35"][0]), n_ctx=256, n_threads=1, snapshots=4)
    with pytest.raises(SpecllmError, match=r"gamma \(draft length\) 5 is longer than the 4 recurrent-state snapshots"):
        engine.generate("Hello", max_tokens=4, drafter="ngram", gamma=5)
    engine.generate("Hello", max_tokens=4, drafter="auto", gamma=5)  # auto's gamma is a cap: kept within
    engine.close()


def test_the_cli_says_which_flags_fit_a_fixed_draft_in_the_snapshots(models):
    """The engine's DraftTooLong names no flag; the CLI's one line adds --gamma and --snapshots."""
    import subprocess
    import sys

    args = [
        "run",
        "Hello",
        "--target",
        str(models["qwen35"][0]),
        "--snapshots",
        4,
        "--gamma",
        5,
        "--drafter",
        "ngram",
        "--threads",
        1,
        "--ctx-size",
        256,
        "-n",
        4,
    ]
    proc = subprocess.run([sys.executable, "-m", "specllm", *map(str, args)], capture_output=True, text=True)
    assert proc.returncode == 1
    line = proc.stderr.strip()
    assert line.startswith("error: gamma (draft length) 5 is longer than the 4 recurrent-state snapshots qwen35.gguf")
    assert ": use --gamma 4 or less, or --snapshots 5 (each snapshot costs " in line and "\n" not in line


def test_auto_on_a_hybrid_drafts_within_the_snapshots_and_says_so(models):
    target, draft = models["qwen35"]
    engine = Engine(
        Model(target, ModelOptions(n_ctx=512, n_threads=1, snapshots=3)),
        Model(draft, ModelOptions(n_ctx=512, n_threads=1, snapshots=0)),
    )
    r = engine.generate("the cat is in the house and the cat is in the house and the cat", max_tokens=40, temperature=0)
    assert len(r.stats.drafted_per_position) <= 3
    assert "at most 3 tokens" in r.stats.policy["draft_limit"]
    engine.close()


def test_auto_on_mamba_counts_the_second_call_a_rejection_costs(models):
    """No snapshots: auto drafts where a copy pays even with the kept tokens evaluated again."""
    from costs import gpu_like_policy

    target, draft = models["mamba"]
    engine = specllm.load(str(target), str(draft), n_ctx=512, n_threads=1)
    engine.policy = gpu_like_policy()
    engine.policy.replays = True
    for prompt in PROMPTS:
        expected = greedy(engine, prompt, "none", None).tokens
        r = greedy(engine, prompt, "auto", None)
        assert r.tokens == expected
    assert r.stats.n_drafted > 0 and r.stats.n_accepted < r.stats.n_drafted
    assert "evaluated again" in r.stats.policy["draft_limit"]
    engine.close()


def test_a_build_that_cannot_take_rejections_back_is_one_clear_error(models, monkeypatch):
    """An older llama-cpp-python keeps no snapshots and cannot copy a recurrent state: a fixed
    drafter is refused in one line, auto drafts nothing, target-only works."""
    from specllm.llama import model as llama_model

    monkeypatch.setattr(llama_model, "SNAPSHOT_API", False)
    monkeypatch.setattr(llama_model, "STATE_API", False)
    engine = specllm.load(str(models["qwen35"][0]), n_ctx=256, n_threads=1)
    assert engine.target.snapshots == 0 and not engine.target.can_take_back
    with pytest.raises(
        SpecllmError, match=r"cannot take rejected draft tokens back out of the recurrent state of qwen35.gguf"
    ):
        engine.generate("Hello", max_tokens=4, drafter="ngram")
    expected = engine.generate(PROMPTS[2], max_tokens=24, temperature=0, drafter="none").tokens
    r = engine.generate(PROMPTS[2], max_tokens=24, temperature=0)
    assert r.tokens == expected and r.stats.n_drafted == 0 and "no drafts" in r.stats.policy["draft_limit"]
    engine.close()

"""Drafting with the target's own MTP ("nextn") layers, on a tiny qwen35 with an MTP block whose
predictions often hold (tiny_models: mtp_mimic) and one with random MTP weights."""

import numpy as np
import pytest
import tiny_models as tm
from costs import FixedCosts
from slowed import SLOW_CALL, slowed
from stats import first_three_tokens_pvalue

import specllm
from specllm.engine.policy import AutoPolicy
from specllm.errors import SpecllmError
from specllm.llama.model import Model
from specllm.llama.options import ModelOptions

PROMPTS = ["Hello world", "def f(x): return", "the cat is in the house and the cat is in the", "import os"]


@pytest.fixture(scope="module")
def mtp_model(tmp_path_factory):
    return tm.write_model(tmp_path_factory.mktemp("mtp") / "q35-mtp.gguf", arch="qwen35", n_nextn=1, mtp_mimic=True)


@pytest.fixture(scope="module")
def engine(mtp_model):
    e = specllm.load(str(mtp_model), n_ctx=512, n_threads=1, snapshots=16)
    yield e
    e.close()


def greedy(engine, prompt, drafter, gamma, max_tokens=40):
    return engine.generate(prompt, max_tokens=max_tokens, temperature=0, drafter=drafter, gamma=gamma)


def test_greedy_mtp_drafting_equals_target_only(engine):
    drafted = accepted = 0
    depths = set()
    for prompt in PROMPTS:
        expected = greedy(engine, prompt, "none", None).tokens
        for gamma in (1, 2, 3, 5, 8, 16):
            stats = greedy(engine, prompt, "mtp", gamma).stats
            assert greedy(engine, prompt, "mtp", gamma).tokens == expected, (prompt, gamma)
            assert set(stats.sources) <= {"mtp", "none"}
            drafted, accepted = drafted + stats.n_drafted, accepted + stats.n_accepted
            depths.update(i for i, n in enumerate(stats.accepted_per_position) if n)
    assert 0.1 < accepted / drafted < 0.9  # accepted often, rejected often
    assert len(depths) >= 3  # whole drafts of several tokens were accepted, others cut short


def test_the_loops_own_time_leaves_out_the_mtp_layers_calls(engine, monkeypatch):
    """The MTP layers' calls (llama_process, and the wait for their hidden state) count as
    llama.cpp's time, as the target's do."""
    slowed(monkeypatch, "llama_process")
    s = greedy(engine, PROMPTS[2], "mtp", 3, max_tokens=12).stats
    assert s.draft_calls > 0
    assert SLOW_CALL * s.draft_calls <= s.llama_seconds < s.decode_seconds
    assert 0 < s.loop_seconds_per_step < SLOW_CALL


def test_auto_drafts_with_mtp_where_it_pays(engine):
    """With GPU-like costs, where an MTP step costs a twentieth of a target step, auto chooses the
    MTP layers, and its output is the target's."""
    target = FixedCosts(0.020, {n: 1.0 + 0.01 * n for n in (2, 3, 4, 5, 8, 9, 12, 16, 17)})
    engine.policy = AutoPolicy(target, None, FixedCosts(0.001, {n: 1.0 + 0.05 * n for n in (2, 3, 5, 9)}))
    try:
        for prompt in PROMPTS:
            expected = greedy(engine, prompt, "none", None).tokens
            result = greedy(engine, prompt, "auto", None)
            assert result.tokens == expected
        assert result.stats.sources["mtp"]["drafted"] > 0
        assert result.stats.policy["mtp"] is not None and result.stats.policy["mtp_could_pay"]
    finally:
        engine.policy = None


def test_sampled_mtp_drafts_keep_the_target_distribution(engine, mtp_model):
    """Three-token MTP drafts, sampled from the MTP layers' processed distribution (q) and
    accepted with min(1, p/q): the first three tokens are distributed as the target's."""
    pvalue, stats = first_three_tokens_pvalue(engine, mtp_model, engine.prompt_tokens("the cat"), "mtp")
    assert sum(s.n_accepted for s in stats) > len(stats) / 5
    assert pvalue > 0.01


def test_mtp_on_a_model_without_mtp_layers_is_one_clear_error(tiny_models):
    engine = specllm.load(str(tiny_models.target), n_ctx=256, n_threads=1)
    assert engine.mtp is None
    with pytest.raises(
        SpecllmError, match=r"drafter 'mtp' needs a target with MTP layers \(nextn\), and target.gguf has none"
    ):
        engine.generate("Hello", max_tokens=4, drafter="mtp")
    engine.close()


def test_a_binding_that_cannot_feed_mtp_layers_runs_their_model_without_them(mtp_model, monkeypatch):
    # llama-cpp-python 0.3.35 counts a model's MTP layers but has no batch API to feed them
    from specllm.llama import model as llama_model

    monkeypatch.delattr(llama_model.L, "llama_batch_ext_init")
    engine = specllm.load(str(mtp_model), n_ctx=256, n_threads=1)
    assert engine.mtp is None and engine.target.n_nextn == 0
    expected = greedy(engine, PROMPTS[2], "none", None, max_tokens=12).tokens
    assert greedy(engine, PROMPTS[2], "auto", None, max_tokens=12).tokens == expected
    with pytest.raises(SpecllmError, match=r"drafter 'mtp' needs a target with MTP layers"):
        engine.generate("Hello", max_tokens=4, drafter="mtp")
    engine.close()


def test_random_mtp_weights_are_exact_too(tmp_path):
    """MTP layers that predict nothing useful: every draft is rejected, the output is the target's."""
    path = tm.write_model(tmp_path / "q35-mtp-random.gguf", arch="qwen35", n_nextn=1)
    engine = specllm.load(str(path), n_ctx=512, n_threads=1)
    expected = greedy(engine, PROMPTS[0], "none", None).tokens
    result = greedy(engine, PROMPTS[0], "mtp", 4)
    assert result.tokens == expected and result.stats.n_drafted > 50
    engine.close()


def test_the_mtp_layers_kept_in_step_predict_what_fresh_ones_do(tmp_path):
    """The MTP context is kept in step incrementally (entries made with the target's hidden states
    kept, drafted ones entered again with the target's, rejections cut back). After every step,
    its prediction for the next token must be what a fresh target and MTP context predict from the
    same tokens."""
    from specllm.engine.loop import Finished
    from specllm.llama.model import MtpHead

    path = tm.write_model(tmp_path / "q35-mtp.gguf", arch="qwen35", n_nextn=1, mtp_mimic=True)
    engine = specllm.load(str(path), n_ctx=512, n_threads=1)
    context = engine.prompt_tokens("the cat is in the house")
    worst, accepted = 0.0, 0
    for event in engine.stream(context, max_tokens=32, temperature=0, drafter="mtp", gamma=3):
        if isinstance(event, Finished) or event.token < 0:
            continue
        context = context + event.drafted[: event.accepted] + [event.token]
        accepted += event.accepted
        kept = np.array(engine.mtp.sync(context, 1)[0])  # what the next proposal starts from
        target = Model(path, ModelOptions(n_ctx=512, n_threads=1))
        head = MtpHead(target)
        target.sync(context[:-1])
        worst = max(worst, float(np.abs(kept - head.sync(context, 1)[0]).max()))
        head.close()
        target.close()
    engine.close()
    assert accepted >= 5  # drafted tokens were kept, so their entries had to be made again
    assert worst < 1e-3  # measured 3e-6 (batch shapes); an entry with the wrong hidden state: 3e-2


def test_bench_compares_mtp_drafting_by_default_on_a_model_with_mtp_layers(mtp_model, tmp_path, monkeypatch, capsys):
    import json
    import sys

    from specllm.cli import main as cli

    prompts = tmp_path / "p.jsonl"
    prompts.write_text('{"prompt": "the cat is in the house and", "category": "chat"}\n')
    out = tmp_path / "out.json"
    argv = [
        "specllm",
        "bench",
        "--target",
        str(mtp_model),
        "--prompts",
        str(prompts),
        "--gamma",
        "2",
        "--max-tokens",
        "16",
        "--threads",
        "1",
        "--ctx-size",
        "512",
        "--json",
        str(out),
    ]
    monkeypatch.setattr(sys, "argv", argv)
    cli.main()
    data = json.loads(out.read_text())
    assert data["settings"]["configurations"] == ["auto", "mtp g=2", "ngram g=2"]
    mtp = next(r for r in data["results"] if r["configuration"] == "mtp g=2")
    assert mtp["overall"]["stats"]["sources"]["mtp"]["drafted"] > 0
    assert "Fidelity: all" in capsys.readouterr().out


def test_a_prompt_longer_than_a_batch_is_fed_to_the_mtp_layers_in_batches(mtp_model):
    engine = specllm.load(str(mtp_model), n_ctx=1024, n_threads=1)
    assert engine.target.n_batch == 512
    prompt = engine.prompt_tokens(" ".join(["the cat is in the house"] * 70))
    assert len(prompt) > 600
    expected = engine.generate(prompt, max_tokens=16, temperature=0, drafter="none").tokens
    result = engine.generate(prompt, max_tokens=16, temperature=0, drafter="mtp", gamma=3)
    assert result.tokens == expected and result.stats.n_drafted > 0
    assert engine.mtp.tokens[: len(prompt)] == prompt
    engine.close()

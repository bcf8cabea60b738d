"""The auto drafting policy's decisions, on synthetic cost tables (pure: no model, no clock)."""

import numpy as np
import pytest

from specllm.engine.policy import (
    CLEARLY_BELOW,
    GUARD_FIRST_GAP,
    GUARD_WINDOW,
    MARGIN,
    MATCH_EDGES,
    TEXT_SHIFT_MAX,
    Acceptance,
    AutoPolicy,
    CostTable,
    Guard,
    NgramScorer,
    best_length,
    bucket,
    expected_tokens,
)

# The table measured on this project's 2-core CPU: Qwen2.5-Coder 1.5B target, 0.5B draft.
CPU_TARGET = CostTable(0.0395, {2: 1.63, 3: 1.99, 5: 3.23, 8: 5.84, 12: 7.41, 17: 8.54, 24: 10.3, 33: 12.9})
CPU_DRAFT = CostTable(0.0209, {2: 1.92, 3: 2.20, 5: 3.35, 8: 4.09})
# A GPU-like table: a verify call on n tokens costs about one call (V ~ 1), the draft c = 0.1.
GPU_TARGET = CostTable(0.020, {n: 1.0 + 0.01 * n for n in (2, 3, 4, 5, 8, 12, 16, 17, 33, 65)})
GPU_DRAFT = CostTable(0.002, {n: 1.0 + 0.05 * n for n in (2, 3, 5, 9)})
# Nothing pays: a call on n tokens costs n calls, and the draft costs as much as the target.
FLAT_TARGET = CostTable(0.030, {n: float(n) for n in (2, 3, 4, 5, 8, 12, 16, 17, 33, 65)})
FLAT_DRAFT = CostTable(0.030, {n: float(n) for n in (2, 3, 5, 9)})


def copies_well(policy: AutoPolicy, repeat: int, observations: int = 200, rate: float = 0.97) -> None:
    """Teach the policy that n-gram copies after a repeat this long are accepted at `rate`."""
    b = bucket(repeat, MATCH_EDGES)
    accepted = int(rate * observations)
    for j in range(1, 65):
        for i in range(observations):
            policy.ngram.record(b, j, i < accepted)


def record_run(acceptance: Acceptance, context_bucket: int, judged: int, accepted: int) -> None:
    """One draft's outcome: positions 1..judged were judged and the first `accepted` of them accepted."""
    for j in range(1, judged + 1):
        acceptance.record(context_bucket, j, j <= accepted)


def test_gpu_like_costs_choose_the_draft_model():
    policy = AutoPolicy(GPU_TARGET, GPU_DRAFT)
    assert policy.model_could_pay()
    plan = policy.choose(ngram_match=0, ngram_available=0, model_ready=True, cap=64)
    assert plan.source == "model" and plan.k >= 2
    assert plan.rate > plan.baseline * (1 + MARGIN)


def test_this_cpus_costs_never_choose_the_draft_model():
    policy = AutoPolicy(CPU_TARGET, CPU_DRAFT)
    assert not policy.model_could_pay()
    assert policy.choose(0, 0, model_ready=True, cap=64).source == "none"


def test_a_draft_model_choose_would_never_pick_is_not_worth_a_call():
    """Costs where the draft model pays at 90% acceptance but not at the 70% that choose expects of
    it before it has drafted: "could it pay" said yes, so every generation loaded and prefilled the
    draft, and choose never drafted with it. The two now ask the same question."""
    target = CostTable(0.030, {2: 2.0, 3: 2.14, 4: 1.84, 5: 2.94, 8: 4.5, 12: 6.0, 16: 7.5, 17: 8.0})
    policy = AutoPolicy(target, CostTable(0.0066, {2: 1.9, 3: 2.2, 5: 3.3, 9: 5.0}))
    assert policy.choose(0, 0, model_ready=True, cap=64).source == "none"
    assert not policy.model_could_pay()
    for _ in range(40):  # it drafted, and its drafts were accepted 90% of the time: now it pays
        record_run(policy.learned["model_marginal"], 0, 16, 16)
        record_run(policy.learned["model_marginal"], 0, 2, 1)
    policy.start_generation()
    assert policy.model_could_pay() and policy.choose(0, 0, model_ready=True, cap=64).source == "model"


def test_this_cpus_costs_copy_long_reliable_repeats_with_ngram():
    policy = AutoPolicy(CPU_TARGET, CPU_DRAFT)
    copies_well(policy, repeat=24)
    plan = policy.choose(ngram_match=24, ngram_available=64, model_ready=True, cap=64)
    assert plan.source == "ngram"
    assert plan.k >= 16  # long copies are cheap per token here; short ones are not
    assert plan.rate > 1.3 * plan.baseline


def test_this_cpus_costs_skip_short_or_unreliable_matches():
    policy = AutoPolicy(CPU_TARGET, CPU_DRAFT)
    # A 2-token repeat is a weak predictor (the prior), and a reliable copy that can only be 2 tokens
    # long cannot pay for a verify call on 3 tokens (V(3) = 1.99 for at most 3 tokens... at 97%).
    assert policy.choose(ngram_match=2, ngram_available=64, model_ready=False, cap=64).source == "none"
    copies_well(policy, repeat=24, rate=0.6)
    assert policy.choose(ngram_match=24, ngram_available=64, model_ready=False, cap=64).source == "none"


def test_a_table_where_nothing_pays_drafts_nothing():
    policy = AutoPolicy(FLAT_TARGET, FLAT_DRAFT)
    copies_well(policy, repeat=64, rate=0.99)
    assert not policy.model_could_pay()
    assert policy.choose(ngram_match=64, ngram_available=64, model_ready=True, cap=64).source == "none"


def test_the_cap_bounds_the_draft_length():
    policy = AutoPolicy(GPU_TARGET, GPU_DRAFT)
    copies_well(policy, repeat=24)
    plan = policy.choose(ngram_match=24, ngram_available=64, model_ready=False, cap=3)
    assert plan.source == "ngram" and plan.k <= 3


def test_the_model_stops_when_its_confidence_drops():
    # Each verified token costs a quarter of a target step more: worth it only if likely accepted.
    target = CostTable(0.020, {n: 1.0 + 0.25 * (n - 1) for n in (2, 3, 4, 5, 8, 12, 16, 17)})
    policy = AutoPolicy(target, GPU_DRAFT)
    assert policy.model_could_pay()
    taken = [0.9, 0.9]
    assert policy.model_keep_going(taken, confidence=0.99, spent=0.004, cap=16)
    assert not policy.model_keep_going(taken, confidence=0.01, spent=0.004, cap=16)


def test_expected_tokens_and_best_length():
    assert expected_tokens([]) == [1.0]
    assert expected_tokens([0.5, 0.5]) == [1.0, 1.5, 1.75]
    # a step of k tokens costs 1 + k: the rate E(k) / (1 + k) is best at k = 0 for a = 0.5
    assert best_length([0.5] * 4, lambda k: 1.0 + k).k == 0
    # a flat cost makes every accepted token free: draft all
    assert best_length([0.9] * 4, lambda k: 1.0).k == 4


def test_unmeasured_widths_cost_as_much_as_the_next_measured_one():
    table = CostTable(0.01, {2: 1.5, 8: 6.0, 12: 5.0})
    assert table.ratio(1) == 1.0 and table.ratio(2) == 1.5
    assert table.ratio(5) == 6.0  # not interpolated down between 2 and 8
    assert table.ratio(10) == 5.0
    assert table.ratio(24) == pytest.approx(5.0 + 12 * (5.0 / 12 / 2))  # half the widest's cost per token
    assert table.seconds(8) == pytest.approx(0.06)


def test_a_steep_pair_of_widest_widths_does_not_price_long_copies_out():
    """V(16) = 7.0 then V(17) = 9.2 (V is bumpy on a CPU): on the slope of those two a 48-token
    copy would cost as much as 44 one-token calls and would never be drafted, so never measured.
    Priced at half V(17)'s cost per token it is drafted where copies hold."""
    table = CostTable(0.05, {2: 1.8, 3: 2.2, 4: 2.7, 5: 3.3, 8: 6.7, 12: 8.1, 16: 7.0, 17: 9.2})
    assert table.ratio(49) == pytest.approx(9.2 + 32 * 9.2 / 17 / 2)
    assert best_length([0.99] * 48, lambda k: table.seconds(k + 1)).k == 48


def test_one_outlier_moves_an_estimate_at_most_twofold():
    table = CostTable(0.01, {4: 3.0})
    table.observe(4, 10.0)  # a call that waited 10 s for the CPU
    assert table.V[4] <= 3.0 + 0.2 * 3.0 + 1e-9
    table.observe(1, 10.0)
    assert table.step_seconds <= 0.01 + 0.2 * 0.01 + 1e-12
    table.observe(6, 1.0)  # a first observation is kept, within [1, n]
    assert table.V[6] == 6.0


def test_costs_drift_together_through_the_one_token_time():
    table = CostTable(0.01, {4: 3.0})
    for _ in range(50):
        table.observe(1, 0.02)  # the machine got twice as slow
    assert table.seconds(1) == pytest.approx(0.02, rel=0.01)
    assert table.seconds(4) == pytest.approx(0.06, rel=0.01)


def test_a_table_has_drifted_once_a_one_token_call_is_twice_as_slow_or_fast_as_when_measured():
    table = CostTable(0.01, {4: 3.0})
    for seconds, drifted in ((0.015, False), (0.03, True), (0.008, False), (0.004, True)):
        table.step_seconds = seconds
        assert table.drifted() is drifted
        again = CostTable.from_dict(table.to_dict())  # the cache keeps when V was measured
        assert again.measured_at == 0.01 and again.drifted() is drifted
    old_entry = {"step_seconds": 0.03, "V": {"4": 3.0}}  # written before it was kept
    assert not CostTable.from_dict(old_entry).drifted()


def test_a_one_token_time_calibrated_too_high_is_corrected_by_wider_calls_alone():
    """Calibrated in a slow spell, the target looked 300x dearer than it is: auto then drafted at
    every step, so no one-token call came to correct it, and the cache kept the error for good.
    A wider call is never cheaper than a one-token call, so a fast one lowers the estimate."""
    table = CostTable(0.3, {3: 1.5})
    for _ in range(100):
        table.observe(3, 0.0015)  # the true costs: 1 ms a token, V(3) = 1.5
    assert table.step_seconds <= 0.0015 / CLEARLY_BELOW * 1.01  # within 2x of the truth, from 300x
    for _ in range(100):  # then a step without a draft now and then
        table.observe(1, 0.001)
        table.observe(3, 0.0015)
    assert table.seconds(1) == pytest.approx(0.001, rel=0.01) and table.seconds(3) == pytest.approx(0.0015, rel=0.01)


def test_noisy_wide_calls_as_cheap_as_a_step_leave_the_one_token_estimate_unbiased():
    """On a GPU a call on 3 tokens costs about one step, so with timing noise half of them come in
    under the one-token estimate. Only clearly faster ones may lower it, or it would settle low
    (about 6% here) and make drafting look dearer than it is."""
    rng = np.random.default_rng(0)
    table = CostTable(0.005, {3: 1.05})
    estimates = []
    for _ in range(4000):  # drafting on most steps: four verify calls for each plain step
        table.observe(1, 0.005 * (1 + 0.1 * rng.standard_normal()))
        for _ in range(4):
            table.observe(3, 0.00525 * (1 + 0.1 * rng.standard_normal()))
        estimates.append(table.step_seconds)
    assert np.mean(estimates[500:]) == pytest.approx(0.005, rel=0.02)


def test_the_guard_backs_off_a_losing_source_with_growing_gaps():
    guard = Guard()
    lose = dict(tokens=1, seconds=2.0, target_only_rate=1.0)  # half the target-only rate
    for _ in range(GUARD_WINDOW):
        assert guard.allowed("ngram")
        guard.observe("ngram", **lose)
    assert not guard.allowed("ngram") and guard.backoffs == 1
    for _ in range(GUARD_FIRST_GAP - 1):
        guard.observe("none", 1, 1.0, 1.0)
    assert not guard.allowed("ngram")
    guard.observe("none", 1, 1.0, 1.0)
    assert guard.allowed("ngram")  # re-probed after the gap
    for _ in range(GUARD_WINDOW):
        guard.observe("ngram", **lose)
    steps_out = 0
    while not guard.allowed("ngram"):
        guard.observe("none", 1, 1.0, 1.0)
        steps_out += 1
    assert steps_out == 2 * GUARD_FIRST_GAP  # the second loss doubles the gap
    assert guard.allowed("model")  # other sources are not affected


def test_a_new_text_gets_a_fresh_judgement_but_repeat_losers_sit_out_longer():
    policy = AutoPolicy(CostTable(0.04, {2: 1.6}))
    for _ in range(GUARD_WINDOW):
        policy.record_step("ngram", tokens=1, seconds=1.0)  # far below the target-only rate
    assert not policy.guard.allowed("ngram")
    policy.start_generation()  # the next text: what lost on the last one may draft again
    assert policy.guard.allowed("ngram")
    for _ in range(GUARD_WINDOW - 1):
        policy.record_step("ngram", tokens=1, seconds=1.0)
    policy.start_generation()  # an unfinished window does not carry over either
    for _ in range(GUARD_WINDOW - 1):
        policy.record_step("ngram", tokens=1, seconds=1.0)
    assert policy.guard.allowed("ngram") and policy.guard.backoffs == 1
    policy.record_step("ngram", tokens=1, seconds=1.0)
    steps_out = 0
    while not policy.guard.allowed("ngram"):
        policy.record_step("none", tokens=1, seconds=0.04)
        steps_out += 1
    assert steps_out == 2 * GUARD_FIRST_GAP  # the second loss still doubles the gap


def test_the_guard_keeps_a_winning_source():
    guard = Guard()
    for _ in range(10 * GUARD_WINDOW):
        guard.observe("ngram", tokens=3, seconds=2.0, target_only_rate=1.0)
        assert guard.allowed("ngram")
    assert guard.backoffs == 0


def test_ngram_proposals_are_scored_against_what_was_generated():
    acceptance = Acceptance(lambda _: 0.5, weight=0.0)
    scorer = NgramScorer(acceptance)
    context = [1, 2, 3]
    scorer.propose(3, 0, [7, 8, 9])  # the output goes 7, 8, then 5: two accepted, one rejected
    scorer.propose(4, 1, [9])  # proposed at 4 (after 7): rejected at once
    scorer.resolve(context + [7])
    assert acceptance.counts == {(0, 0): [1, 1]}  # position 1 of the first, recorded at once
    assert len(scorer.pending) == 2
    scorer.resolve(context + [7, 8, 5])
    assert acceptance.rate(0, 1) == 1.0 and acceptance.rate(0, 2) == 1.0 and acceptance.rate(0, 3) == 0.0
    assert acceptance.counts[(0, 0)] == [1, 1]  # never recorded twice
    assert acceptance.rate(1, 1) == 0.0
    assert scorer.pending == []
    scorer.propose(6, 2, [4, 4])
    scorer.resolve(context + [7, 8, 5, 4], final=True)  # the generation ended: 1 judged, accepted
    assert acceptance.counts[(2, 0)] == [1, 1] and (2, 1) not in acceptance.counts
    assert scorer.pending == []


def test_the_draft_follows_the_target_when_the_machine_slows_down():
    policy = AutoPolicy(CostTable(0.040, {2: 2.0}), CostTable(0.020, {2: 1.9}))
    for _ in range(50):
        policy.observe_verify(1, 0.120)  # another process took the CPU: target steps 3x slower
    assert policy.target.step_seconds == pytest.approx(0.120, rel=0.01)
    assert policy.draft.step_seconds / policy.target.step_seconds == pytest.approx(0.5, rel=1e-6)
    assert not policy.model_could_pay()  # c is still 0.5: the draft did not become cheap


def test_each_generation_learns_on_top_of_what_earlier_ones_taught():
    policy = AutoPolicy(CPU_TARGET, CPU_DRAFT)
    copies_well(policy, repeat=24, rate=0.97)  # earlier texts: long copies held
    assert policy.learned["ngram"].rate(bucket(24, MATCH_EDGES), 20) > 0.9
    policy.start_generation()
    assert policy.ngram.rate(bucket(24, MATCH_EDGES), 20) > 0.9  # a new text starts from that
    for _ in range(8):  # this text's copies break after a few tokens (rows in a new order)
        record_run(policy.ngram, bucket(24, MATCH_EDGES), 5, 4)
    assert policy.ngram.rate(bucket(24, MATCH_EDGES), 5) < 0.5  # this text's own evidence wins fast
    assert policy.learned["ngram"].rate(bucket(24, MATCH_EDGES), 5) > 0.9  # the long run moves less


def test_a_text_that_copies_raises_estimates_it_has_no_evidence_for_yet():
    """One text's outcomes in one cell shift its estimates in every cell (its logit shift); the
    table of all texts learns only the outcomes themselves, and the next text starts unshifted."""
    policy = AutoPolicy(CPU_TARGET)
    short, long = bucket(6, MATCH_EDGES), bucket(24, MATCH_EDGES)
    before = policy.ngram.rate(long, 10)
    for _ in range(30):  # this text's short repeats keep holding
        record_run(policy.ngram, short, 4, 4)
    assert policy.ngram.shift > 0.3
    assert policy.ngram.rate(long, 10) > before + 0.03  # never judged in this text, raised anyway
    assert policy.learned["ngram"].rate(long, 10) == pytest.approx(before)  # nothing recorded there
    policy.start_generation()
    assert policy.ngram.shift == 0.0 and policy.ngram.rate(long, 10) == pytest.approx(before)
    for _ in range(30):  # a text whose copies break at once lowers every estimate
        record_run(policy.ngram, short, 1, 0)
    assert policy.ngram.shift < -0.5 and policy.ngram.rate(long, 10) < before - 0.1
    for _ in range(2000):
        record_run(policy.ngram, short, 1, 0)
    assert policy.ngram.shift == -TEXT_SHIFT_MAX  # bounded: earlier texts are never forgotten


def test_a_copy_drafts_no_longer_than_the_repeat_it_continues():
    policy = AutoPolicy(GPU_TARGET, GPU_DRAFT)  # verify calls nearly free: as long as allowed
    for repeat in (2, 3, 8, 24, 64):
        copies_well(policy, repeat=repeat, rate=0.99)
    assert policy.choose(ngram_match=2, ngram_available=64, model_ready=False, cap=64).k == 3
    assert policy.choose(ngram_match=8, ngram_available=64, model_ready=False, cap=64).k == 8
    assert policy.choose(ngram_match=24, ngram_available=64, model_ready=False, cap=64).k == 24
    assert policy.choose(ngram_match=64, ngram_available=64, model_ready=False, cap=64).k == 64


def test_forgetting_acceptance_keeps_the_costs():
    policy = AutoPolicy(CostTable(0.04, {2: 1.6}), CostTable(0.02, {2: 1.9}))
    fresh = policy.ngram.rate(bucket(24, MATCH_EDGES), 20)
    copies_well(policy, repeat=24, rate=0.2)
    for _ in range(GUARD_WINDOW):
        policy.record_step("ngram", tokens=1, seconds=1.0)  # far below the target-only rate
    policy.observe_verify(2, 0.08)
    assert policy.learned["ngram"].rate(bucket(24, MATCH_EDGES), 20) < 0.3 and not policy.guard.allowed("ngram")
    policy.forget_acceptance()
    assert policy.learned["ngram"].rate(bucket(24, MATCH_EDGES), 20) == pytest.approx(fresh)
    assert policy.ngram.rate(bucket(24, MATCH_EDGES), 20) == pytest.approx(fresh) and policy.guard.allowed("ngram")
    assert {2: pytest.approx(1.68)} == policy.target.V and policy.draft.step_seconds == pytest.approx(0.02)


def test_a_target_without_snapshots_pays_for_evaluating_the_kept_tokens_again():
    """replay_seconds: after a rejection at draft position a + 1, a call on the a kept tokens and
    the target's own; the chance of each a from the rates. A policy that replays drafts shorter."""
    from specllm.engine.policy import replay_seconds

    seconds = {1: 1.0, 2: 1.5, 3: 2.0}.__getitem__
    assert replay_seconds([1.0, 1.0], 2, seconds) == 0.0  # nothing is ever rejected
    assert replay_seconds([0.0, 1.0], 2, seconds) == 1.0  # always rejected first: the target's token again
    assert replay_seconds([0.5, 0.5], 2, seconds) == pytest.approx(0.5 * 1.0 + 0.5 * 0.5 * 1.5)
    table = CostTable(0.01, {n: 1.0 + 0.02 * n for n in range(2, 20)})
    plain, replaying = AutoPolicy(table), AutoPolicy(table)
    replaying.replays = True
    for policy in (plain, replaying):
        policy.learned["ngram"] = Acceptance(lambda _: 0.6)
        policy.start_generation()
    assert replaying.ngram_choice(8, 8).k < plain.ngram_choice(8, 8).k
    assert replaying.ngram_choice(8, 8).rate < plain.ngram_choice(8, 8).rate


def test_acceptance_rates_are_always_those_of_the_counts_at_hand():
    """rates() keeps each row it computed until anything it reads changes: the table's own counts
    and shift, or a parent's (recorded through another child too)."""
    import random

    from specllm.engine.policy import Acceptance, ngram_prior

    rng = random.Random(5)
    parent = Acceptance(ngram_prior)
    first, second = parent.child(4.0), parent.child(4.0)
    for _ in range(400):
        table = rng.choice([first, second, parent])
        bucket_, k = rng.randrange(4), rng.randrange(1, 8)
        assert table.rates(bucket_, k) == tuple(table.rate(bucket_, j) for j in range(1, k + 1))
        if rng.random() < 0.5:
            rng.choice([first, second]).record(rng.randrange(4), rng.randrange(1, 8), rng.random() < 0.6)

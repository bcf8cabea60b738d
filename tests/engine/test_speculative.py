"""The verification rule and the sampler, pure numpy: exact where the math is exact, chi-square
with fixed seeds and large samples where the result is a distribution."""

import numpy as np
import pytest
from stats import chi_square_pvalue

from specllm.engine.sampling import SamplerSettings, _top_k, distribution, sample
from specllm.engine.speculative import Verdict, residual, verify_greedy, verify_sampled
from specllm.errors import SpecllmError

V = 12
N = 40_000
P_MIN = 1e-3  # a correct sampler fails this one time in a thousand; seeds are fixed


def random_dist(rng, support=None):
    x = rng.gamma(0.5, size=V)
    if support is not None:
        mask = np.zeros(V, bool)
        mask[support] = True
        x[~mask] = 0
    return x / x.sum()


def emitted_first_tokens(p_rows, q_rows, seed, n=N, one_hot_draft=False):
    """Empirical distribution of the first emitted token: draft d_1 ~ q_1 (or a fixed token for
    a one-hot drafter), then verify against p."""
    rng = np.random.default_rng(seed)
    counts = np.zeros(V)
    for _ in range(n):
        if one_hot_draft:
            d1 = 3
            draft, q = [d1, 5], None
        else:
            d1 = sample(q_rows[0], rng)
            draft, q = [d1, sample(q_rows[1], rng)], q_rows
        verdict = verify_sampled(draft, q, p_rows, rng)
        first = draft[0] if verdict.n_accepted >= 1 else verdict.token
        counts[first] += 1
    return counts


CASES = {
    "random p and q": lambda rng: (random_dist(rng), random_dist(rng)),
    "q equals p": lambda rng: (lambda d: (d, d.copy()))(random_dist(rng)),
    "disjoint supports": lambda rng: (random_dist(rng, [0, 1, 2, 3, 4]), random_dist(rng, [6, 7, 8, 9])),
    "q wider than p": lambda rng: (random_dist(rng, [0, 1, 2]), random_dist(rng)),
}


@pytest.mark.parametrize("case", CASES)
def test_first_token_is_distributed_as_p(case):
    rng = np.random.default_rng(7)
    p1, q1 = CASES[case](rng)
    p = np.stack([p1, random_dist(rng), random_dist(rng)])
    q = np.stack([q1, random_dist(rng)])
    counts = emitted_first_tokens(p, q, seed=11)
    assert chi_square_pvalue(counts, p1) > P_MIN


def test_one_hot_draft_is_distributed_as_p():
    rng = np.random.default_rng(3)
    p = np.stack([random_dist(rng) for _ in range(3)])
    counts = emitted_first_tokens(p, None, seed=5, one_hot_draft=True)
    assert chi_square_pvalue(counts, p[0]) > P_MIN


def test_bonus_token_is_distributed_as_last_p():
    # A draft the target always accepts (p puts all mass on it) leaves only the bonus to sample.
    rng = np.random.default_rng(1)
    p = np.zeros((3, V))
    p[0, 4] = p[1, 9] = 1.0
    p[2] = random_dist(rng)
    counts = np.zeros(V)
    for _ in range(N):
        verdict = verify_sampled([4, 9], None, p, rng)
        assert verdict.n_accepted == 2
        counts[verdict.token] += 1
    assert chi_square_pvalue(counts, p[2]) > P_MIN


def test_second_token_given_first_accepted_is_distributed_as_p2():
    rng = np.random.default_rng(2)
    p = np.stack([random_dist(rng) for _ in range(3)])
    q = np.stack([p[0], random_dist(rng)])  # d_1 always accepted since q_1 == p_1
    counts = np.zeros(V)
    for _ in range(N):
        draft = [sample(q[0], rng), sample(q[1], rng)]
        verdict = verify_sampled(draft, q, p, rng)
        second = draft[1] if verdict.n_accepted == 2 else verdict.token
        counts[second] += 1
    assert chi_square_pvalue(counts, p[1]) > P_MIN


def test_a_wrong_verifier_is_caught():
    """The chi-square check has teeth: always accepting the draft gives q, not p."""
    rng = np.random.default_rng(4)
    p, q = random_dist(rng), random_dist(rng)
    counts = np.bincount([sample(q, rng) for _ in range(N)], minlength=V)
    assert chi_square_pvalue(counts, p) < 1e-6


def test_draft_token_outside_target_vocabulary_is_rejected():
    rng = np.random.default_rng(0)
    p = np.stack([random_dist(rng), random_dist(rng)])
    q = np.zeros((1, V + 3))
    q[0, V + 1] = 1.0
    verdict = verify_sampled([V + 1], q, p, rng)
    assert verdict.n_accepted == 0 and verdict.token < V


def test_residual_is_positive_part_of_difference():
    p = np.array([0.5, 0.3, 0.2, 0.0])
    q = np.array([0.2, 0.5, 0.2, 0.1])
    np.testing.assert_allclose(residual(p, q).dense(), [0.3, 0.0, 0.0, 0.0])
    np.testing.assert_allclose(residual(p, p).dense(), p)  # no mass left: falls back to p


def test_greedy_verification_accepts_the_matching_prefix():
    assert verify_greedy([5, 6, 7], [5, 6, 9, 1]).__dict__ == {"n_accepted": 2, "token": 9}
    assert verify_greedy([5, 6, 7], [5, 6, 7, 1]).__dict__ == {"n_accepted": 3, "token": 1}
    assert verify_greedy([], [8]).__dict__ == {"n_accepted": 0, "token": 8}
    assert verify_greedy([2], [3, 4]).__dict__ == {"n_accepted": 0, "token": 3}


def test_greedy_verification_reads_no_row_past_the_stop():
    """The engine's rows are computed when read: verification must stop reading at the rejection."""

    class Rows:
        def __getitem__(self, i):
            assert i <= 1, f"row {i} read after the rejection at row 1"
            return [5, 9][i]

    assert verify_greedy([5, 7, 8], Rows()) == Verdict(1, 9)


# --- the sampler chain -----------------------------------------------------------------------


def reference_distribution(logits, s: SamplerSettings):
    """llama.cpp's chain written the slow, obvious way: full sort of the raw logits, top-k, then
    top-p and min-p on the untempered probabilities, then temperature and softmax."""
    x = np.asarray(logits, float)
    order = np.argsort(-x, kind="stable")
    if s.top_k > 0:
        order = order[: s.top_k]
    p = np.exp(x[order] - x[order].max())
    p /= p.sum()
    if s.top_p < 1:
        cum = np.cumsum(p)
        n = next(i for i in range(len(p)) if cum[i] >= s.top_p) + 1
        order, p = order[:n], p[:n] / p[:n].sum()
    if s.min_p > 0:
        keep = p >= s.min_p * p.max()
        order, p = order[keep], p[keep]
    t = np.exp((x[order] - x[order].max()) / s.temperature)
    out = np.zeros(len(logits))
    out[order] = t / t.sum()
    return out


@pytest.mark.parametrize(
    "settings",
    [
        SamplerSettings(temperature=1.0, top_k=0, top_p=1.0, min_p=0.0),
        SamplerSettings(temperature=0.7, top_k=40, top_p=0.95, min_p=0.05),
        SamplerSettings(temperature=1.3, top_k=0, top_p=0.9, min_p=0.0),
        SamplerSettings(temperature=0.5, top_k=5, top_p=1.0, min_p=0.2),
        SamplerSettings(temperature=2.0, top_k=0, top_p=0.5, min_p=0.01),
        SamplerSettings(temperature=0.8, top_k=0, top_p=0.0, min_p=0.0),  # the most likely token only
        SamplerSettings(temperature=0.8, top_k=40, top_p=1.0, min_p=1.0),  # the same, and its ties
    ],
)
@pytest.mark.parametrize("n_vocab", [50, 5000])
def test_distribution_matches_reference_chain(settings, n_vocab):
    logits = np.random.default_rng(n_vocab).normal(0, 3, n_vocab).astype(np.float32)
    np.testing.assert_allclose(distribution(logits, settings), reference_distribution(logits, settings), atol=1e-12)


def test_temperature_applies_after_the_filters():
    """Which tokens survive top-p and min-p does not depend on the temperature (llama.cpp's order)."""
    logits = np.log(np.array([0.5, 0.3, 0.15, 0.05]))
    for t in (0.3, 1.0, 3.0):
        kept = distribution(logits, SamplerSettings(temperature=t, top_k=0, top_p=0.9, min_p=0.0)) > 0
        np.testing.assert_array_equal(kept, [True, True, True, False])  # 0.5 + 0.3 + 0.15 >= 0.9
        kept = distribution(logits, SamplerSettings(temperature=t, top_k=0, top_p=1.0, min_p=0.2)) > 0
        np.testing.assert_array_equal(kept, [True, True, True, False])  # 0.05 < 0.2 * 0.5
    p = distribution(logits, SamplerSettings(temperature=2.0, top_k=2, top_p=1.0, min_p=0.0))
    np.testing.assert_allclose(p[:2], np.sqrt([0.5, 0.3]) / np.sqrt([0.5, 0.3]).sum())


@pytest.mark.parametrize("n_vocab", [50, 5000])
def test_ties_at_the_top_k_cut_keep_the_lowest_ids(n_vocab):
    """llama.cpp keeps exactly k at a tie too, but which of the tied tokens depends on its sort;
    specllm keeps the lowest ids, so the choice is deterministic and documented."""
    logits = np.random.default_rng(0).normal(0, 1, n_vocab).astype(np.float32) - 10
    logits[[3, 40, 7, 20]] = 5.0  # four tied at the top
    logits[30] = 6.0
    s = SamplerSettings(temperature=1.0, top_k=3, top_p=1.0, min_p=0.0)
    assert set(np.flatnonzero(distribution(logits, s))) == {30, 3, 7}
    s = SamplerSettings(temperature=1.0, top_k=0, top_p=0.6, min_p=0.0)  # top-p cuts inside the tie
    kept = np.flatnonzero(distribution(logits, s))
    assert set(kept) <= {30, 3, 7, 20, 40} and set(kept) == {30, *sorted([3, 7, 20, 40])[: len(kept) - 1]}


@pytest.mark.parametrize("k", [1, 40, 100])
@pytest.mark.parametrize("size", [151_936, 151_939, 1_000])  # whole slices, a few ids past them, a small row
def test_top_k_of_a_vocabulary_sized_row_is_the_full_sorts(k, size):
    """Narrowing a row down to the groups whose maxima can hold its k largest values is exact: the
    same ids in the same order as a full sort, ties at the cut included, on a smooth row, a row of
    few distinct values (ties everywhere), a row whose top values all lie in one group, and one
    whose top values lie past the last whole group."""
    rng = np.random.default_rng(k)
    smooth = rng.normal(0, 3, size).astype(np.float32)
    few_values = rng.integers(0, 6, size).astype(np.float32)
    one_group = np.zeros(size, np.float32)
    one_group[7 :: size // 16] = rng.normal(5, 1, one_group[7 :: size // 16].size)  # ids 7, 7 + m, ...
    at_the_end = rng.normal(0, 1, size).astype(np.float32)
    at_the_end[-3:] = 9.0
    for row in (smooth, few_values, one_group, at_the_end):
        full_sort = np.lexsort((np.arange(row.size), -row))[:k]  # by value, ties by lowest id
        np.testing.assert_array_equal(_top_k(row, k), full_sort)


def test_greedy_distribution_is_one_hot_at_argmax():
    logits = np.array([0.1, 2.0, -1.0, 1.9])
    np.testing.assert_array_equal(distribution(logits, SamplerSettings(temperature=0)), [0, 1, 0, 0])


@pytest.mark.parametrize("temperature", [1e-320, 5e-324, 1e-300])
def test_a_tiny_temperature_is_one_hot_at_argmax_as_greedy_is(temperature):
    """Dividing the logits by a subnormal temperature overflowed to infinities, whose softmax is
    NaN: the token drawn was noise rather than the argmax."""
    logits = np.random.default_rng(3).normal(0, 3, 5000).astype(np.float32)
    greedy = distribution(logits, SamplerSettings(temperature=0))
    for top_k in (0, 40):
        tiny = distribution(logits, SamplerSettings(temperature=temperature, top_k=top_k, top_p=1.0, min_p=0.0))
        np.testing.assert_array_equal(tiny, greedy)


def test_sample_follows_the_distribution():
    rng = np.random.default_rng(9)
    p = random_dist(rng)
    counts = np.bincount([sample(p, rng) for _ in range(N)], minlength=V)
    assert chi_square_pvalue(counts, p) > P_MIN


@pytest.mark.parametrize(
    "kwargs",
    [dict(temperature=-1), dict(top_k=-2), dict(top_p=-0.1), dict(top_p=1.5), dict(min_p=1.01), dict(min_p=-0.1)],
)
def test_invalid_sampler_settings_are_refused(kwargs):
    with pytest.raises(SpecllmError):
        SamplerSettings(**kwargs)


def test_a_sparse_row_draws_the_token_its_dense_vector_draws():
    """In id order the sparse row's cumulative sums are the dense vector's: the same random number
    gives the same token, so seeded runs did not change when verification went sparse."""
    from specllm.engine.sampling import Sparse

    rng = np.random.default_rng(9)
    for _ in range(200):
        p = random_dist(rng, rng.choice(V, size=int(rng.integers(1, V)), replace=False))
        q = random_dist(rng, rng.choice(V, size=int(rng.integers(1, V)), replace=False))
        seed = int(rng.integers(1 << 30))
        sparse_p = Sparse.of(np.flatnonzero(p)[::-1].copy(), p[np.flatnonzero(p)][::-1].copy(), V)
        assert sparse_p.sample(np.random.default_rng(seed)) == sample(p, np.random.default_rng(seed))
        dense_r = np.maximum(p - q, 0.0)
        dense_r = dense_r if dense_r.sum() > 0 else p
        assert residual(sparse_p, q).sample(np.random.default_rng(seed)) == sample(dense_r, np.random.default_rng(seed))
        np.testing.assert_array_equal(residual(sparse_p, q).dense(), dense_r)

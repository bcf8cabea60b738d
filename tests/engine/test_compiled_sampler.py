"""The sampler chain in C (specllm/engine/_sampler.c) against sampling.py's numpy path, which it
stands in for wherever it is built: the same ids kept in the same order, probabilities equal to
rounding, the very same draws, and numpy's path wherever the C one declines a row."""

import hashlib
from functools import partial
from pathlib import Path

import numpy as np
import pytest

import specllm
from specllm.engine import sampling
from specllm.engine.sampling import SamplerSettings, Sparse, candidates, sample, top_probability
from specllm.errors import LogitsNotFinite

COMPILED = sampling._compiled

SETTINGS = [
    SamplerSettings(temperature=0.8, top_k=40, top_p=0.95, min_p=0.05),  # the CLI's defaults
    SamplerSettings(temperature=1.3, top_k=100, top_p=0.9, min_p=0.0),
    SamplerSettings(temperature=0.5, top_k=10, top_p=1.0, min_p=0.1),
    SamplerSettings(temperature=0.7, top_k=256, top_p=0.99, min_p=0.01),  # the largest k it takes
    SamplerSettings(temperature=1.0, top_k=1, top_p=1.0, min_p=0.0),
    SamplerSettings(temperature=1e-320, top_k=40, top_p=1.0, min_p=0.0),  # all but greedy
    SamplerSettings(temperature=1.0, top_k=40, top_p=0.5, min_p=0.0),  # "two on top" reaches it exactly
]


def on_numpys_path(monkeypatch, function, *args):
    """function(*args) with the compiled sampler out of the way."""
    with monkeypatch.context() as m:
        m.setattr(sampling, "_compiled", None)
        return function(*args)


def rows(size, seed):
    """A smooth row, one of few distinct values (ties everywhere, at every cut), one whose top
    values all lie in one of the top-k's groups (ids 7, 7 + m, ...), one whose top values lie
    past the last whole group, and one of two values on top whose probabilities are 1/2 each,
    exactly (the rest are 0: exp(-1000) underflows)."""
    rng = np.random.default_rng(seed)
    smooth = rng.normal(0, 3, size).astype(np.float32)
    few_values = rng.integers(0, 6, size).astype(np.float32)
    one_group = np.zeros(size, np.float32)
    one_group[7 :: size // 16] = rng.normal(5, 1, one_group[7 :: size // 16].size)
    at_the_end = rng.normal(0, 1, size).astype(np.float32)
    at_the_end[-3:] = 9.0
    two_on_top = np.full(size, -1000.0, np.float32)
    two_on_top[[size // 3, size // 5]] = 0.0
    rows = {"smooth": smooth, "few values": few_values, "one group": one_group, "at the end": at_the_end}
    return rows | {"two on top": two_on_top}


def test_the_compiled_sampler_is_built_in_this_install_from_its_source():
    """setup.py builds it wherever a C compiler is found, as on every machine the tests run on. An
    editable install does not rebuild it when _sampler.c changes: pip install -e . does."""
    assert COMPILED is not None, "specllm.engine._sampler was not built: pip install -e . with a C compiler"
    source = Path(sampling.__file__).with_name("_sampler.c").read_bytes()
    assert hashlib.sha256(source).hexdigest() == COMPILED.SOURCE_SHA256, "_sampler.c changed: pip install -e ."


@pytest.mark.parametrize("size", [151_936, 151_939, 1_000, 300])
@pytest.mark.parametrize("s", SETTINGS, ids=lambda s: f"k{s.top_k}-p{s.top_p}-min{s.min_p}-t{s.temperature}")
def test_the_compiled_chain_keeps_numpys_ids_with_its_probabilities(size, s, monkeypatch):
    for name, row in rows(size, seed=s.top_k + size).items():
        ids, p = candidates(row, s)
        expected_ids, expected_p = on_numpys_path(monkeypatch, candidates, row, s)
        np.testing.assert_array_equal(ids, expected_ids, err_msg=name)
        np.testing.assert_allclose(p, expected_p, rtol=1e-13, atol=1e-300, err_msg=name)
        assert p.dtype == np.float64 and ids.dtype == np.intp


@pytest.mark.parametrize("k", [1, 40, 256])
def test_the_compiled_top_k_is_the_full_sorts_ties_included(k):
    """Without top-p, min-p and with a plain temperature, the chain keeps the top-k itself: the same
    ids in the same order as a full sort by value, ties by lowest id."""
    s = SamplerSettings(temperature=1.0, top_k=k, top_p=1.0, min_p=0.0)
    for name, row in rows(151_936, seed=k).items():
        full_sort = np.lexsort((np.arange(row.size), -row))[:k]
        np.testing.assert_array_equal(candidates(row, s)[0], full_sort, err_msg=name)


def test_min_p_1_keeps_every_token_tied_at_the_top():
    row = np.zeros(5000, np.float32)
    row[[9, 90, 900]] = 2.0
    ids, p = np.empty(40, np.intp), np.empty(40)
    assert COMPILED.candidates(row, ids, p, 1.0, 1.0, 0.8) == 3
    assert list(ids[:3]) == [9, 90, 900] and list(p[:3]) == [1 / 3] * 3


def test_rows_the_compiled_chain_declines_take_numpys_path(monkeypatch):
    """A strided row, and one whose NaN leaves fewer than k numbers: the C chain writes nothing and
    says so (-1); candidates then gives numpy's result, which keeps only the numbers."""
    s = SamplerSettings(temperature=0.8, top_k=40, top_p=1.0, min_p=0.0)
    row = np.random.default_rng(0).normal(0, 3, 2 * 5000).astype(np.float32)
    nan_row = row[:5000].copy()
    nan_row[40:] = np.nan
    nan_row[:3] = np.nan
    for declined in (row[::2], nan_row):
        ids, p = np.empty(40, np.intp), np.empty(40)
        assert COMPILED.candidates(declined, ids, p, s.top_p, s.min_p, s.temperature) == -1
        for got, expected in zip(candidates(declined, s), on_numpys_path(monkeypatch, candidates, declined, s)):
            np.testing.assert_array_equal(got, expected)
    ids, p = candidates(nan_row, s)
    numbers = p > 0
    assert sorted(ids[numbers]) == list(range(3, 40)) and np.isclose(p.sum(), 1.0)


@pytest.mark.parametrize("top_k", [40, 0])  # the compiled chain and numpy's; numpy's alone
def test_nan_among_the_values_is_never_kept_on_either_path(top_k, monkeypatch):
    """As llama.cpp's samplers pass NaN over. numpy's max and argmax stop at the first NaN, and the
    top-k read the groups' maxima: a NaN used to drop every value of its group, or end in an
    IndexError."""
    row = np.random.default_rng(1).normal(0, 1, 5000).astype(np.float32)
    m = row.size // 16  # the top-k's groups: ids i, i + m, i + 2m, ...
    row[[1, 18 + m, 4999]] = np.nan  # one starts a group, one lies inside another, one past them
    row[[1 + m, 18]] = 50.0  # the largest, in those two groups
    s = SamplerSettings(temperature=1.0, top_k=top_k, top_p=0.999, min_p=0.0)
    ids, p = candidates(row, s)
    assert list(ids[:2]) == [18, 1 + m] and not np.isnan(row[ids]).any() and np.isfinite(p).all()
    numpy_ids, numpy_p = on_numpys_path(monkeypatch, candidates, row, s)
    np.testing.assert_array_equal(numpy_ids, ids)
    np.testing.assert_allclose(numpy_p, p, rtol=1e-13)
    greedy = SamplerSettings(temperature=0)
    row[0] = np.nan  # where numpy's argmax stops
    assert candidates(row, greedy)[0][0] == on_numpys_path(monkeypatch, candidates, row, greedy)[0][0] == 18


def rows_without_a_finite_top(size):
    """NaN alone; NaN and -inf; an overflow to +inf among numbers (taken off the row for the
    softmax, it is NaN), and two of them, one past a NaN (where numpy's argmax stops)."""
    numbers = np.random.default_rng(2).normal(0, 3, size).astype(np.float32)
    one_inf, two_infs = numbers.copy(), numbers.copy()
    one_inf[size // 2] = np.inf
    two_infs[[7, 9]], two_infs[8] = np.inf, np.nan
    return {
        "NaN": np.full(size, np.nan, np.float32),
        "NaN and -inf": np.where(np.arange(size) % 2, np.nan, -np.inf).astype(np.float32),
        "+inf": one_inf,
        "+inf twice": two_infs,
    }


@pytest.mark.parametrize("temperature, top_k, min_p", [(0, 40, 0.05), (0.8, 40, 0.05), (0.8, 40, 0.0), (0.8, 0, 0.05)])
def test_a_row_without_a_finite_top_is_a_model_that_broke_down(temperature, top_k, min_p, monkeypatch):
    s = SamplerSettings(temperature=temperature, top_k=top_k, top_p=1.0, min_p=min_p)
    for name, row in rows_without_a_finite_top(5000).items():
        for choose in (candidates, partial(on_numpys_path, monkeypatch, candidates)):
            with pytest.raises(LogitsNotFinite, match="not finite numbers"):
                choose(row, s)
                pytest.fail(name)


@pytest.mark.parametrize(
    "arguments, error",
    [
        ((np.zeros(9, np.float64), np.empty(4, np.intp), np.empty(4)), TypeError),  # not float32
        ((np.zeros(9, np.float32), np.empty(4, np.int32), np.empty(4)), TypeError),
        ((np.zeros(9, np.float32), np.empty(4, np.intp), np.empty(3)), ValueError),  # lengths differ
        ((np.zeros(9, np.float32), np.empty(257, np.intp), np.empty(257)), ValueError),  # k above 256
        ((np.zeros((3, 3), np.float32), np.empty(4, np.intp), np.empty(4)), TypeError),
        ((np.zeros(9, np.float32), np.empty(8, np.intp)[::2], np.empty(4)), TypeError),  # strided output
        ((np.zeros(9, np.float32), np.empty(4, np.intp), np.empty(4).view(np.int64)), TypeError),
    ],
)
def test_the_compiled_chain_refuses_buffers_it_cannot_fill(arguments, error):
    with pytest.raises(error):
        COMPILED.candidates(*arguments, 0.95, 0.05, 0.8)


def test_the_compiled_draw_is_numpys_draw(monkeypatch):
    """The same running sums in the same order and the same search: the very same index, for every
    seed, on normalised and unnormalised vectors, with zeros at either end and inside."""
    rng = np.random.default_rng(0)
    vectors = [rng.dirichlet(np.ones(40)), rng.random(7) * 3, np.array([0.0, 0.5, 0.0, 0.5, 0.0]), np.ones(1)]
    vectors += [rng.dirichlet(np.full(151_936, 0.01)), np.array([1e-300, 1.0, 1e-300])]
    for probs in vectors:
        for seed in range(300):
            drawn = sample(probs, np.random.default_rng(seed))
            assert drawn == on_numpys_path(monkeypatch, sample, probs, np.random.default_rng(seed))
    assert COMPILED.draw(np.ones(8)[::2], 0.5) == -1  # strided: numpy's draw, from the same u


class FixedDraw:
    def __init__(self, u):
        self.u = u

    def random(self):
        return self.u


def test_a_draw_on_a_running_sum_goes_past_it_as_numpys(monkeypatch):
    """searchsorted(side="right"): where u lands exactly on a running sum, the next token is drawn,
    so a token of probability 0 never is (u = 0 at a leading 0, or on a sum a 0 repeats)."""
    probs = np.array([0.0, 0.25, 0.25, 0.0, 0.5])
    drawn = [sample(probs, FixedDraw(u)) for u in (0.0, 0.25, 0.5, 0.75, 0.9999)]
    assert drawn == [1, 2, 4, 4, 4]
    monkeypatch.setattr(sampling, "_compiled", None)
    assert [sample(probs, FixedDraw(u)) for u in (0.0, 0.25, 0.5, 0.75, 0.9999)] == drawn


@pytest.fixture(scope="module")
def engine(tiny_models):
    e = specllm.load(str(tiny_models.target), str(tiny_models.draft), n_ctx=512, n_threads=1)
    yield e
    e.close()


@pytest.mark.parametrize("drafter", ["model", "none"])
def test_sampled_generations_are_numpys_token_for_token(engine, drafter, monkeypatch):
    """The compiled chain and draw in the loop: the draft's q rows, the target's p rows, the p/q
    rule and the residual's draw give numpy's tokens for the same seeds."""
    kw = dict(max_tokens=32, temperature=0.9, top_k=40, top_p=0.95, min_p=0.05, drafter=drafter, gamma=4)
    prompts = ["Hello world", "def f(x): return", "the cat is in the house and the cat"]
    compiled = [engine.generate(p, seed=seed, **kw).tokens for p in prompts for seed in range(4)]
    monkeypatch.setattr(sampling, "_compiled", None)
    assert [engine.generate(p, seed=seed, **kw).tokens for p in prompts for seed in range(4)] == compiled


def random_sparse(rng, size, n, ids_up_to=None):
    ids = rng.choice(ids_up_to or size, n, replace=False)
    return ids.astype(np.intp), rng.dirichlet(np.ones(n))


def test_the_compiled_sort_by_id_is_numpys_stable_sort(monkeypatch):
    rng = np.random.default_rng(0)
    cases = [random_sparse(rng, 151_936, n) for n in (1, 2, 40, 256)]
    cases.append((np.array([5, 3, 5, 3, 9], np.intp), np.array([0.1, 0.2, 0.3, 0.15, 0.25])))  # repeats: stable
    cases.append(random_sparse(rng, 151_936, 300))  # beyond 256: numpy's sort
    for ids, p in cases:
        got = Sparse.of(ids, p, 151_936)
        expected = on_numpys_path(monkeypatch, Sparse.of, ids, p, 151_936)
        np.testing.assert_array_equal(got.ids, expected.ids)
        np.testing.assert_array_equal(got.p, expected.p)
    assert COMPILED.by_id(*cases[-1], np.empty(300, np.intp), np.empty(300)) == -1


def test_the_compiled_residual_is_numpys_to_the_bit(monkeypatch):
    """max(0, p - q) over the union of ids: overlapping rows, disjoint ones, a one-hot q, q's ids
    past p's vocabulary (a larger draft vocabulary), and p == q, which holds no mass."""
    rng = np.random.default_rng(1)
    size = 151_936
    pairs = []
    for _ in range(200):
        p_ids, p = random_sparse(rng, size, int(rng.integers(1, 60)), ids_up_to=200)
        q_ids, q = random_sparse(rng, size + 50, int(rng.integers(1, 60)), ids_up_to=None)
        q_ids[: len(q_ids) // 3] = rng.choice(np.arange(size - 40, size + 50), len(q_ids) // 3, replace=False)
        q_ids, keep = np.unique(q_ids, return_index=True)
        pairs.append((Sparse.of(p_ids, p, size), Sparse.of(q_ids, q[keep], size)))
    p = Sparse.of(*random_sparse(rng, size, 40), size)
    pairs += [(p, p), (p, Sparse(p.ids[:1], np.ones(1), size)), (p, Sparse(np.array([size + 3]), np.ones(1), size))]
    masses = 0
    for p, q in pairs:
        got = p.minus(q)
        expected = on_numpys_path(monkeypatch, p.minus, q)
        assert (got is None) == (expected is None)
        if got is not None:
            np.testing.assert_array_equal(got.ids, expected.ids)
            np.testing.assert_array_equal(got.p, expected.p)
            masses += 1
    assert p.minus(p) is None and masses >= 200


def test_a_rejections_residual_is_p_minus_q_where_p_exceeds_it():
    p = Sparse(np.array([2, 5, 9], np.intp), np.array([0.5, 0.3, 0.2]), 10)
    q = Sparse(np.array([2, 7, 12], np.intp), np.array([0.25, 0.5, 0.25]), 12)
    r = p.minus(q)
    assert list(r.ids) == [2, 5, 7, 9] and list(r.p) == [0.25, 0.3, 0.0, 0.2]


def test_a_confidence_known_to_be_under_the_floor_stops_early_and_stays_under_it(monkeypatch):
    """With `below`, a row whose top probability is under it (a flat row: the whole vocabulary near
    its top) answers some value under it, read from the first block or so, and one over it comes
    back exact: auto's buckets see no difference."""
    rng = np.random.default_rng(5)
    flat = rng.normal(0, 1, 151_936).astype(np.float32)
    peaked = rng.normal(0, 6, 151_936).astype(np.float32)
    peaked[123_456] = peaked.max() + 3.0  # a confident draft: about 0.9, its rivals far down the row
    for row, below in ((flat, 0.2), (flat, 1e-4), (peaked, 0.2)):
        token = int(row.argmax())
        exact = on_numpys_path(monkeypatch, top_probability, row, token)
        got = top_probability(row, token, below)
        if exact < below:
            assert exact <= got < below
        else:
            assert got == pytest.approx(exact, rel=1e-6)
    token = int(flat.argmax())
    assert top_probability(flat, token, 0.2) > 10 * top_probability(flat, token)  # it did stop early
    assert top_probability(peaked, 123_456, 0.2) > 0.8


def test_the_compiled_confidence_is_numpys_to_its_float32_exp(monkeypatch):
    """A greedy draft's confidence (the raw softmax's top probability), which auto only buckets:
    within 1e-6 of numpy's on rows with few values near the top, as a real model's, with many, and
    with one far above the rest but for a value at the window's edge, which counts; strided rows
    go to numpy's."""
    rng = np.random.default_rng(2)
    rows = [rng.normal(0, 6, 151_936), rng.normal(0, 2, 151_936), rng.normal(0, 1, 5000)]
    rows = [row.astype(np.float32) for row in rows]
    rows[2][[77, 78]] = 40.0, 20.0  # the top, and the only other value within 20 of it: at 20 exactly
    for row in rows + [rows[0][::2]]:
        token = int(row.argmax())
        got = top_probability(row, token)
        expected = on_numpys_path(monkeypatch, top_probability, row, token)
        assert got == pytest.approx(expected, rel=1e-6) and 0 < got <= 1
    assert top_probability(rows[2], 77) == pytest.approx(1 / (1 + np.exp(-20.0)), rel=1e-12)
    assert COMPILED.top_probability(rows[0][::2], 0, 20.0, 0.0) == -1.0
    with pytest.raises(IndexError):
        COMPILED.top_probability(rows[2], 5000, 20.0, 0.0)

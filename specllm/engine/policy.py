"""The `auto` drafting policy: what to draft each step, from measured costs and learned acceptance.

Pure decisions, like speculative.py: no llama_cpp, no clock. The engine times its own calls and
feeds them in (`CostTable.observe`), verification reports what the target kept (`Acceptance`), and
each step asks for the best plan. The rule (the README's "How auto decides"): for a source s and
draft length k the expected tokens per second of the next step are

    E_s(k) / (T_draft,s(k) + T_verify(k + 1)),    E_s(k) = 1 + sum_{i<=k} prod_{j<=i} a_s(j)

with a_s(j) the chance that draft token j is accepted once tokens 1..j-1 were. A plain target step
is E = 1 in T_verify(1). Drafting is chosen only when it beats that by MARGIN. Call widths that were
never measured cost as much as the next measured width (or, past the widest, half as much per token),
so V(n) is never guessed from a smooth curve: it is not smooth on a CPU.

Two safety nets on top of the estimates: a `Guard` compares what each source really delivered over
a window of its steps with the target-only rate and backs a losing source off until a re-probe
(gaps grow with each loss) or the next text; and a source that cannot pay even at an optimistic
acceptance is never tried.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

MARGIN = 0.10  # drafting must promise this much more than a plain target step
NGRAM_MAX = 64  # longest n-gram copy drafted in one step
NGRAM_MIN_BUDGET = 3  # an n-gram copy may always draft this many, however short its repeat
MODEL_MAX = 16  # longest draft-model proposal
EWMA = 0.2  # weight of a new timing in the running cost estimates
CLEARLY_BELOW = 0.75  # a wide call this far under the one-token estimate lowers it
DRIFT = 2.0  # a one-token call this many times slower or faster than when V was measured: V is stale
# A one-token call in a cost table read from disk takes between these (seconds): llama.cpp's
# fastest calls on the tiny test models take ~0.1 ms, and no model takes an hour a token.
STEP_SECONDS_RANGE = (1e-6, 3600.0)
GENERATION_WEIGHT = 4.0  # what earlier texts taught counts as this many observations of this one
TEXT_SHIFT_STEP = 0.05  # how far one judged draft token moves its text's logit shift
TEXT_SHIFT_MAX = 2.0  # a text is at most this far (in logits) from what earlier texts taught

# Buckets: a repeat of 20 tokens behaves like one of 17 more than like one of 2.
MATCH_EDGES = (1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64)  # n-gram repeat length
POSITION_EDGES = (1, 2, 3, 4, 5, 7, 9, 13, 17, 25, 33, 49)  # draft position (1-based)
CONFIDENCE_EDGES = (0.2, 0.4, 0.6, 0.8, 0.9, 0.95, 0.99)  # draft model's top probability


def bucket(value: float, edges: Sequence[float]) -> int:
    """Index of the last edge <= value (0 below the first)."""
    return max(0, bisect.bisect_right(edges, value) - 1)


# --- costs -------------------------------------------------------------------------------------


@dataclass
class CostTable:
    """One model's call costs: seconds of a one-token call, and V(n) = T(n) / T(1) for each call
    width n that was measured. Kept as ratios so that when the machine speeds up or slows down
    (T(1) drifts), every width drifts with it. `measured_at` is the one-token time when V was
    last measured (see drifted)."""

    step_seconds: float
    V: dict[int, float] = field(default_factory=dict)
    measured_at: float = 0.0  # 0: now

    def __post_init__(self):
        self.measured_at = self.measured_at or self.step_seconds

    def seconds(self, n: int) -> float:
        return self.step_seconds * self.ratio(n)

    def ratio(self, n: int) -> float:
        if n <= 1:
            return 1.0
        if n in self.V:
            return self.V[n]
        wider = [w for w in self.V if w > n]
        if wider:  # an unmeasured width costs as much as the next measured one: never less
            return self.V[min(wider)]
        # Past the widest measured width: each further token at half the widest's average cost
        # per token (V(32) = 11.6 and V(64) = 20.6 on a 2-core CPU where V(17) = 8.2 predicts
        # 11.9 and 19.6). Not the slope of the two widest: V(n) is bumpy (V(16) < V(15)), and one
        # steep pair once priced every wider call out, so long copies were never drafted and so
        # never measured. Optimistic on purpose: a wide call that is tried gets measured.
        widest = max(self.V, default=1)
        return self.ratio(widest) + (n - widest) * self.ratio(widest) / widest / 2

    def observe(self, n: int, seconds: float) -> None:
        """Fold in one timed call of width n. One observation moves an estimate by at most 2x
        (a call that waited for the CPU must not wreck the table), and V(n) stays within [1, n]."""
        if not (seconds > 0 and math.isfinite(seconds)):
            return
        if n > 1 and seconds < self.step_seconds * CLEARLY_BELOW:
            # A call on n tokens costs at least one on one token, so the one-token estimate is too
            # high (calibrated in a slow spell): only one-token calls lowered it, and auto, drafting
            # at every step because the target looked dear, made none, so it stayed for good. Only
            # clearly below: where a wide call costs about one step (a GPU), timing noise alone
            # puts half of them under the estimate, and taking those would bias it low.
            self.observe(1, seconds)
        if n <= 1:
            seconds = min(max(seconds, self.step_seconds / 2), self.step_seconds * 2)
            self.step_seconds += EWMA * (seconds - self.step_seconds)
            return
        ratio = _within_width(n, seconds / self.step_seconds)
        if n not in self.V:
            self.V[n] = ratio
        else:
            ratio = min(max(ratio, self.V[n] / 2), self.V[n] * 2)
            self.V[n] += EWMA * (ratio - self.V[n])

    def drifted(self) -> bool:
        """Has a one-token call become more than DRIFT times slower (or faster) than when V was
        measured? Then V no longer holds: other processes wanting the CPU (a build, a throttled
        laptop) add a delay to every call whatever its width, so a wide call costs relatively
        less, and the other way round when they stop. V(n) is only corrected by calls of width n,
        which a policy that drafts nothing never makes, so it has to be measured again."""
        return not 1 / DRIFT < self.step_seconds / self.measured_at < DRIFT

    @classmethod
    def from_ratios(cls, step_seconds: float, ratios: dict[int, float], measured_at: float = 0.0) -> CostTable:
        """A table of measured V(n), each held within [1, n] as `observe` holds them."""
        return cls(step_seconds, {n: _within_width(n, v) for n, v in ratios.items()}, measured_at)

    def to_dict(self) -> dict:
        return {
            "step_seconds": self.step_seconds,
            "V": {str(n): v for n, v in sorted(self.V.items())},
            "measured_at": self.measured_at,
        }

    @classmethod
    def from_dict(cls, d: dict) -> CostTable:
        """A table as to_dict wrote it; ValueError for one that cannot be (a damaged cache): a step
        that takes no time or a width below 2 would divide by zero, NaN would decide everything,
        and a step outside STEP_SECONDS_RANGE (1e300 s, 1e-300 s) would have auto draft always or
        never. A draft's costs are corrected only by the drafting they price, so a draft made to
        look dear was never drafted with again, its table written back as it was, run after run."""
        step = float(d["step_seconds"])
        V = {int(n): float(v) for n, v in d["V"].items()}
        measured_at = float(d.get("measured_at", step))  # a table written before it was kept
        low, high = STEP_SECONDS_RANGE
        if not all(low <= t <= high for t in (step, measured_at)) or any(  # (NaN is in no range)
            n < 2 or not math.isfinite(v) for n, v in V.items()
        ):
            raise ValueError(f"not a cost table: {d!r}")
        return cls.from_ratios(step, V, measured_at)


def _within_width(n: int, ratio: float) -> float:
    """A call on n tokens costs at least one call on one token and at most n of them."""
    return min(max(ratio, 1.0), float(n))


# --- acceptance --------------------------------------------------------------------------------


class Acceptance:
    """Beta-smoothed chance that a draft token is accepted once the tokens before it were, by
    (context bucket, draft position bucket). The prior is `prior(bucket)` with `weight`
    pseudo-observations, so a bucket never seen falls back on it.

    A `child` table serves one text: it starts from this one's estimates as its prior and passes
    every record up. Texts differ as a whole (an edit that returns a function copies much more
    than a chat reply, whatever the repeat length), so a child also learns one number for its
    text, a shift of all the parent's estimates on the logit scale, fitted online from every
    judged token (one gradient step of a logistic regression each). Its cells are sparse; the
    shift learns from all of them at once, so the first copies of a text that copies a lot
    already raise every estimate, and a text that does not copy lowers them."""

    def __init__(self, prior: Callable[[int], float], weight: float = 2.0, parent: Acceptance | None = None):
        self.prior, self.weight, self.parent = prior, weight, parent
        self.counts: dict[tuple[int, int], list[float]] = {}  # -> [accepted, judged]
        self.shift = 0.0  # this text's logit offset from the parent's estimates (a child's only)
        # rates() is asked the same rows step after step (auto weighs a model source twice a
        # step) while nothing is recorded: each row is kept with the versions it was computed at
        self.version = 0  # +1 with every record
        self._rows: dict[tuple[int, int], tuple[tuple[int, ...], tuple[float, ...]]] = {}

    def child(self, weight: float) -> Acceptance:
        return Acceptance(self.prior, weight, parent=self)

    def rate(self, context_bucket: int, position: int) -> float:
        accepted, judged = self.counts.get((context_bucket, bucket(position, POSITION_EDGES)), (0.0, 0.0))
        return (accepted + self.weight * self._prior_rate(context_bucket, position)) / (judged + self.weight)

    def _prior_rate(self, context_bucket: int, position: int) -> float:
        if self.parent is None:
            return self.prior(context_bucket)
        return _sigmoid(_logit(self.parent.rate(context_bucket, position)) + self.shift)

    def rates(self, context_bucket: int, k: int) -> tuple[float, ...]:
        versions = self._versions()
        kept = self._rows.get((context_bucket, k))
        if kept is not None and kept[0] == versions:
            return kept[1]
        row = tuple(self.rate(context_bucket, j) for j in range(1, k + 1))
        self._rows[(context_bucket, k)] = (versions, row)
        return row

    def _versions(self) -> tuple[int, ...]:
        """This table's version and every parent's: all that rate() reads changes with them."""
        return (self.version, *(self.parent._versions() if self.parent is not None else ()))

    def record(self, context_bucket: int, position: int, accepted: bool) -> None:
        self.version += 1
        if self.parent is not None:
            surprise = accepted - self._prior_rate(context_bucket, position)
            self.shift = min(max(self.shift + TEXT_SHIFT_STEP * surprise, -TEXT_SHIFT_MAX), TEXT_SHIFT_MAX)
            self.parent.record(context_bucket, position, accepted)
        c = self.counts.setdefault((context_bucket, bucket(position, POSITION_EDGES)), [0.0, 0.0])
        c[0] += accepted
        c[1] += 1


def _logit(p: float) -> float:
    p = min(max(p, 1e-4), 1 - 1e-4)
    return math.log(p / (1 - p))


def _sigmoid(x: float) -> float:
    return 1 / (1 + math.exp(-x))


def ngram_prior(match_bucket: int) -> float:
    """Before any evidence: a longer verbatim repeat is likelier to go on (m / (m + 4))."""
    m = MATCH_EDGES[match_bucket]
    return m / (m + 4)


def confidence_prior(confidence_bucket: int) -> float:
    """Before any evidence: a draft is as often right as it is confident (its bucket's lower edge)."""
    return CONFIDENCE_EDGES[confidence_bucket] if confidence_bucket else 0.1


def expected_tokens(rates: Sequence[float]) -> list[float]:
    """E(k) for k = 0..len(rates): 1 + sum_{i<=k} prod_{j<=i} a(j)."""
    out, alive, total = [1.0], 1.0, 1.0
    for a in rates:
        alive *= a
        total += alive
        out.append(total)
    return out


@dataclass(frozen=True)
class Choice:
    k: int  # draft length; 0 is a plain target step
    rate: float  # expected tokens per second


def replay_seconds(rates: Sequence[float], k: int, seconds: Callable[[int], float]) -> float:
    """Expected cost, for a target that cannot take rejected tokens back (a recurrent state with no
    snapshots), of evaluating the kept ones again after a rejection in a draft of k: a call on the
    a accepted tokens and the target's own, weighed by the chance that exactly a are accepted."""
    alive, total = 1.0, 0.0
    for a in range(k):
        total += alive * (1 - rates[a]) * seconds(a + 1)
        alive *= rates[a]
    return total


def best_length(rates: Sequence[float], step_seconds: Callable[[int], float]) -> Choice:
    """The draft length k (0..len(rates)) that maximises E(k) / step_seconds(k)."""
    best = Choice(0, 0.0)
    for k, e in enumerate(expected_tokens(rates)):
        rate = e / step_seconds(k)
        if rate > best.rate:
            best = Choice(k, rate)
    return best


# --- the guard ---------------------------------------------------------------------------------

GUARD_WINDOW = 12  # steps of a source before its real throughput is judged
GUARD_FIRST_GAP = 32  # steps a losing source sits out the first time; doubled on each loss
GUARD_MAX_GAP = 2048
GUARD_TOLERANCE = 0.03  # a source loses when it delivers less than 97% of the target-only rate


@dataclass
class _SourceRecord:
    tokens: int = 0
    seconds: float = 0.0
    steps: int = 0
    gap: int = GUARD_FIRST_GAP
    resume_at: int = 0  # step count at which a backed-off source may draft again


class Guard:
    """Judges each drafting source on what it delivered, not on what the estimates promised: over
    every GUARD_WINDOW steps of a source, tokens per second against the target-only rate. A loser
    sits out a gap of steps (re-probed after it; the gap doubles with each loss and resets on a
    win), so a source is backed off when it loses, and tried again later, never never or always."""

    def __init__(self):
        self.step = 0
        self.records: dict[str, _SourceRecord] = {}
        self.backoffs = 0

    def allowed(self, source: str) -> bool:
        record = self.records.get(source)
        return record is None or self.step >= record.resume_at

    def observe(self, source: str, tokens: int, seconds: float, target_only_rate: float) -> None:
        self.step += 1
        if source == "none":
            return
        r = self.records.setdefault(source, _SourceRecord())
        r.tokens, r.seconds, r.steps = r.tokens + tokens, r.seconds + seconds, r.steps + 1
        if r.steps < GUARD_WINDOW:
            return
        if r.tokens / r.seconds < target_only_rate * (1 - GUARD_TOLERANCE):
            r.resume_at = self.step + r.gap
            r.gap = min(2 * r.gap, GUARD_MAX_GAP)
            self.backoffs += 1
        else:
            r.gap = GUARD_FIRST_GAP
        r.tokens, r.seconds, r.steps = 0, 0.0, 0

    def new_text(self) -> None:
        """A new text is judged on its own: what a source lost on the last one (a reply whose
        copies broke) says little about this one (a function returned whole, where copies pay
        most), so a backed-off source may draft again at once, and no window spans two texts.
        The gaps keep their length: a source that loses again sits out longer."""
        for r in self.records.values():
            r.resume_at = min(r.resume_at, self.step)
            r.tokens, r.seconds, r.steps = 0, 0.0, 0


# --- scoring n-gram proposals after the fact ---------------------------------------------------


@dataclass
class _Pending:
    start: int  # context index of the first proposed token
    match_bucket: int
    tokens: list[int]
    judged: int = 0  # positions already recorded (all accepted so far)


class NgramScorer:
    """Scores every n-gram proposal against the text that was really generated, drafted or not, so
    the n-gram acceptance statistics grow on every step at no cost (HedgeSpec's idea). For a
    one-hot draft, "the output went on with token d" has the same chance as "d would have been
    accepted" (p(d) either way), so this is the acceptance estimate itself. Each position is
    recorded as soon as the output reaches it, so deep positions of long copies are learned while
    the copy goes on."""

    def __init__(self, acceptance: Acceptance):
        self.acceptance = acceptance
        self.pending: list[_Pending] = []

    def propose(self, start: int, match_bucket: int, tokens: list[int]) -> None:
        if tokens:
            self.pending.append(_Pending(start, match_bucket, list(tokens)))

    def resolve(self, context: Sequence[int], final: bool = False) -> None:
        """Record the positions the output has reached since the last call; a proposal is done at
        its first mismatch, at its end, or when the generation ends (final)."""
        still = []
        for p in self.pending:
            known = min(len(context) - p.start, len(p.tokens))
            while p.judged < known:
                ok = context[p.start + p.judged] == p.tokens[p.judged]
                p.judged += 1
                self.acceptance.record(p.match_bucket, p.judged, ok)
                if not ok:
                    break
            else:
                if p.judged < len(p.tokens) and not final:
                    still.append(p)
        self.pending = still


# --- the decision ------------------------------------------------------------------------------


# Sources that draft by running a model, each with its own call costs and learned acceptance: a
# separate draft model, and the target's own MTP ("nextn") layers.
MODEL_SOURCES = ("model", "mtp")


@dataclass(frozen=True)
class Plan:
    source: str  # "none", "ngram", "model" or "mtp"
    k: int  # draft length (for the model: at most; it may stop earlier)
    rate: float  # expected tokens per second
    baseline: float  # tokens per second of a plain target step


class AutoPolicy:
    """What the auto drafter knows and decides: costs, acceptance per source, the guard."""

    def __init__(self, target: CostTable, draft: CostTable | None = None, mtp: CostTable | None = None):
        self.target = target
        self.costs = {name: table for name, table in (("model", draft), ("mtp", mtp)) if table is not None}
        self.replays = False  # a rejection costs a second target call on the kept tokens (see replay_seconds)
        self._learn_from_scratch()

    @property
    def draft(self) -> CostTable | None:
        """The draft model's call costs."""
        return self.costs.get("model")

    @property
    def model(self) -> Acceptance:
        return self.by_confidence["model"]

    def forget_acceptance(self) -> None:
        """Back to the priors: forget what texts taught about acceptance, and the guard's
        verdicts. The measured costs stay."""
        self._learn_from_scratch()

    def _learn_from_scratch(self) -> None:
        # What all generations taught; each generation learns on top of it (start_generation).
        self.learned = {"ngram": Acceptance(ngram_prior)}
        for name in MODEL_SOURCES:
            self.learned[name] = Acceptance(confidence_prior)  # by the draft's confidence
            self.learned[name + "_marginal"] = Acceptance(lambda _: 0.7)  # by position only: before drafting
        self.guard = Guard()
        self.start_generation()

    def start_generation(self) -> None:
        """A new text: its own acceptance tables, starting from everything learned so far with
        the weight of GENERATION_WEIGHT observations."""
        self.ngram = self.learned["ngram"].child(GENERATION_WEIGHT)
        self.by_confidence = {name: self.learned[name].child(GENERATION_WEIGHT) for name in MODEL_SOURCES}
        self.marginal = {name: self.learned[name + "_marginal"].child(GENERATION_WEIGHT) for name in MODEL_SOURCES}
        self.scorer = NgramScorer(self.ngram)
        self.guard.new_text()

    @property
    def baseline(self) -> float:
        return 1.0 / self.target.seconds(1)

    def step_seconds(self, k: int, draft_seconds: float = 0.0) -> float:
        return draft_seconds + self.target.seconds(k + 1)

    # --- choosing a source and a length -----------------------------------------------------

    def ngram_choice(self, match_length: int, available: int) -> Choice:
        """The best copy length, at most as long as the repeat that is being continued
        (SuffixDecoding's budget): a copy that has just begun drafts a few tokens, one that has
        held for 30 tokens may draft 30, so a long draft is risked only where long copies hold."""
        k_max = min(available, NGRAM_MAX, max(match_length, NGRAM_MIN_BUDGET))
        rates = self.ngram.rates(bucket(match_length, MATCH_EDGES), k_max)
        return best_length(rates, lambda k: self.step_seconds(k) + self._replay(rates, k))

    def _replay(self, rates: Sequence[float], k: int) -> float:
        return replay_seconds(rates, k, self.target.seconds) if self.replays else 0.0

    def model_choice(self, cap: int, catch_up: int, source: str = "model") -> Choice:
        """Expected value of drafting with a model source (before seeing its confidence),
        including the catch-up call for the `catch_up` context tokens it has not evaluated yet."""
        rates = self.marginal[source].rates(0, min(cap, MODEL_MAX))
        return best_length(rates, lambda k: self._model_step_seconds(k, catch_up, source) + self._replay(rates, k))

    def _model_step_seconds(self, k: int, catch_up: int, source: str = "model") -> float:
        """A step drafting k tokens with a model source, then verifying them. The first draft
        call evaluates the tokens the draft has not seen (at least the last one); each further
        draft token costs one one-token call; the last token is never evaluated. k = 0 calls
        nothing."""
        if k == 0:
            return self.step_seconds(0)
        costs = self.costs[source]
        return self.step_seconds(k, costs.seconds(max(1, catch_up)) + (k - 1) * costs.seconds(1))

    def model_could_pay(self, source: str = "model") -> bool:
        """Could `choose` ever pick a model source, at the acceptance it expects of it and with
        the cheapest catch-up? If not, the source is not worth a call (nor a prefill) here. It
        asks no more optimistically than `choose` does: a source loaded and prefilled for a
        higher rate than `choose` prices it at was prefilled for nothing, every generation."""
        if source not in self.costs:
            return False
        choice = self.model_choice(MODEL_MAX, 1, source)
        return choice.k > 0 and choice.rate > self.baseline * (1 + MARGIN)

    def choose(
        self,
        ngram_match: int,
        ngram_available: int,
        model_ready: bool,
        cap: int,
        catch_up: int = 1,
        ready: dict[str, int] | None = None,
    ) -> Plan:
        """The plan for one step: n-gram copy (match of `ngram_match` tokens, `ngram_available`
        tokens to copy), a model source, or nothing. `ready` maps each model source that can
        draft now to its catch-up width; without it, the draft model when `model_ready`."""
        if ready is None:
            ready = {"model": catch_up} if model_ready else {}
        base = self.baseline
        plans = [Plan("none", 0, base, base)]
        if ngram_available and self.guard.allowed("ngram"):
            c = self.ngram_choice(ngram_match, min(ngram_available, cap))
            plans.append(Plan("ngram", c.k, c.rate, base))
        for source, width in ready.items():
            if source in self.costs and self.guard.allowed(source):
                c = self.model_choice(cap, width, source)
                plans.append(Plan(source, c.k, c.rate, base))
        best = max(plans, key=lambda p: p.rate)
        if best.k == 0 or best.rate < base * (1 + MARGIN):
            return plans[0]
        return best

    def model_keep_going(
        self, drafted: list[float], confidence: float, spent: float, cap: int, source: str = "model"
    ) -> bool:
        """While the draft model drafts: take one more token, whose draft confidence is
        `confidence`, after `drafted` (the acceptance estimates of the tokens taken so far) in
        `spent` seconds of drafting? Yes when the best expected rate of a step that includes it
        (looking further ahead with the positional rates) beats stopping here. This is where the
        drafter stops early once its confidence says the next token is likely rejected."""
        k = len(drafted)
        stop_rate = expected_tokens(drafted)[-1] / self.step_seconds(k, spent)
        a = self.by_confidence[source].rate(bucket(confidence, CONFIDENCE_EDGES), k + 1)
        future = self.marginal[source].rates(0, min(cap, MODEL_MAX))[k + 1 :]
        rates = [*drafted, a, *future]
        e = expected_tokens(rates)
        one_call = self.costs[source].seconds(1)
        for extra in range(0, len(future) + 1):
            n = k + 1 + extra
            if e[n] / self.step_seconds(n, spent + extra * one_call) > stop_rate:
                return True
        return False

    # --- learning ---------------------------------------------------------------------------

    def observe_verify(self, width: int, seconds: float) -> None:
        """A timed target call. When the machine speeds up or slows down (another process, a
        thermal limit), all models do: a model source's one-token time follows the target's drift,
        so a source that is not being used does not look cheaper (or dearer) than it is."""
        before = self.target.step_seconds
        self.target.observe(width, seconds)
        for costs in self.costs.values():
            costs.step_seconds *= self.target.step_seconds / before

    def record_model(self, confidences: Sequence[float], accepted: int, source: str = "model") -> None:
        """A model source proposed tokens with these confidences; the first `accepted` were
        accepted, and the one after them (if any) rejected. Later ones were never judged."""
        for j, conf in enumerate(confidences[: accepted + 1], start=1):
            ok = j <= accepted
            self.by_confidence[source].record(bucket(conf, CONFIDENCE_EDGES), j, ok)
            self.marginal[source].record(0, j, ok)

    def record_step(self, source: str, tokens: int, seconds: float) -> None:
        self.guard.observe(source, tokens, seconds, self.baseline)

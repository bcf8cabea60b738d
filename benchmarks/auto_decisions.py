"""What auto's decisions cost: the per-token stopping decisions during one draft-model proposal
(the StoppingRule, estimates looked up once per proposal, against looking them all up again for
every token, on the same proposals, with the same decisions), and each step's choice of a source.

    python benchmarks/auto_decisions.py [--proposals 300]

A policy with GPU-like costs (a draft step 0.3 of a target step, V(n) = 1 + 0.02 n) first learns
from 200 proposals; then each proposal offers up to 16 tokens with confidences like a good draft's,
and stops where the rule says.
"""

import argparse
import random
import statistics
import time

from specllm.engine.drafters import StoppingRule
from specllm.engine.policy import CONFIDENCE_EDGES, MODEL_MAX, AutoPolicy, CostTable, bucket


def every_time(policy: AutoPolicy):
    """keep_going looking every estimate up again for each token."""
    table = policy.by_confidence["model"]

    def keep_going(confidences: list[float], confidence: float, spent: float) -> bool:
        taken = [table.rate(bucket(c, CONFIDENCE_EDGES), j) for j, c in enumerate(confidences, 1)]
        return policy.model_keep_going(taken, confidence, spent, MODEL_MAX)

    return keep_going


def proposals(policy: AutoPolicy, make_rule, count: int) -> tuple[list[float], list[bool]]:
    rng, seconds, decisions = random.Random(0), [], []
    for _ in range(count):
        rule, confidences = make_rule(), []
        start = time.perf_counter()
        while len(confidences) < MODEL_MAX:
            c = 0.9 + 0.1 * rng.random() if rng.random() < 0.9 else rng.random()
            decisions.append(rule(confidences, c, 0.0015 * (len(confidences) + 1)))
            if not decisions[-1]:
                break
            confidences.append(c)
        seconds.append(time.perf_counter() - start)
    return seconds, decisions


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--proposals", type=int, default=300)
    args = ap.parse_args()
    policy = AutoPolicy(CostTable(0.005, {n: 1 + 0.02 * n for n in range(2, 18)}), CostTable(0.0015, {}))
    rng = random.Random(1)
    for _ in range(200):
        policy.record_model([rng.random() for _ in range(8)], rng.randrange(9))
    cached, cached_decisions = proposals(policy, lambda: StoppingRule(policy, "model"), args.proposals)
    fresh, fresh_decisions = proposals(policy, lambda: every_time(policy), args.proposals)
    tokens, same = sum(cached_decisions) / args.proposals, cached_decisions == fresh_decisions
    print(f"{args.proposals} proposals of {tokens:.1f} tokens on average; same decisions: {same}")
    for name, seconds in (("StoppingRule", cached), ("every token afresh", fresh)):
        print(f"  {name:20s} {1e6 * statistics.median(seconds):6.0f} us a proposal (median)")
    print("each step's decision, where nothing was learned since the last (median of 2000):")
    for name, decide in (
        ("could the model pay", lambda: policy.model_could_pay("model")),
        ("choose: a copy of 3 or the model", lambda: policy.choose(4, 3, False, MODEL_MAX, ready={"model": 1})),
    ):
        times = []
        for _ in range(2000):
            start = time.perf_counter()
            decide()
            times.append(time.perf_counter() - start)
        print(f"  {name:34s} {1e6 * statistics.median(times):6.1f} us")


if __name__ == "__main__":
    main()

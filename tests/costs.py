"""Cost tables and policies for the auto policy's tests: fixed costs, and a GPU-like machine."""

from specllm.engine.calibration import CostTable
from specllm.engine.policy import AutoPolicy


class FixedCosts(CostTable):
    """A cost table that does not learn from the (tiny, fast) models' timings, so that a test can
    put the policy on a machine of its choosing."""

    def observe(self, n, seconds):
        pass


def gpu_like_policy() -> AutoPolicy:
    """Verify calls cost about one call, the draft a tenth: both the model and n-gram copies pay."""
    target = FixedCosts(0.020, {n: 1.0 + 0.01 * n for n in (2, 3, 4, 5, 8, 12, 16, 17, 33, 65)})
    return AutoPolicy(target, FixedCosts(0.002, {n: 1.0 + 0.05 * n for n in (2, 3, 5, 9)}))

"""The speculative loop: the engine, the exact speculative rule, sampling, drafters, the auto
policy and its calibration. Never prints; Rich lives in the views above it."""

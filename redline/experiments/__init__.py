"""A/B experiments on live traffic: arms from the config, sticky assignment by user or
API key, per-arm latency and completion figures, and the tests that tell arms apart.

    assign   → which arm a request belongs to, and the overrides that arm applies
    stats    → confidence intervals and significance tests (scipy)
    record   → the per-arm samples, fed by an Observer on the pipeline
    service  → Experiments: the three together, and the JSON the admin API serves
"""

from redline.experiments.service import Experiments

__all__ = ["Experiments"]

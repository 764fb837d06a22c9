"""The difficulty classifier: features-only vs all-MiniLM-L6-v2 embeddings (+ the same
shape features), 5-fold cross-validated accuracy on the shipped labelled set, and the
time to classify one prompt. Usage:
flock /tmp/redline-cpu.lock .venv/bin/python bench/routing_classifier.py
"""

from __future__ import annotations

import json
import time

from redline.routing.classifier import (
    Classifier,
    EmbeddingFeatures,
    cross_validate,
    load_examples,
    text_features,
)


def per_call_ms(clf: Classifier, texts: list[str]) -> float:
    t0 = time.perf_counter()
    for t in texts:
        clf.classify(t)
    return (time.perf_counter() - t0) / len(texts) * 1000


def main() -> None:
    ex = load_examples()
    texts = [e.text for e in ex]
    out: dict[str, object] = {"examples": len(ex)}
    out["features"] = {**cross_validate(ex, text_features),
                       "ms_per_prompt": per_call_ms(Classifier(), texts)}
    emb = EmbeddingFeatures()
    out["embeddings"] = {**cross_validate(ex, emb),
                         "ms_per_prompt": per_call_ms(Classifier(emb), texts)}
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()

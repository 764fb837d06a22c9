"""How long will this answer be? Learned from the answers to similar requests.

"Similar" is a ladder of keys, most specific first; a prediction uses the first
rung that holds at least MIN_SAMPLES finished answers:

    (model, tier, max_tokens bucket, prompt-length bucket, lead words)
    (model, tier, max_tokens bucket, prompt-length bucket)
    (model, max_tokens bucket)
    (model,)

Buckets are powers of two (max_tokens 128-255 share one; prompts of 64-127
characters share one). "Lead words" are the first three words of the last user
message, lowercased: requests made from one template ("Summarise the following…",
"List five…") share them, and their answers have similar lengths.

Each rung keeps its last WINDOW output lengths. The prediction before the first
token is their median clipped to max_tokens (the median minimises the expected
absolute error). As tokens arrive, `Prediction.revise(n)` takes the median of the
lengths longer than n, the conditional median given that the answer has not ended
yet, from the most specific rung that still has MIN_LONGER such lengths (a specific
rung soon has only one or two answers longer than n, and one sample is a poor
median); past every length seen it assumes a quarter more. Per model it also keeps an
EWMA of the time per output token, for the countdown before the live rate is known.

The history lives in the process (it warms up from the traffic it serves).
"""

from __future__ import annotations

import bisect
import math
from collections import deque
from dataclasses import dataclass
from typing import TYPE_CHECKING

from redline.types import GenerationRequest

if TYPE_CHECKING:  # the pipeline is a higher layer; only its type is needed here
    from redline.types import Finished

WINDOW = 200
MIN_SAMPLES = 5
MIN_LONGER = 3  # answers longer than n a rung needs for revise(n) to use it
TPOT_ALPHA = 0.2
MAX_KEYS = 10_000  # rungs kept at most (oldest dropped): prompts must not grow memory


@dataclass(frozen=True)
class Prediction:
    max_tokens: int
    samples: tuple[int, ...]  # lengths of similar answers, clipped to max_tokens, sorted
    tpot_s: float | None  # the model's recent time per output token
    coarser: tuple[tuple[int, ...], ...] = ()  # the same from the broader rungs, in order

    @property
    def expected(self) -> int:
        """Expected output tokens before the first one; max_tokens without history."""
        if not self.samples:
            return self.max_tokens
        return max(1, min(self.max_tokens, round(_median(self.samples, 0))))

    def revise(self, n: int) -> int:
        """Expected output tokens, knowing that n came and the answer goes on."""
        if n >= self.max_tokens or not self.samples:
            return self.max_tokens
        # runs on every relayed token: the rungs are sorted, so the lengths longer than
        # n are a tail found by bisection, and its median is read off in place
        rung, lo = self.samples, bisect.bisect_right(self.samples, n)
        if len(rung) - lo < MIN_LONGER:
            for coarser in self.coarser:
                at = bisect.bisect_right(coarser, n)
                if len(coarser) - at >= MIN_LONGER:
                    rung, lo = coarser, at
                    break
            # else no rung has enough: the most specific one says
        guess = _median(rung, lo) if lo < len(rung) else math.ceil(n * 1.25)
        return int(min(self.max_tokens, max(n + 1, round(guess))))


def _median(ordered: tuple[int, ...], lo: int) -> float:
    """The median of ordered[lo:], which is sorted and not empty."""
    k = len(ordered) - lo
    mid = lo + k // 2
    return ordered[mid] if k % 2 else (ordered[mid - 1] + ordered[mid]) / 2


def prompt_text(request: GenerationRequest) -> str:
    if request.messages is not None:
        return "\n".join(m.content for m in request.messages)
    return request.prompt or ""


def lead_words(request: GenerationRequest) -> str:
    if request.messages:
        users = [m.content for m in request.messages if m.role == "user"]
        text = users[-1] if users else request.messages[-1].content
    else:
        text = request.prompt or ""
    return " ".join(text.lower().split()[:3])


def _keys(model: str, tier: str, request: GenerationRequest) -> list[tuple[object, ...]]:
    mt = request.sampling.max_tokens.bit_length()
    pl = len(prompt_text(request)).bit_length()
    return [(model, tier, mt, pl, lead_words(request)), (model, tier, mt, pl), (model, mt), (model,)]


class LengthHistory:
    """An `Observer` of the pipeline: it learns from every finished completion."""

    def __init__(self) -> None:
        # per rung: the last WINDOW lengths in arrival order, and the same kept sorted
        # (predict runs on every request: no sort there, a copy and a bisect)
        self._lengths: dict[tuple[object, ...], tuple[deque[int], list[int]]] = {}
        self._tpot: dict[str, float] = {}

    def predict(self, request: GenerationRequest, model: str, tier: str) -> Prediction:
        max_tokens = request.sampling.max_tokens
        rungs = []
        for key in _keys(model, tier, request):
            seen = self._lengths.get(key)
            if seen is not None and len(seen[1]) >= MIN_SAMPLES:
                ordered = seen[1]
                if ordered[-1] <= max_tokens:  # the usual case: one copy
                    rungs.append(tuple(ordered))
                    continue
                cut = bisect.bisect_right(ordered, max_tokens)  # longer ones clip to max_tokens
                rungs.append(tuple(ordered[:cut]) + (max_tokens,) * (len(ordered) - cut))
        if not rungs:
            return Prediction(max_tokens, (), self._tpot.get(model))
        return Prediction(max_tokens, rungs[0], self._tpot.get(model), tuple(rungs[1:]))

    def record(self, request: GenerationRequest, model: str, tier: str, output_tokens: int,
               tpot_s: float | None = None) -> None:
        for key in _keys(model, tier, request):
            seen = self._lengths.pop(key, None) or (deque(), [])
            arrived, ordered = seen
            if len(arrived) >= WINDOW:
                del ordered[bisect.bisect_left(ordered, arrived.popleft())]
            arrived.append(output_tokens)
            bisect.insort(ordered, output_tokens)
            self._lengths[key] = seen  # re-inserted: dict order is least recently used first
        while len(self._lengths) > MAX_KEYS:
            del self._lengths[next(iter(self._lengths))]
        if tpot_s is not None and tpot_s > 0:
            old = self._tpot.get(model)
            self._tpot[model] = tpot_s if old is None else old + TPOT_ALPHA * (tpot_s - old)

    def on_finish(self, completion: Finished) -> None:
        if completion.status != "200" or completion.finish_reason not in ("stop", "length"):
            return
        tokens = completion.output_tokens
        tpot = None
        total = completion.total_s
        if completion.cache == "miss" and tokens > 1 and total and completion.ttft_s is not None:
            tpot = (total - completion.ttft_s) / (tokens - 1)
        self.record(completion.request, completion.model, completion.tier, tokens, tpot)

"""The sampling-engine interface every engine implements (utils/agent/engines.py: vllm and hf;
utils/agent/served.py: openai): what a request asks for (`SamplingSpec`), what comes back
(`Sample`), per-request seeds, and `BatchedCalls`, the submit/poll queue over a batch `generate`.
"""
from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol


@dataclass
class Sample:
    token_ids: list[int]
    text: str
    logprobs: list[float] | None  # None when the request did not ask for them (SamplingSpec.logprobs)
    finish_reason: str  # "stop" | "length"


@dataclass
class SamplingSpec:
    max_tokens: int
    temperature: float = 1.0
    top_p: float = 1.0
    stop: list[str] = field(default_factory=list)
    n: int = 1
    logprobs: bool = True  # the sampled tokens' log-probs; an engine may skip them when False


def derive_seed(*parts: int | str) -> int:
    """A 31-bit seed from (seed, step, index, ...): per-sample randomness without hidden state."""
    digest = hashlib.sha256("/".join(map(str, parts)).encode()).digest()
    return int.from_bytes(digest[:4], "big") & 0x7FFFFFFF


class Engine(Protocol):
    name: str

    def generate(self, prompts: list[list[int]], spec: SamplingSpec, seeds: list[int]) -> list[list[Sample]]:
        """`spec.n` samples for each prompt; `seeds[i]` seeds prompt i."""

    def submit(self, key, prompt: list[int], spec: SamplingSpec, seed: int) -> None:
        """Queue one request (spec.n must be 1); its result comes back from `poll` under `key`."""

    def poll(self) -> list[tuple[object, Sample]]:
        """Run queued requests until at least one finishes; (key, sample) of each finished one,
        [] when nothing is queued. Results may come back in any order."""

    def set_adapter(self, path: Path | None) -> None:
        """Make the LoRA adapter at `path` (None: the bare base) the current policy."""

    def close(self) -> None: ...


def truncate_at_stop(tokenizer, ids: list[int], stops: list[str], eos_id: int | None) -> tuple[int, str, str]:
    """(kept length, text, finish reason): cut right after the first stop string or at EOS."""
    for k, tok in enumerate(ids):
        if eos_id is not None and tok == eos_id:
            return k + 1, tokenizer.decode(ids[:k], skip_special_tokens=True), "stop"
    text = tokenizer.decode(ids, skip_special_tokens=True)
    hits = [(text.find(s), s) for s in stops if s and s in text]
    if not hits:
        return len(ids), text, "length"
    end = min(pos + len(s) for pos, s in hits)
    # smallest token prefix whose text covers the stop string
    lo, hi = 1, len(ids)
    while lo < hi:
        mid = (lo + hi) // 2
        if len(tokenizer.decode(ids[:mid], skip_special_tokens=True)) >= end:
            hi = mid
        else:
            lo = mid + 1
    return lo, tokenizer.decode(ids[:lo], skip_special_tokens=True), "stop"


class BatchedCalls:
    """`submit`/`poll` over an engine's `generate`: each poll runs everything queued, one generate
    call per distinct spec (smallest token budget first), seeded by its first request's seed. So a
    rollout on such an engine advances turn by turn, all episodes together."""

    _queue: list[tuple]

    def submit(self, key, prompt: list[int], spec: SamplingSpec, seed: int) -> None:
        self._queue.append((key, prompt, spec, seed))

    def poll(self) -> list[tuple[object, Sample]]:
        queue, self._queue = self._queue, []
        groups: dict[tuple, list] = {}
        for item in queue:
            spec = item[2]
            groups.setdefault((spec.max_tokens, spec.temperature, spec.top_p, tuple(spec.stop)), []).append(item)
        done = []
        for k in sorted(groups, key=lambda k: k[0]):
            items = groups[k]
            results = self.generate([p for _, p, _, _ in items], items[0][2], [s for _, _, _, s in items])
            done += [(key, r[0]) for (key, _, _, _), r in zip(items, results)]
        return done

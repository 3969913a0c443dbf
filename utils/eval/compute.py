"""What each trained arm spent: optimizer steps and trained tokens, its warmup's included (08's
"Compute" section), so that arms said to be matched in compute can be checked seed by seed.

- An arm that starts from its run's SFT warmup (algorithm.rl.init `warmup`) owes it every step 04
  ran: its manifest's `steps`, fewer than configured where validation stopped it early
  (`stopped_early`), and more than `best_step`, the checkpoint the arm starts from. An arm from the
  bare base (`joint`) owes nothing.
- Its own steps are the sum of its log's `train/optimizer_steps` (every PPO pass and mini-batch,
  ReLIFT's own SFT steps, no skipped step: utils/train/grpo_trainer.py `COUNTS`). A log written
  before that column is counted from its config ("config" in the table): `ppo_epochs ×
  ppo_minibatches` per RL step that was not skipped (one per step of method `sft`), plus ReLIFT's
  `relift/sft_step`s that were not skipped; a step skipped in a later pass is then over-counted.
- Tokens are trained (loss-bearing) target tokens, each pass counted: 04's manifest `trained_tokens`,
  the log's `train/tokens_rl` (rollout and expert tokens) and `train/tokens_sft` (the SFT term's
  and ReLIFT's demonstrations). Records from before these were logged show none, never an estimate.
"""
from __future__ import annotations

import pandas as pd

from utils.core.manifest import MANIFEST_NAME, read_manifest
from utils.eval.compare import Training, fmt
from utils.eval.frames import markdown

COLUMNS = ["run", "seed", "method", "04 steps", "starts at", "own steps", "counted", "total steps",
           "04 tokens", "RL tokens", "SFT tokens", "total tokens"]


def _warmup(t: Training) -> dict:
    """04's metrics for the arm's start: {} where its run has no 04 manifest, zeros from the base."""
    config = t.manifest.get("config", {})
    if config.get("algorithm", {}).get("rl", {}).get("init") == "base":
        return {"steps": 0, "best_step": 0, "trained_tokens": 0}
    folder = t.directory.parent.parent / "04_sft_warmup"
    return read_manifest(folder).get("metrics", {}) if (folder / MANIFEST_NAME).is_file() else {}


def _own_steps(t: Training) -> tuple[int, str]:
    """(the arm's optimizer steps, "logged" or "config")."""
    if t.history and all("train/optimizer_steps" in h for h in t.history):
        return int(sum(h["train/optimizer_steps"] for h in t.history)), "logged"
    rl = t.manifest.get("config", {}).get("algorithm", {}).get("rl", {})
    per = rl.get("ppo_epochs", 1) * rl.get("ppo_minibatches", 1) if rl.get("enabled", True) else 1
    steps = sum(per for h in t.history if not h.get("train/skipped_nonfinite"))
    steps += sum(1 for h in t.history if h.get("relift/sft_step") and not h.get("relift/sft_skipped"))
    return int(steps), "config"


def _logged_sum(t: Training, key: str) -> int | None:
    """The log's sum of `key`, None if any step lacks it (a log from before it was written)."""
    if not t.history or any(key not in h for h in t.history):
        return None
    return int(round(sum(h[key] for h in t.history)))


def compute(found: list[Training], warmups: list[dict] | None = None) -> pd.DataFrame:
    """One row per trained arm, in COLUMNS; a count its records lack is None. `warmups`: each arm's
    `_warmup`, if the caller has read them."""
    rows = []
    for t, warmup in zip(found, warmups or [_warmup(t) for t in found]):
        own, counted = _own_steps(t)
        before = warmup.get("steps")
        rl_tokens, sft_tokens = _logged_sum(t, "train/tokens_rl"), _logged_sum(t, "train/tokens_sft")
        parts = [warmup.get("trained_tokens"), rl_tokens, sft_tokens]
        rows.append([t.run, t.seed, t.method, before, warmup.get("best_step"), own, counted,
                     None if before is None else before + own, *parts,
                     None if None in parts else sum(parts)])
    return pd.DataFrame(rows, columns=COLUMNS, dtype=object)


def compute_section(found: list[Training]) -> list[str]:
    """08's "Compute" section: the table, and which arms' warmups stopped early."""
    if not found:
        return []
    warmups = [_warmup(t) for t in found]  # each 04 manifest read once
    df = compute(found, warmups)
    early = sorted({t.run + (f" seed {t.seed}" if t.seed is not None else "") for t, w in zip(found, warmups)
                    if w.get("stopped_early")})
    lines = ["## Compute", "",
             "Optimizer steps and trained tokens per arm, its warmup's included: `04 steps` is every step 04 "
             "ran, `starts at` the checkpoint the arm starts from (its best on val), `counted` whether the "
             "arm's own steps were logged or counted from its config (utils/eval/compute.py). A blank: not in "
             "these records (shown —).", "", markdown(df, {"seed": fmt}), ""]
    if early:
        lines += [f"Warmups stopped early by validation, so their arms trained fewer steps than configured: "
                  f"{', '.join(early)}.", ""]
    return lines

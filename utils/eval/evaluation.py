"""Greedy evaluation of the full Planner/Executor agent: rollouts on rows, scored by the reward spec.

`greedy_eval` is what 07 runs on the test split and what the SFT warmup's `Validator` runs on val.

What 07 reports beside greedy accuracy (its percentile bootstrap CI over test items):
- with `eval.samples: k`, k episodes per item at the rollout temperature (`algorithm.rl.temperature`,
  the distribution RL optimises): `mean@k` (each item's mean answer score, averaged over items) and
  `pass@k` (items with a fully correct sample; `passk.py`'s estimator at k = 1, 2, 4, ...), each item's
  `sampled_correct` of `sampled_n` in predictions.jsonl. `eval.primary: mean_at_k` makes 08's paired
  tests run on the per-item mean, a continuous score with more power than greedy's 0/1; it is fixed
  before a study, and 08 refuses evaluations that declare different primaries;
- with `eval.curve_samples: n`, a second pass of n samples an item, seeded apart from mean@k's, so
  mean@k and every verdict on it stay as they are (`curve_correct` of `curve_n`, `pass_at_k_curve`);
- each greedy episode's outcome (`failure_category`): correct, wrong_answer, stopped_early (the gold
  chain's next-to-last result: the imperfect teacher's flaw), no_answer, malformed, hit_max_turns,
  executor_error, which 08 tabulates per checkpoint, so a report shows what a gain removed.
"""
from __future__ import annotations

from collections import Counter
from dataclasses import replace
from pathlib import Path

from utils.agent.prompts import actor_critic_for
from utils.agent.protocol import EXECUTOR, PLANNER, THINK, extract_tag, split_actor_critic
from utils.agent.rollout import Codec, Rollout, RolloutSpec
from utils.core.checkpoint import save_weights
from utils.core.files import atomic_write_json
from utils.core.schema import RunConfig
from utils.reward.spec import RewardSpec, score_episodes
from utils.eval.passk import curve, k_grid
from utils.eval.stats import bootstrap_ci
from utils.reward.scorers import is_correct


def summarize_scores(scored: list[dict]) -> dict:
    n = max(len(scored), 1)
    mean = lambda k: round(sum(s[k] for s in scored) / n, 6)  # noqa: E731
    return {"n": len(scored), "accuracy": mean("answer"), "format": mean("format"), "reward": mean("reward"),
            "answered": round(sum(s["status"] == "answered" for s in scored) / n, 6),
            "turns": mean("turns"), "subtasks": mean("subtasks"), "independence": mean("independence"),
            "tokens_planner": mean("tokens_planner"), "tokens_executor": mean("tokens_executor"),
            "status": dict(sorted(Counter(s["status"] for s in scored).items()))}


def greedy_eval(engine, codec: Codec, rows: list[dict], spec: RewardSpec, rollout: RolloutSpec,
                retriever=None) -> tuple[dict, list[dict]]:
    """(summary metrics, per-episode records) of greedy rollouts on `rows`; with a retriever (the
    search tool), also the search metrics (`search_metrics`)."""
    greedy = replace(rollout, temperature=0.0, logprobs=False)  # nothing here reads sampler log-probs
    episodes = Rollout(engine, codec, greedy, retriever).run(rows, n=1, seed=0)
    scored = score_episodes(episodes, spec)
    summary = summarize_scores(scored)
    if retriever is not None:
        summary.update(search_metrics(rows, episodes, scored))
    roles = tuple(r for r in (PLANNER, EXECUTOR) if actor_critic_for(codec.templates, r))
    if roles:
        summary.update(actor_critic_metrics(episodes, roles))
    by_length = accuracy_by_gold_subtasks(rows, scored)
    if by_length:
        summary["accuracy_by_gold_subtasks"] = by_length
    return summary, scored


def sampled_eval(engine, codec: Codec, rows: list[dict], spec: RewardSpec, rollout: RolloutSpec, k: int, seed: int,
                 retriever=None) -> tuple[dict, dict[str, list[float]]]:
    """k sampled episodes per row at `rollout`'s temperature: ({"mean@k", "pass@k"}, {qid: the k
    samples' answer scores}). mean@k is the mean over items of each item's mean answer score, the
    sampled policy's accuracy (with a 0/1 scorer, the share of correct samples); pass@k counts an
    item whose samples include a fully correct one."""
    scored = score_episodes(Rollout(engine, codec, replace(rollout, logprobs=False), retriever).run(rows, n=k, seed=seed),
                            spec)
    per_item: dict[str, list[float]] = {}
    for s in scored:
        per_item.setdefault(s["qid"], []).append(s["answer"])
    means = [sum(v) / len(v) for v in per_item.values()]
    return {f"mean@{k}": round(sum(means) / max(len(means), 1), 6), f"pass@{k}": pass_at_k(scored)}, per_item


CURVE_EPISODES = 4096  # episodes of the curve pass in flight at once (rows are rolled out in chunks of this many)


def curve_eval(engine, codec: Codec, rows: list[dict], spec: RewardSpec, rollout: RolloutSpec, n: int, seed: int,
               retriever=None) -> dict[str, tuple[int, int]]:
    """n sampled episodes per row for the pass@k curve: {qid: (fully correct samples, n)}. Seeded as
    step 1 of `seed` (mean@k's samples are step 0), each episode by its index among all rows', so
    the chunking leaves every sample as it would be in one batch."""
    rollout_ = Rollout(engine, codec, replace(rollout, logprobs=False), retriever)
    per = max(1, CURVE_EPISODES // n)
    counts: dict[str, tuple[int, int]] = {}
    for start in range(0, len(rows), per):
        for s in score_episodes(rollout_.run(rows[start:start + per], n=n, seed=seed, step=1, first=start * n), spec):
            c, m = counts.get(s["qid"], (0, 0))
            counts[s["qid"]] = (c + is_correct(s["answer"]), m + 1)
    return counts


def fold_sampled(cfg, metrics: dict, scored: list[dict], result: tuple[dict, dict]) -> None:
    """Fold sampled_eval's figures into 07's metrics.json and its per-item scores into the records."""
    summary, per_item = result
    for r in scored:
        r["sampled"] = per_item.get(r["qid"], [])
        r["mean_at_k"] = round(sum(r["sampled"]) / len(r["sampled"]), 6) if r["sampled"] else 0.0
        r["sampled_correct"], r["sampled_n"] = sum(map(is_correct, r["sampled"])), len(r["sampled"])
    metrics.update(summary, samples=cfg.eval.samples, sample_temperature=cfg.algorithm.rl.temperature,
                   mean_at_k_ci95=bootstrap_ci([r["mean_at_k"] for r in scored], seed=cfg.seed),
                   pass_at_k=curve(((r["sampled_correct"], r["sampled_n"]) for r in scored), k_grid(cfg.eval.samples)))


def fold_curve(cfg, metrics: dict, scored: list[dict], counts: dict[str, tuple[int, int]]) -> None:
    """Fold curve_eval's counts into 07's metrics.json (pass@k at k = 1, 2, 4, ... n) and each record (its c and n)."""
    for r in scored:
        r["curve_correct"], r["curve_n"] = counts[r["qid"]]
    metrics.update(curve_samples=cfg.eval.curve_samples, pass_at_k_curve=curve(
        counts.values(), k_grid(cfg.eval.curve_samples)))


def search_metrics(rows: list[dict], episodes, scored: list[dict]) -> dict:
    """Searches per subtask, and for rows that name their gold facts (meta.facts): the retrieval hit
    rate (every gold fact was among some search's top-k passages) and accuracy split by hit. Each
    record gains `searches` and `retrieval_hit` (None for a row without gold facts)."""
    facts = {r["id"]: set(r.get("meta", {}).get("facts") or ()) for r in rows}
    split: dict[bool, list[float]] = {True: [], False: []}
    for ep, rec in zip(episodes, scored):
        found = {d for s in ep.searches for d in s["docs"]}
        gold = facts.get(ep.qid)
        rec["searches"], rec["retrieval_hit"] = len(ep.searches), (gold <= found) if gold else None
        if gold:
            split[gold <= found].append(rec["answer"])
    subtasks = sum(r["subtasks"] for r in scored)
    out = {"searches_per_subtask": round(sum(r["searches"] for r in scored) / max(subtasks, 1), 6)}
    judged = len(split[True]) + len(split[False])
    if judged:
        out["retrieval_hit_rate"] = round(len(split[True]) / judged, 6)
        for hit, name in ((True, "accuracy_hit"), (False, "accuracy_miss")):
            out[name] = round(sum(split[hit]) / len(split[hit]), 6) if split[hit] else None
    return out


def actor_critic_metrics(episodes, roles: tuple[str, ...] = (PLANNER, EXECUTOR)) -> dict:
    """With thinking: actor_critic, the share of the generated segments of `roles` (the ones that
    think that way), per role and in all, whose <think> follows the mode (`split_actor_critic`),
    and the share of those where the critic's check ends in "no" (the actor's attempt was flagged)."""
    followed: dict[str, list[bool]] = {role: [] for role in roles}
    flagged = []
    for ep in episodes:
        for seg in ep.segments:
            if seg.role not in followed:
                continue
            parts = split_actor_critic(extract_tag(seg.text, THINK))
            followed[seg.role].append(parts is not None)
            if parts:
                flagged.append(parts[1].split()[-1] == "no")
    share = lambda xs: round(sum(xs) / len(xs), 6) if xs else None  # noqa: E731
    out = {"actor_critic_rate": share([x for xs in followed.values() for x in xs])}
    out.update({f"actor_critic_rate_{role}": share(xs) for role, xs in followed.items()})
    out["critic_flag_rate"] = share(flagged)
    return out


def accuracy_by_gold_subtasks(rows: list[dict], scored: list[dict]) -> dict[str, float]:
    """Accuracy per gold decomposition length ({"2": 0.9, "3": 0.1}), for rows that carry one
    (meta.steps); separates recall of demonstrated lengths from extension to longer chains."""
    length = gold_subtask_counts(rows)
    groups: dict[int, list[float]] = {}
    for s in scored:
        if s["qid"] in length:
            groups.setdefault(length[s["qid"]], []).append(s["answer"])
    return {str(k): round(sum(v) / len(v), 6) for k, v in sorted(groups.items())}


def gold_steps(rows: list[dict]) -> dict[str, list[dict]]:
    """Row id -> its gold decomposition (meta.steps), for rows that carry one."""
    return {r["id"]: r["meta"]["steps"] for r in rows if (r.get("meta") or {}).get("steps")}


def gold_subtask_counts(rows: list[dict]) -> dict[str, int]:
    """Row id -> length of its gold decomposition (meta.steps), for rows that carry one."""
    return {qid: len(steps) for qid, steps in gold_steps(rows).items()}


def failure_category(record: dict, steps: list[dict] | None = None) -> str:
    """correct | wrong_answer | stopped_early | no_answer | malformed | hit_max_turns | executor_error.

    `steps` is the item's gold decomposition (its row's meta.steps), where it has one. A wrong answer
    equal to the result of the gold chain's next-to-last step is `stopped_early`: the planner answered
    one subtask before the end, the imperfect teacher's flaw (traces.flaw_rate). A wrong chain that
    happens to reach that number lands there too."""
    status = record["status"]
    if status == "answered":
        prediction = (record.get("prediction") or "").strip()
        if not prediction:
            return "no_answer"
        if is_correct(record["answer"]):
            return "correct"
        before_last = steps[-2] if steps and len(steps) >= 2 and isinstance(steps[-2], dict) else {}
        return "stopped_early" if str(before_last.get("result", "")).strip() == prediction else "wrong_answer"
    return {"max_turns": "hit_max_turns"}.get(status, status)


def pass_at_k(scored: list[dict]) -> float:
    """Share of questions with at least one fully correct sample among their scored episodes (an
    F1 of 0.5 is no hit)."""
    hit: dict = {}
    for r in scored:
        hit[r["qid"]] = max(hit.get(r["qid"], 0.0), float(is_correct(r["answer"])))
    return round(sum(hit.values()) / max(len(hit), 1), 6)


class Validator:
    """Serves the current weights on the rollout engine and scores greedy episodes on val rows; each
    call writes valid_samples/step_N.json under `out` and returns the summary metrics."""

    def __init__(self, cfg: RunConfig, base: Path, rows: list[dict], spec: RewardSpec, codec: Codec, out: Path,
                 retriever=None):
        self.cfg, self.base, self.rows, self.spec, self.codec, self.out = cfg, base, rows, spec, codec, out
        self.engine, self.retriever = None, retriever

    def __call__(self, model, weights_dir: Path, step: int) -> dict:
        from tqdm import tqdm

        from utils.agent.engines import make_engine

        save_weights(model, weights_dir)
        if self.cfg.model.lora.full_finetune:  # full weights: a fresh HF engine on the saved model
            engine = make_engine("hf", weights_dir, self.cfg.model.engine,
                                 trust_remote_code=self.cfg.model.trust_remote_code)
        else:
            if self.engine is None:
                self.engine = make_engine(self.cfg.model.engine.name, self.base, self.cfg.model.engine, self.cfg.seed,
                                          self.cfg.model.trust_remote_code)
            engine = self.engine
            engine.set_adapter(weights_dir)
        metrics, samples = greedy_eval(engine, self.codec, self.rows, self.spec, RolloutSpec.from_config(self.cfg, 0.0),
                                       self.retriever)
        atomic_write_json(self.out / "valid_samples" / f"step_{step}.json", {"step": step, "metrics": metrics,
                                                                            "samples": samples})
        by_length = " ".join(f"{k}:{v:.2f}" for k, v in metrics.get("accuracy_by_gold_subtasks", {}).items())
        tqdm.write(f"step {step}: val accuracy {metrics['accuracy']:.3f} format {metrics['format']:.3f} "
                   f"reward {metrics['reward']:.3f}" + (f" by gold subtasks {by_length}" if by_length else ""))
        return metrics

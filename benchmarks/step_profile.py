"""Where one RL step's time goes, on a run's own inputs, as ratios taken in the same process.

    .venv/bin/python benchmarks/step_profile.py [--run outputs/run_001] [--algorithm red] [--steps 3]

Builds the trainer exactly as 05 does (utils/train/rl_stage.build_trainer) from the run's SFT
warmup adapter, traces, train split and reward spec, runs one untimed warm-up step and `--steps`
timed ones (writing only under a temporary directory), then replays the last step's questions on
the policy it ended with:
- the agent rollout on vLLM, on HF generate, and one raw vLLM call that generates the same number
  of tokens (one request per episode, no stop strings, EOS ignored; the sampler's log-probs if the
  last step asked for them, algorithm.rl.mismatch_every);
- the trainer's update against a bare forward+backward over the same sequences (the last RL batch
  and an SFT batch, once per optimizer pass as the trainer runs them; no loss terms, no
  optimizer) in the trainer's own length-chunked passes (P3), and in one pass padded to the widest
  (what the update cost before chunking);
- a greedy evaluation of `--eval_items` test questions on the running engine (07's workload;
  timing only, nothing is chosen on it).
Above the last line: per-phase seconds and shares. The last line:

    P1=<agent rollout tok/s / raw single-call tok/s> P2=<vLLM / HF agent tok/s>
    P3=<update tok/s / bare fwd+bwd tok/s, same passes> sync_share=<weight sync / step>

Every figure is a ratio of two timings from this one run, since the box is shared and noisy. Each
rollout replay starts from an empty vLLM prefix cache, as a training step's does after its weight
sync (before 2026-11-29 the replays found the last step's prompts cached, which raised P1).
docs/PERFORMANCE.md quotes it. Not a test.
"""
import argparse
import math
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from utils.agent.engines import empty_prefix_cache, make_engine  # noqa: E402
from utils.agent.rollout import Rollout, RolloutSpec  # noqa: E402
from utils.core.config import ROOT  # noqa: E402
from utils.core.io import read_records  # noqa: E402
from utils.core.methods import METHODS  # noqa: E402
from utils.core.stages import model_dir, recorded_config  # noqa: E402
from utils.core.tracking import MetricsLogger  # noqa: E402
from utils.eval.evaluation import greedy_eval  # noqa: E402
from utils.train.batch import build_rl_batch  # noqa: E402
from utils.train.policy import length_chunks, sft_batch  # noqa: E402
from utils.train.rl_stage import build_trainer  # noqa: E402

PHASES = ("rollout", "scoring", "logprobs", "update", "weight_sync")


def timed(fn):
    t0 = time.perf_counter()
    out = fn()
    return out, time.perf_counter() - t0


def raw_single_call(engine, prompts: list[list[int]], tokens_each: int, seed: int, logprobs: bool) -> tuple[int, float]:
    """(tokens, seconds) of one vLLM generate call: every prompt decodes exactly `tokens_each` tokens,
    with the sampled tokens' log-probs when the replayed rollout asked for them."""
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt

    params = SamplingParams(max_tokens=tokens_each, min_tokens=tokens_each, ignore_eos=True, temperature=1.0,
                            seed=seed, logprobs=0 if logprobs else None, flat_logprobs=True)
    outs, dt = timed(lambda: engine.llm.generate([TokensPrompt(prompt_token_ids=p) for p in prompts], params,
                                                 lora_request=engine.lora, use_tqdm=False))
    return sum(len(o.outputs[0].token_ids) for o in outs), dt


def bare_update(model, batches, chunked: bool) -> float:
    """Seconds of forward + backward of sum(logits) over the padded batches, each in one pass or in
    the trainer's length_chunks passes: the compute floor the update pays, without its loss terms,
    optimizer and bookkeeping."""
    model.train()
    passes = []
    for ids, attn in batches:
        lengths = attn.sum(dim=1)
        runs = length_chunks(lengths.tolist()) if chunked else [list(range(len(ids)))]
        for run in runs:
            w = int(lengths[run].max())
            passes.append((ids[run, :w] if chunked else ids, attn[run, :w] if chunked else attn))
    t0 = time.perf_counter()
    for ids, attn in passes:
        model.zero_grad(set_to_none=True)
        model(input_ids=ids, attention_mask=attn).logits.sum().backward()
    dt = time.perf_counter() - t0
    model.zero_grad(set_to_none=True)
    return dt


def profile_steps(trainer, steps: int) -> list[dict]:
    """One untimed warm-up step (first-call costs are not a step's), then `steps` timed ones."""
    trainer.sync_policy()
    trainer.model.train()
    trainer.step()
    history = []
    for _ in range(steps):
        trainer.model.train()
        m, dt = timed(trainer.step)
        history.append({**m, "time/step": dt})
    return history


def replay_rollouts(trainer, cfg) -> tuple[tuple, tuple, tuple]:
    """(tokens, seconds) of the last step's questions on vLLM's agent rollout, on HF's, and of one
    raw vLLM call generating as many tokens, all with the policy the steps ended with and the last
    step's rollout settings (sampler log-probs or not: algorithm.rl.mismatch_every)."""
    rows = trainer.last_rollout.rows
    agent = {}
    for name in ("vllm", "hf"):
        engine = trainer.engine if name == "vllm" else make_engine("hf", model_dir(cfg), cfg.model.engine, cfg.seed)
        engine.set_adapter(trainer.policy_dir / f"step_{trainer.state.step}")
        ro = Rollout(engine, trainer.rollout.codec, trainer.rollout.spec)
        empty_prefix_cache(engine)
        eps, dt = timed(lambda: ro.run(rows, n=cfg.algorithm.rl.n_samples, seed=cfg.seed, step=10_000))
        agent[name] = (sum(e.n_generated() for e in eps), dt, eps)
    tokens, _, eps = agent["vllm"]
    prompts = [e.segments[0].context_ids for e in eps if e.segments]
    empty_prefix_cache(trainer.engine)
    raw = raw_single_call(trainer.engine, prompts, math.ceil(tokens / len(prompts)), cfg.seed,
                          trainer.rollout.spec.logprobs)
    return agent["vllm"][:2], agent["hf"][:2], raw


def replay_update(trainer, cfg) -> tuple[int, float, float]:
    """(real tokens, bare fwd+bwd seconds in the trainer's passes, the same in one padded pass) of
    the last step's RL batch and an SFT batch, once per optimizer pass (algorithm.rl.ppo_epochs):
    the trainer's update runs both that many times."""
    import torch

    episodes = trainer.last_rollout.episodes
    batch = build_rl_batch(episodes, torch.zeros(len(episodes)), trainer.pad_id)
    sft = sft_batch(trainer._sft_examples(), trainer.pad_id) if cfg.algorithm.sft.enabled else None
    padded = ([(batch.ids, batch.attn)] + ([(sft[0], sft[1])] if sft is not None else [])) * cfg.algorithm.rl.ppo_epochs
    real = sum(int(a.sum()) for _, a in padded)
    return real, bare_update(trainer.model, padded, chunked=True), bare_update(trainer.model, padded, chunked=False)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--run", type=Path, default=ROOT / "outputs" / "run_001")
    ap.add_argument("--algorithm", default="red")
    ap.add_argument("--steps", type=int, default=3, help="timed steps after one warm-up step")
    ap.add_argument("--eval_items", type=int, default=200)
    args = ap.parse_args()
    import torch

    run = args.run
    if args.algorithm not in METHODS:
        sys.exit(f"step_profile: unknown --algorithm {args.algorithm!r}; valid: {', '.join(METHODS)}")
    trained = run / METHODS[args.algorithm].trainer / args.algorithm
    if not (trained / "manifest.json").is_file():
        sys.exit(f"step_profile: {trained} has no manifest: profile a method the run has trained (09_driver.py)")
    cfg = recorded_config(trained, [f"algorithm.rl.steps={args.steps + 1}"])  # the RL config the run trained with
    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    inputs = (run / "04_sft_warmup" / "ckpt_sft" / "best", run / "03_generate_sft_traces" / "sft_traces.jsonl",
              run / "01_prepare_dataset" / "train.jsonl", run / "02_build_rewards" / "reward_spec.yaml")
    missing = [str(p) for p in inputs if not p.exists()]
    if missing:
        sys.exit(f"step_profile: {', '.join(missing)} missing: run 09_driver.py (or 00-04) for {run} first")
    out = Path(tempfile.mkdtemp(prefix="step_profile_"))
    trainer = build_trainer(cfg, *inputs, out, MetricsLogger(out / "metrics.jsonl"), "profile")
    history = profile_steps(trainer, args.steps)
    mean = lambda k: statistics.fmean(h[k] for h in history)  # noqa: E731
    step_s = mean("time/step")
    print(f"{cfg.algorithm.method} on {run}: {args.steps} timed steps of {cfg.algorithm.rl.questions_per_step} "
          f"questions x {cfg.algorithm.rl.n_samples} samples, {mean('rollout/turns_per_episode'):.2f} turns/episode")
    print(f"{'phase':<14}{'s/step':>8}{'share':>8}")
    for ph in PHASES:
        print(f"{ph:<14}{mean('time/' + ph):>8.3f}{mean('time/' + ph) / step_s:>8.1%}")
    print(f"{'step':<14}{step_s:>8.3f}")

    (tokens, dt), (hf_tokens, hf_dt), (raw_tokens, raw_dt) = replay_rollouts(trainer, cfg)
    print(f"{'rollout':<34}{'tokens':>8}{'s':>8}{'tok/s':>8}"
          f"   (sampler log-probs: {'yes' if trainer.rollout.spec.logprobs else 'no'})")
    for label, n, sec in (("agent, vLLM", tokens, dt), ("agent, HF generate", hf_tokens, hf_dt),
                          ("raw vLLM, one call", raw_tokens, raw_dt)):
        print(f"{label:<34}{n:>8}{sec:>8.2f}{n / sec:>8.0f}")

    real, bare_dt, one_pass_dt = replay_update(trainer, cfg)
    update_dt = history[-1]["time/update"]  # the step whose batch is replayed
    print(f"{'update (real tokens, every pass)':<34}{'tokens':>8}{'s':>8}{'tok/s':>8}")
    for label, sec in (("trainer update (last step)", update_dt), ("bare fwd+bwd, same passes", bare_dt),
                       ("bare fwd+bwd, one padded pass", one_pass_dt)):
        print(f"{label:<34}{real:>8}{sec:>8.2f}{real / sec:>8.0f}")

    test = [r for _, r in read_records(run / "01_prepare_dataset" / "test.jsonl")][:args.eval_items]
    (summary, _), eval_dt = timed(lambda: greedy_eval(trainer.engine, trainer.rollout.codec, test, trainer.spec,
                                                      RolloutSpec.from_config(cfg, 0.0)))
    print(f"greedy evaluation of {len(test)} test items on the running engine: {eval_dt:.1f} s "
          f"(accuracy {summary['accuracy']:.3f})")
    p1 = (tokens / dt) / (raw_tokens / raw_dt)
    p2 = (tokens / dt) / (hf_tokens / hf_dt)
    p3 = bare_dt / update_dt
    print(f"P1={p1:.2f} P2={p2:.2f} P3={p3:.2f} sync_share={mean('time/weight_sync') / step_s:.3f}")
    trainer.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

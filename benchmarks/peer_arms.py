"""The arms of benchmarks/peer_trl.py: the same GRPO and SFT steps through this project's trainers and
through TRL's, each run in a process of its own and returning its steps' figures (seconds, tokens,
positions computed, phases). The setup each arm shares is in peer_trl.py's docstring."""
from __future__ import annotations

import os
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")

TOKENS = 48  # the planner's generation budget (agent.max_new_tokens_planner)


def run_config(args, work: Path):
    from utils.core.loader import load_run_config

    sets = ["algorithm.rl.stratify=false", "algorithm.rl.dynamic_sampling=0", "algorithm.rl.ppo_epochs=1",
            "algorithm.rl.ppo_minibatches=1", "algorithm.rl.lr=1e-4", "algorithm.rl.lr_warmup_steps=0",
            "algorithm.rl.min_subtasks=0", "algorithm.rl.max_subtasks=0", "algorithm.rl.temperature=0.7",
            f"algorithm.rl.questions_per_step={args.questions}", f"algorithm.rl.n_samples={args.n}",
            "agent.max_turns=1", f"agent.max_new_tokens_planner={TOKENS}",
            "warmup.lr=5e-3", "warmup.final_lr_ratio=1.0", "warmup.warmup_steps=0"]
    if args.device != "cpu":
        sets += [f"model.device={args.device}", "model.engine.name=hf", "model.dtype=bfloat16"]
    if args.model != "tiny-arith":  # a real model's own data config (benchmarks/real_step.py)
        return load_run_config(model=args.model, algorithm="grpo", data=args.data, overrides=sets)
    return load_run_config(algorithm="grpo", overrides=sets)


def base_dir(args, work: Path) -> Path:
    """The model config's base (tiny-arith, or a real model's converted folder), or a randomly
    initialised model of `--shape` saved under `work`."""
    if args.model != "tiny-arith":
        from utils.core.stages import model_dir

        return model_dir(run_config(args, work))
    if args.shape == "tiny-arith":
        return ROOT / "artifacts" / "tiny-arith"
    from gpu_shapes import SHAPES, build_random

    if args.shape not in SHAPES:
        raise SystemExit(f"peer_trl: unknown --shape {args.shape!r}; valid: tiny-arith, {', '.join(SHAPES)}")
    model_type, dims = SHAPES[args.shape]
    build_random(args.shape, dims, model_type, "bfloat16" if args.device != "cpu" else "float32", work)
    return work / args.shape


def rows(cfg, k: int) -> list[dict]:
    """The first `k` train rows of the data config, as 01 parses them (utils/data/adapters.py): generated
    for the synthetic tier, read from the data folder's train file otherwise."""
    from utils.core.config import repo_path
    from utils.data.adapters import get_adapter, load_split
    from utils.data.synthetic import generate_rows

    if not cfg.data.name.startswith("synthetic"):
        found = load_split(cfg.data.name, repo_path(cfg.data.path), "train")
        if found is None or len(found[1]) < k:
            raise SystemExit(f"peer_trl: {cfg.data.path} has no train file of {k} rows: bash download.sh first")
        return [row.to_json() for _, row in found[1][:k]]
    adapter = get_adapter(cfg.data.name)
    train = [adapter.parse(Path("<generated>"), i, obj, "train").to_json()
             for i, obj in enumerate(generate_rows(cfg.data)["train"][:max(k, 200)])]
    if len(train) < k:
        raise SystemExit(f"peer_trl: the data config has {len(train)} train rows, fewer than --questions {k}")
    return train[:k]


# ------------------------------------------------------------------ GRPO


def grpo_ours(args, cfg, base: Path, work: Path) -> list[dict]:
    import torch

    from utils.agent.engines import make_engine
    from utils.agent.rollout import Codec, Rollout, RolloutSpec
    from utils.core.models import load_tokenizer
    from utils.core.tracking import NullLogger
    from utils.reward.spec import spec_from_config
    from utils.train.grpo_trainer import GrpoTrainer
    from utils.train.policy import load_policy

    torch.manual_seed(0)
    tok = load_tokenizer(base)
    model = load_policy(base, cfg.model.lora, cfg.model.dtype, device=cfg.model.device,
                        checkpointing=cfg.model.memory.activation_checkpointing)
    engine = make_engine(cfg.model.engine.name, base, cfg.model.engine, cfg.seed)
    rollout = Rollout(engine, Codec(tok, cfg.model.templates), RolloutSpec.from_config(cfg, 0.7))
    questions = rows(cfg, args.questions) * (args.steps + 1)  # each step the same questions
    trainer = GrpoTrainer(cfg, model, engine, rollout, spec_from_config(cfg), questions, [], tok.pad_token_id,
                          work / "ours", NullLogger(), "peer")
    trainer.sync_policy()
    out = []
    for _ in range(args.steps + 1):
        t0 = time.perf_counter()
        metrics = trainer.step()
        seconds = time.perf_counter() - t0
        episodes = trainer.last_rollout.episodes
        segments = [s for ep in episodes for s in ep.segments]
        lengths = [len(s.context_ids) + len(s.gen_ids) for s in segments]
        out.append({"seconds": seconds, "generated": sum(len(s.gen_ids) for s in segments),
                    "sequences": len(segments), "planner_sequences": sum(s.role == "planner" for s in segments),
                    "updated": sum(len(s.gen_ids) for s in segments),
                    "prompt": sum(len(s.context_ids) for s in segments if s.turn == 0),
                    "positions": padded_positions(lengths),
                    **{k: metrics[k] for k in metrics if k.startswith("time/")}})
    trainer.close()
    return out


class _Phases:
    """Seconds of named trainer methods within each optimizer step: each wrapped method still runs,
    its time added to this step's phase."""

    def __init__(self):
        self.now: dict[str, float] = {}

    def wrap(self, obj, name: str, phase: str) -> None:
        fn = getattr(obj, name)

        def timed(*args, **kwargs):
            t0 = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                self.now[phase] = self.now.get(phase, 0.0) + time.perf_counter() - t0

        setattr(obj, name, timed)


def _step_clock(out: list[dict], trainer_ref: list, phases: _Phases):
    """A transformers TrainerCallback that records each optimizer step's seconds, its phases and TRL's
    metrics."""
    from transformers import TrainerCallback

    class Clock(TrainerCallback):
        def on_step_begin(self, args, state, control, **kwargs):  # noqa: ARG002
            phases.now = {}
            self.t0 = time.perf_counter()

        def on_step_end(self, args, state, control, **kwargs):  # noqa: ARG002
            seconds = time.perf_counter() - self.t0
            metrics = {k: v[-1] for k, v in trainer_ref[0]._metrics["train"].items() if v} if trainer_ref else {}
            out.append({"seconds": seconds, **{f"time/{k}": v for k, v in phases.now.items()}, **metrics})

    return Clock()


def _peft_config(cfg):
    from peft import LoraConfig

    lora = cfg.model.lora
    return LoraConfig(r=lora.rank, lora_alpha=lora.alpha, lora_dropout=lora.dropout,
                      target_modules=list(lora.target_modules), task_type="CAUSAL_LM")


def _torch_dtype(cfg):
    import torch

    return getattr(torch, cfg.model.dtype)


def numeric_reward(prompts, completions, answers, **kwargs) -> list[float]:  # noqa: ARG001 - TRL's signature
    """TRL's reward function: our numeric scorer on each completion's <answer> (0 without one)."""
    from utils.agent.protocol import last_action
    from utils.reward.scorers import score_numeric

    out = []
    for text, golds in zip(completions, answers):
        answer, _ = last_action(text)
        out.append(score_numeric(answer, golds).value if answer is not None else 0.0)
    return out


def _grpo_config(trl, args, cfg, work: Path, vllm: bool):
    """TRL's GRPOConfig for the step 06 takes under `cfg` (see peer_trl.py's docstring)."""
    from utils.agent.protocol import PLANNER_STOPS

    settings = dict(use_vllm=True, vllm_mode="colocate", vllm_gpu_memory_utilization=0.3,
                    vllm_importance_sampling_correction=False) if vllm else dict(use_vllm=False)
    rl = cfg.algorithm.rl
    targs = trl.GRPOConfig(
        output_dir=str(work / "trl"), per_device_train_batch_size=args.questions * args.n, num_generations=args.n,
        max_completion_length=TOKENS, temperature=rl.temperature, top_p=1.0, learning_rate=rl.lr,
        lr_scheduler_type="constant", warmup_steps=0, weight_decay=rl.weight_decay, max_grad_norm=rl.max_grad_norm,
        loss_type="dapo", scale_rewards="none", beta=0.0, epsilon=rl.clip_low, epsilon_high=rl.clip_high,
        num_iterations=1, steps_per_generation=1, gradient_accumulation_steps=1, max_steps=args.steps + 1,
        shuffle_dataset=False, generation_kwargs={"stop": list(PLANNER_STOPS)} if vllm else {},
        use_cpu=args.device == "cpu", bf16=args.device != "cpu", report_to=[], save_strategy="no",
        logging_steps=1, disable_tqdm=True, seed=cfg.seed,
        gradient_checkpointing=cfg.model.memory.activation_checkpointing, **settings)  # TRL's default is on
    return targs


def sync_through_reload(generation) -> None:
    """TRL's colocated weight sync, pushed through vLLM 0.32's in-place reload instead of load_weights.

    TRL 1.16 writes each merged tensor with the vLLM model's `load_weights`, one at a time. vLLM 0.32's
    CPU build hands a linear layer's weight to a oneDNN kernel after loading and leaves a bare Parameter
    behind, so on a box where that kernel is built (the AVX-512 boxes) the first sync fails with
    "'Parameter' object has no attribute 'weight_loader'". The model runner's `reload_weights` is vLLM's
    path for new weights: it restores each layer's checkpoint form, loads, and repacks. The tensors are
    TRL's own (`_iter_named_params`: the adapter merged, PEFT's names mapped to vLLM's), in one call; it
    is the call our merged serving makes (utils/agent/engines.py), whose test checks vLLM's output after it.
    """
    runner = generation.llm.llm_engine.model_executor.driver_worker.model_runner

    def sync():
        runner.reload_weights(weights_iterator=generation._iter_named_params(), is_checkpoint_format=True)
        generation.llm.reset_prefix_cache()

    generation.sync_weights = sync


def grpo_trl(args, cfg, base: Path, work: Path) -> list[dict]:
    import torch
    from datasets import Dataset
    from transformers import AutoModelForCausalLM

    from trl_oracle import quiet_import_trl
    from utils.agent.rollout import Codec
    from utils.core.models import load_tokenizer

    trl = quiet_import_trl()
    torch.manual_seed(0)
    tok = load_tokenizer(base)
    codec = Codec(tok, cfg.model.templates)
    qs = rows(cfg, args.questions)
    data = Dataset.from_list([{"prompt": codec.planner_prompt(r["question"])[0], "answers": list(r["answers"])}
                              for r in qs] * (args.steps + 1))

    vllm = args.device == "cpu"
    targs = _grpo_config(trl, args, cfg, work, vllm)
    model = AutoModelForCausalLM.from_pretrained(base, dtype=_torch_dtype(cfg))
    out: list[dict] = []
    ref: list = []
    phases = _Phases()
    trainer = trl.GRPOTrainer(model=model, reward_funcs=numeric_reward, args=targs, train_dataset=data,
                              processing_class=tok, peft_config=_peft_config(cfg),
                              callbacks=[_step_clock(out, ref, phases)])
    ref.append(trainer)
    # the step's parts: rollout and scoring (with the weight sync inside it), the loss's forward
    phases.wrap(trainer, "_generate_and_score_completions", "rollout+scoring")
    if vllm:
        sync_through_reload(trainer.vllm_generation)
        phases.wrap(trainer.vllm_generation, "sync_weights", "weight_sync (in rollout)")
    phases.wrap(trainer, "_compute_loss", "loss forward")
    shapes: list[int] = []
    forward = trainer._compute_loss

    def counted(model_, inputs):  # the positions TRL's forward computes: prompt + completion widths
        shapes.append(inputs["prompt_ids"].numel() + inputs["completion_ids"].numel())
        return forward(model_, inputs)

    trainer._compute_loss = counted
    trainer.train()
    per_step = args.questions * args.n
    seen = [0] + [h["num_tokens"] for h in trainer.state.log_history if "num_tokens" in h]  # prompt + completion
    return [{"seconds": s["seconds"], **{k: v for k, v in s.items() if k.startswith("time/")},
             "generated": round(s.get("completions/mean_length", 0) * per_step),
             "sequences": per_step, "planner_sequences": per_step,
             "updated": round(s.get("completions/mean_length", 0) * per_step),
             "prompt": round(b - a - s.get("completions/mean_length", 0) * per_step), "positions": n}
            for s, a, b, n in zip(out, seen, seen[1:], shapes)]


# ------------------------------------------------------------------ SFT


def sft_examples(cfg, base: Path, k: int) -> list:
    """The gold planner and executor traces (03's `gold` source) of the first train rows, `k` of them."""
    from utils.agent.rollout import Codec
    from utils.agent.traces import examples_from_trace, trace_from_row
    from utils.core.models import load_tokenizer

    codec = Codec(load_tokenizer(base), cfg.model.templates)
    out = []
    for row in rows(cfg, 200):
        trace, _ = trace_from_row(row, "gold")
        if trace is not None:
            out += examples_from_trace(trace, codec)
        if len(out) >= k:
            return out[:k]
    raise SystemExit(f"peer_trl: only {len(out)} gold trace examples in the first 200 rows, fewer than {k}")


def sft_ours(args, cfg, base: Path, work: Path) -> list[dict]:
    import torch

    from gpu_shapes import sft_loop
    from utils.train.policy import load_policy

    torch.manual_seed(0)
    examples = sft_examples(cfg, base, cfg.warmup.batch_size)
    model = load_policy(base, cfg.model.lora, cfg.model.dtype, device=cfg.model.device,
                        checkpointing=cfg.model.memory.activation_checkpointing)
    model.train()
    loop = sft_loop(cfg, model, examples, work / "sft")
    loop.opt.param_groups[0]["lr"] = cfg.warmup.lr
    out = []
    for _ in range(args.steps + 1):
        t0 = time.perf_counter()
        loss, _, _, _ = loop._update()
        out.append({"seconds": time.perf_counter() - t0, "loss": loss, "updated": sum(sum(e.mask[1:]) for e in examples),
                    "positions": padded_positions([len(e.ids) for e in examples])})
    return out


def sft_trl(args, cfg, base: Path, work: Path) -> list[dict]:
    import torch
    from datasets import Dataset
    from transformers import AutoModelForCausalLM

    from trl_oracle import quiet_import_trl
    from utils.core.models import load_tokenizer

    trl = quiet_import_trl()
    torch.manual_seed(0)
    examples = sft_examples(cfg, base, cfg.warmup.batch_size)
    # a token's mask marks it as a target; 04 trains position t-1 to predict a target token t
    # one batch of exactly these examples, every step (an epoch a step)
    data = Dataset.from_list([{"input_ids": e.ids, "completion_mask": e.mask} for e in examples])
    w = cfg.warmup
    targs = trl.SFTConfig(
        output_dir=str(work / "trl_sft"), per_device_train_batch_size=len(examples), learning_rate=w.lr,
        lr_scheduler_type="constant", warmup_steps=0, weight_decay=w.weight_decay, max_grad_norm=w.max_grad_norm,
        max_steps=args.steps + 1, completion_only_loss=True, packing=False, padding_free=False, max_length=None,
        use_cpu=args.device == "cpu", bf16=args.device != "cpu", report_to=[], save_strategy="no",
        logging_steps=1, disable_tqdm=True, seed=cfg.seed, dataloader_drop_last=False,
        gradient_checkpointing=cfg.model.memory.activation_checkpointing)  # TRL's default is on
    model = AutoModelForCausalLM.from_pretrained(base, dtype=_torch_dtype(cfg))
    tok = load_tokenizer(base)
    out: list[dict] = []
    phases = _Phases()
    trainer = trl.SFTTrainer(model=model, args=targs, train_dataset=data, processing_class=tok,
                             peft_config=_peft_config(cfg), callbacks=[_step_clock(out, [], phases)])
    phases.wrap(trainer, "compute_loss", "loss forward")  # with TRL's entropy and token-accuracy metrics
    trainer.train()
    updated = sum(sum(e.mask[1:]) for e in examples)
    losses = [h["loss"] for h in trainer.state.log_history if "loss" in h]
    return [{"seconds": s["seconds"], **{k: v for k, v in s.items() if k.startswith("time/")}, "loss": loss,
             "updated": updated,
             "positions": len(examples) * max(len(e.ids) for e in examples)} for s, loss in zip(out, losses)]


def padded_positions(lengths: list[int]) -> int:
    """Positions our forward computes for sequences of `lengths`: its length runs, each padded to its
    own longest (utils/train/policy.py length_chunks)."""
    from utils.train.policy import length_chunks

    return sum(len(run) * max(lengths[i] for i in run) for run in length_chunks(lengths))

"""The seed-shaped half of benchmarks/gpu_check.py: randomly initialised models of the real base
models' shapes, timed at the seed's RL batch (see that script's docstring for how to run it).

Nothing is downloaded: the architectures are built from the published dimensions in SHAPES, the
LoRA settings, token budgets and memory settings (model.memory: micro-batches, LM-head chunks,
activation checkpointing) come from configs/models/<name>.yaml, and the tokenizer is the tiny one
(its ids, below 100, are valid in any vocabulary). The RL update runs through the trainer's own
methods (utils/train/grpo_trainer.py `_fixed_logprobs`, the no-grad old-log-prob pass, then
`_update`, in train mode, with LoRA dropout), and the SFT step through 04's (utils/train/sft_trainer.py
`SftLoop._update`).

The contexts are the model configs' budgets (planner turns of 256 tokens, executor calls of 384):
planner conversations of 732 tokens and executor calls of 484. They do not reach the seed's 3,072
prompt and 1,024 response tokens.
"""
import functools
import shutil
import statistics
import time
from pathlib import Path

from utils.core.provenance import peak_gpu_mb

ROOT = Path(__file__).resolve().parent.parent

SHAPES = {  # the published architectures (the models' config.json): built at random, nothing downloaded
    "qwen2.5-0.5b": ("qwen2", dict(hidden_size=896, intermediate_size=4864, num_hidden_layers=24,
                                   num_attention_heads=14, num_key_value_heads=2, vocab_size=151936,
                                   tie_word_embeddings=True, max_position_embeddings=32768)),
    "gemma-2-2b": ("gemma2", dict(hidden_size=2304, intermediate_size=9216, num_hidden_layers=26, num_attention_heads=8,
                                  num_key_value_heads=4, head_dim=256, vocab_size=256000, tie_word_embeddings=True,
                                  max_position_embeddings=8192)),
}
QUICK_DIMS = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=2,
                  num_key_value_heads=1, vocab_size=1000, tie_word_embeddings=True, max_position_embeddings=2048)
# the seed's RL step: questions x samples, and the token lengths of one episode's pieces
SEED_BATCH = dict(questions=32, samples=2, planner_prompt=200, result=20, executor_prompt=100)


def gpu_reset() -> None:
    import torch

    if torch.cuda.is_initialized():
        import gc

        gc.collect()
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()


def _sync(torch) -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def build_random(name: str, dims: dict, model_type: str, dtype: str, where: Path) -> int:
    """A randomly initialised model of that shape saved under `where` with the tiny tokenizer
    (ids stay below 100, inside any vocabulary); returns its parameter count."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    cfg = AutoConfig.for_model(model_type, bos_token_id=1, eos_token_id=2, pad_token_id=0, **dims)
    with torch.device("cuda" if torch.cuda.is_available() else "cpu"):
        model = AutoModelForCausalLM.from_config(cfg, dtype=getattr(torch, dtype))
    n = sum(p.numel() for p in model.parameters())
    model.save_pretrained(where / name)
    for f in (ROOT / "artifacts" / "tiny-arith").glob("*token*"):
        shutil.copy(f, where / name / f.name)
    del model
    gpu_reset()
    return n


def _episode_lengths(budget_p: int, budget_e: int) -> dict:
    b = SEED_BATCH
    return {"planner": b["planner_prompt"] + budget_p + b["result"] + budget_p,
            "executor": b["executor_prompt"] + budget_e}


def time_rollout(path: Path, dtype: str, n: int, budget_p: int, budget_e: int) -> dict:
    """Planner turn, executor call, planner turn, each forced to its full budget (a random model
    never stops), as n prompts on the hf engine."""
    import torch
    from utils.agent.engines import HFEngine
    from utils.agent.sampling import SamplingSpec
    from utils.core.schema import EngineConfig

    engine = HFEngine(path, EngineConfig(name="hf", dtype=dtype, hf_batch_size=n))
    g = torch.Generator().manual_seed(0)
    rand = lambda k: torch.randint(3, 100, (k,), generator=g).tolist()  # noqa: E731
    b = SEED_BATCH
    t0, tokens = time.time(), 0
    first = engine.generate([rand(b["planner_prompt"]) for _ in range(n)], SamplingSpec(budget_p), [1])
    ex = engine.generate([rand(b["executor_prompt"]) for _ in range(n)], SamplingSpec(budget_e), [2])
    second = [rand(b["planner_prompt"]) + s[0].token_ids + rand(b["result"]) for s in first]
    last = engine.generate(second, SamplingSpec(budget_p), [3])
    _sync(torch)
    tokens = sum(len(s[0].token_ids) for batch in (first, ex, last) for s in batch)
    out = {"seconds": round(time.time() - t0, 2), "tokens": tokens, "peak_gpu_mb": peak_gpu_mb()}
    del engine
    gpu_reset()
    return out


def _examples(n: int, length: int, generated: list[tuple[int, int]], role: str):
    """n random sequences of `length` with the mask on the (start, count) generated spans."""
    import torch
    from utils.agent.episode import Example

    g = torch.Generator().manual_seed(length)
    mask = [0] * length
    for start, count in generated:
        mask[start:start + count] = [1] * count
    return [Example(f"q{i}", role, torch.randint(3, 100, (length,), generator=g).tolist(), mask) for i in range(n)]


def rl_batch(n: int, lens: dict, budget_p: int, budget_e: int):
    """The RL batch of n episodes: each a planner conversation (two generated turns) and one
    executor call, with random advantages; sampler log-probs 0 (the mismatch is not measured here)."""
    import torch
    from utils.core.tensors import pad
    from utils.train.batch import RlBatch

    b = SEED_BATCH
    turns = [(b["planner_prompt"], budget_p), (b["planner_prompt"] + budget_p + b["result"], budget_p)]
    seqs = _examples(n, lens["planner"], turns, "planner") + _examples(n, lens["executor"],
                                                                        [(b["executor_prompt"], budget_e)], "executor")
    ids, attn = pad([e.ids for e in seqs], 0, torch.long)
    mask, _ = pad([e.mask for e in seqs], 0, torch.float)
    episode = torch.arange(n).repeat(2)
    adv = torch.randn(n, generator=torch.Generator().manual_seed(n))[episode]
    return RlBatch(ids, attn, mask[:, 1:], torch.zeros_like(mask[:, 1:]), adv, [e.role for e in seqs], episode=episode)


def _timed(torch, fn, repeats: int = 3) -> float:
    """Median seconds of the calls of `fn` after the first (a warm-up)."""
    times = []
    for _ in range(repeats):
        _sync(torch)
        t0 = time.time()
        fn()
        _sync(torch)
        times.append(time.time() - t0)
    return round(statistics.median(times[1:]), 4)


def bare_trainer(cfg, policy, sft_examples: list, out_dir: Path):
    """The project's GrpoTrainer around `policy`, without an engine or questions: what its update
    (`_fixed_logprobs`, then `_update`) needs, and nothing the rollout does."""
    from utils.core.tracking import NullLogger
    from utils.train.grpo_trainer import GrpoTrainer

    return GrpoTrainer(cfg, policy, None, None, None, [], sft_examples, 0, out_dir, NullLogger(), "bench")


def trainer_update(trainer, batch) -> None:
    """One RL update as 05 takes it: the no-grad old-log-prob (and reference) pass, then the
    optimizer pass(es) with the SFT term, through the trainer's own methods."""
    old_lp, ref_lp = trainer._fixed_logprobs(batch)
    trainer._update(batch, old_lp, 0.5, ref_lp)


def sft_loop(cfg, policy, examples: list, out_dir: Path):
    """04's SftLoop over `examples`, one batch of all of them a step (an older tree's has no memory)."""
    import inspect
    from dataclasses import replace

    from utils.train.sft_trainer import SftLoop

    warmup = replace(cfg.warmup, batch_size=len(examples), steps=10 ** 6, eval_every=0)
    extra = {"memory": cfg.model.memory} if "memory" in inspect.signature(SftLoop).parameters else {}
    return SftLoop(policy, examples, warmup, cfg.seed, 0, out_dir, None, "bench", **extra)


class ShapeRun:
    """One seed shape through the check's phases (benchmarks/gpu_check.py), each figure put into `out`
    as soon as it is measured, so that a phase that fails or is killed loses only its own:

    - `build`: the random model of the shape, saved under `where` (once);
    - `update`: one RL update (05's: the old-log-prob pass, ppo_epochs optimizer passes, its SFT term
      of algorithm.sft.batch_size conversations) on the seed's episodes, halved until it fits;
    - `sft_step`: one SFT step (04's) on warmup.batch_size planner conversations;
    - `sweep`: the update at each micro-batch budget;
    - `pass_cost`: a forward pass's fixed cost, in tokens (what length-chunking trades padding against);
    - `rollout`: the three turns on the hf engine.

    Micro-batches and chunks of the model config's `model.memory`; `--quick` shrinks everything."""

    def __init__(self, args, name: str, where: Path, out: dict):
        from utils.core.loader import load_run_config

        self.name, self.where, self.out, self.device = name, where, out, args.device
        self.cfg = load_run_config(name, "red", "synthetic_arith", ["algorithm.rl.stratify=false"])
        self.dtype = self.cfg.model.dtype if args.device == "cuda" else "float32"
        self.quick = args.quick
        b = SEED_BATCH
        self.n, self.sft_n = (4, 4) if args.quick else (b["questions"] * b["samples"], self.cfg.warmup.batch_size)
        agent = self.cfg.agent
        self.budget_p, self.budget_e = (16, 24) if args.quick else (agent.max_new_tokens_planner,
                                                                    agent.max_new_tokens_executor)
        self.lens = _episode_lengths(self.budget_p, self.budget_e)
        self.policy = None

    @property
    def path(self) -> Path:
        return self.where / self.name

    def build(self) -> None:
        t0 = time.time()
        model_type, dims = SHAPES[self.name]
        params = build_random(self.name, QUICK_DIMS if self.quick else dims, model_type, self.dtype, self.where)
        lora = self.cfg.model.lora
        self.out.update(params=params, dtype=self.dtype, lora={"rank": lora.rank, "targets": list(lora.target_modules)},
                        episodes=self.n, budgets=[self.budget_p, self.budget_e, self.budget_p], lengths=self.lens,
                        memory={k: getattr(self.cfg.model.memory, k) for k in ("micro_batch_tokens", "logits_chunk_mib",
                                                                               "activation_checkpointing")},
                        build_s=round(time.time() - t0, 1))

    def _policy(self):
        from utils.train.policy import load_policy

        if self.policy is None:
            self.policy = load_policy(self.path, self.cfg.model.lora, self.dtype, device=self.device,
                                      checkpointing=self.cfg.model.memory.activation_checkpointing)
        return self.policy

    def _sft_examples(self, n: int) -> list:
        return _examples(n, self.lens["planner"], [(SEED_BATCH["planner_prompt"], self.budget_p)], "planner")

    def update(self) -> None:
        import torch
        from utils.train.policy import policy_device

        policy, cfg = self._policy(), self.cfg
        trainer = bare_trainer(cfg, policy, self._sft_examples(self.sft_n), self.where / "trainer")
        self.out.update(oom_at_episodes=[], update_sft_sequences=cfg.algorithm.sft.batch_size)
        n = self.n
        while n >= 1:
            try:
                gpu_reset()
                batch = rl_batch(n, self.lens, self.budget_p, self.budget_e).to(policy_device(policy))
                seconds = _timed(torch, lambda: trainer_update(trainer, batch))
                tokens = int(batch.attn.sum()) * cfg.algorithm.rl.ppo_epochs
                self.out.update(update_s=seconds, update_episodes=n, update_sequences=2 * n,
                                update_peak_gpu_mb=peak_gpu_mb(), update_tokens_per_s=round(tokens / seconds, 1))
                break
            except torch.OutOfMemoryError:
                self.out["oom_at_episodes"].append(n)
                batch = None
                n //= 2
        gpu_reset()

    def sft_step(self) -> None:
        import torch

        gpu_reset()
        loop = sft_loop(self.cfg, self._policy(), self._sft_examples(self.sft_n), self.where / "sft")
        self.out["sft_step_s"] = _timed(torch, loop._update)
        self.out.update(sft_sequences=self.sft_n, sft_peak_gpu_mb=peak_gpu_mb())
        gpu_reset()

    def sweep(self, budgets: list[int]) -> None:
        """The RL update at each micro-batch budget (at the episodes the update fitted): seconds, peak
        memory and updated tokens/s, a row as each is measured."""
        import torch
        from dataclasses import replace
        from utils.train.policy import policy_device

        policy, cfg = self._policy(), self.cfg
        batch = rl_batch(self.out.get("update_episodes", self.n), self.lens, self.budget_p,
                         self.budget_e).to(policy_device(policy))
        rows = self.out["budget_sweep"] = []
        for b in budgets:
            c = replace(cfg, model=replace(cfg.model, memory=replace(cfg.model.memory, micro_batch_tokens=b)))
            trainer = bare_trainer(c, policy, self._sft_examples(c.algorithm.sft.batch_size), self.where / f"sweep_{b}")
            gpu_reset()
            try:
                s = _timed(torch, lambda: trainer_update(trainer, batch), repeats=2)
                rows.append({"micro_batch_tokens": b, "update_s": s, "peak_gpu_mb": peak_gpu_mb(),
                             "tokens_per_s": round(int(batch.attn.sum()) * c.algorithm.rl.ppo_epochs / s, 1)})
            except torch.OutOfMemoryError:
                rows.append({"micro_batch_tokens": b, "failed": "out of memory"})
        gpu_reset()

    def pass_cost(self) -> None:
        """A forward pass's fixed cost in padded tokens on this device, the figure utils/train/policy.py
        PASS_COST_TOKENS (256, fitted on the CPU) stands for: no-grad forwards of 1 to 16 rows of one
        width, each timed (median after a warm-up), then least squares of seconds = fixed + per_token x
        tokens; the cost is fixed / per_token."""
        import statistics

        import torch
        from utils.train.policy import forward_logprobs, policy_device

        policy, width = self._policy(), 32 if self.quick else 512
        g = torch.Generator().manual_seed(2)
        points = []
        for rows in (1, 2, 4, 8, 16):
            ids = torch.randint(3, 100, (rows, width), generator=g).to(policy_device(policy))
            with torch.no_grad():
                seconds = _timed(torch, lambda: forward_logprobs(policy, ids, torch.ones_like(ids),
                                                                 chunk_mib=self.cfg.model.memory.logits_chunk_mib))
            points.append((rows * width, seconds))
        slope, fixed = statistics.linear_regression([p[0] for p in points], [p[1] for p in points])
        self.out["pass_cost"] = {"points": points, "fixed_s": round(fixed, 6), "per_token_s": slope,
                                 "tokens": round(fixed / slope) if slope > 0 else None}
        gpu_reset()

    def rollout(self) -> None:
        self.release()
        self.out["rollout"] = time_rollout(self.path, self.dtype, self.n, self.budget_p, self.budget_e)

    def release(self) -> None:
        """Free the policy (the next shape's peak must not count it)."""
        self.policy = None
        gpu_reset()

    def remove(self) -> None:
        self.release()
        shutil.rmtree(self.path, ignore_errors=True)


@functools.lru_cache(maxsize=None)  # the check's estimate asks after every phase
def param_count(name: str) -> int:
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    model_type, dims = SHAPES[name]
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(AutoConfig.for_model(model_type, **dims))
    return sum(p.numel() for p in model.parameters())

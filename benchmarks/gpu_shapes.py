"""The seed-shaped half of benchmarks/gpu_check.py: randomly initialised models of the real base
models' shapes, timed at the seed's RL batch (see that script's docstring for how to run it).

Nothing is downloaded: the architectures are built from the published dimensions in SHAPES, the
LoRA settings and token budgets come from configs/models/<name>.yaml, and the tokenizer is the
tiny one (its ids, below 100, are valid in any vocabulary). The RL update and the SFT step run the
project's own loss code (utils/train/grpo.py red_grpo_loss, utils/train/policy.py sft_loss).
"""
import shutil
import statistics
import time
from pathlib import Path

from utils.core.manifest import peak_gpu_mb

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
    from utils.train.grpo import RlBatch

    b = SEED_BATCH
    turns = [(b["planner_prompt"], budget_p), (b["planner_prompt"] + budget_p + b["result"], budget_p)]
    seqs = _examples(n, lens["planner"], turns, "planner") + _examples(n, lens["executor"],
                                                                        [(b["executor_prompt"], budget_e)], "executor")
    ids, attn = pad([e.ids for e in seqs], 0, torch.long)
    mask, _ = pad([e.mask for e in seqs], 0, torch.float)
    episode = torch.arange(n).repeat(2)
    adv = torch.randn(n, generator=torch.Generator().manual_seed(n))[episode]
    return RlBatch(ids, attn, mask[:, 1:], torch.zeros_like(mask[:, 1:]), adv, [e.role for e in seqs], episode=episode)


def _timed_steps(torch, policy, loss_fn, repeats: int = 3) -> float:
    """Median seconds of the optimizer steps after the first (a warm-up)."""
    opt = torch.optim.AdamW([p for p in policy.parameters() if p.requires_grad], lr=1e-5)
    times = []
    for _ in range(repeats):
        _sync(torch)
        t0 = time.time()
        opt.zero_grad(set_to_none=True)
        loss_fn().backward()
        torch.nn.utils.clip_grad_norm_([p for p in policy.parameters() if p.requires_grad], 1.0)
        opt.step()
        _sync(torch)
        times.append(time.time() - t0)
    return round(statistics.median(times[1:]), 4)


def time_training(policy, cfg, n: int, lens: dict, budget_p: int, budget_e: int, sft_n: int, out: dict) -> None:
    """One RL update (RED-GRPO loss with its SFT term of algorithm.sft.batch_size conversations, as
    05's step takes it with ppo_epochs 1) on n episodes, and one SFT step (04's) on sft_n planner
    conversations, into `out` as each is measured (a later failure keeps the earlier figures); n
    halves until the update fits."""
    import torch
    from utils.train.grpo import red_grpo_loss
    from utils.train.policy import policy_device, sft_batch, sft_loss
    from utils.train.red import RedState

    dev = policy_device(policy)
    turns = [(SEED_BATCH["planner_prompt"], budget_p)]
    sft_examples = _examples(sft_n, lens["planner"], turns, "planner")
    term = sft_examples[:cfg.algorithm.sft.batch_size]
    out.update(oom_at_episodes=[], update_sft_sequences=len(term))
    while n >= 1:
        try:
            gpu_reset()
            batch = rl_batch(n, lens, budget_p, budget_e).to(dev)
            sft = sft_batch(term, 0, dev)
            out["update_s"] = _timed_steps(torch, policy, lambda: red_grpo_loss(
                policy, batch, None, sft, cfg.algorithm, RedState(), 0.5).loss)
            out.update(update_episodes=n, update_sequences=2 * n, update_peak_gpu_mb=peak_gpu_mb())
            break
        except torch.OutOfMemoryError:
            out["oom_at_episodes"].append(n)
            batch = sft = None
            n //= 2
    gpu_reset()
    out["phase"] = "sft_step"
    out["sft_step_s"] = _timed_steps(torch, policy, lambda: sft_loss(policy, sft_examples, 0))
    out.update(sft_sequences=sft_n, sft_peak_gpu_mb=peak_gpu_mb())


def seed_shape(args, name: str, where: Path) -> dict:
    from utils.core.loader import load_run_config
    from utils.train.policy import load_policy

    cfg = load_run_config(name, "red", "synthetic_arith", [])
    model_type, dims = SHAPES[name]
    dtype = cfg.model.dtype if args.device == "cuda" else "float32"
    b = SEED_BATCH
    n, sft_n = (4, 4) if args.quick else (b["questions"] * b["samples"], cfg.warmup.batch_size)
    budget_p, budget_e = ((16, 24) if args.quick else (cfg.agent.max_new_tokens_planner, cfg.agent.max_new_tokens_executor))
    t0 = time.time()
    params = build_random(name, QUICK_DIMS if args.quick else dims, model_type, dtype, where)
    lens = _episode_lengths(budget_p, budget_e)
    out = {"params": params, "dtype": dtype, "lora": {"rank": cfg.model.lora.rank, "targets": list(cfg.model.lora.target_modules)},
           "episodes": n, "budgets": [budget_p, budget_e, budget_p], "lengths": lens, "build_s": round(time.time() - t0, 1)}
    policy = None
    try:  # a phase that fails (out of memory, say) is named, and the figures before it are kept
        out["phase"] = "rollout"
        out["rollout"] = time_rollout(where / name, dtype, n, budget_p, budget_e)
        out["phase"] = "update"
        policy = load_policy(where / name, cfg.model.lora, dtype, device=args.device)
        time_training(policy, cfg, n, lens, budget_p, budget_e, sft_n, out)
        del out["phase"]
    except Exception as exc:  # noqa: BLE001 - recorded; the check goes on with its other parts
        out["failed"] = f"{out.pop('phase')}: {type(exc).__name__}: {exc}"[:2000]
    del policy
    gpu_reset()
    shutil.rmtree(where / name, ignore_errors=True)
    return out


def param_count(name: str) -> int:
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    model_type, dims = SHAPES[name]
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(AutoConfig.for_model(model_type, **dims))
    return sum(p.numel() for p in model.parameters())

"""Our GRPO losses and advantages against TRL's own code path, on one batch (docs/METHODS.md, "Against TRL").

TRL is a test-only dependency (requirements-test.txt, installed by setup.sh); nothing under utils/
imports it. Two copies of the tiny-arith base carry the same random LoRA: ours is `load_policy`'s
(the trainer's fused LoRA forward, utils/train/lora_fast.py), TRL's is peft's own model handed to
`trl.GRPOTrainer`, which patches its fused LM head in. One batch of ragged prompts (left-padded for
TRL) and ragged completions (right-padded) is laid out both ways: TRL's prompt/completion tensors
and our right-padded `RlBatch` with its next-token mask. The old and reference log-probs are the
current policy's perturbed by fixed noise, so ratios move off 1 and the clip acts.

- Ours: `grpo.red_grpo_loss` (the trainer's loss and backward: our log-probs, policy loss,
  aggregation, KL and entropy bonus) under a config from `load_run_config`.
- TRL: `GRPOTrainer._compute_loss` on the inputs its `_generate_and_score_completions` returns
  (the keys and layout it trains on), then `.backward()`; advantages from a real
  `_generate_and_score_completions` call (TRL generates with transformers, a reward function
  hands back fixed rewards from a dataset column).

`compare(case)` returns both losses and the largest gradient difference; benchmarks/peer_trl.py
prints the worst case's relative loss difference, tests/test_peer_trl.py asserts each case.
"""
from __future__ import annotations

import os
import warnings
from dataclasses import dataclass, field
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
BASE = ROOT / "artifacts" / "tiny-arith"
os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")

PROMPTS = [[5, 17, 9, 33, 41, 8], [12, 7, 30, 22], [40, 3, 19, 25, 6, 11, 27, 9]]  # token ids, ragged
COMPLETION_LENGTHS = [7, 3, 10, 5, 9, 4]  # two completions per prompt, ragged
MAX_COMPLETION = 12  # TRL's max_completion_length (Dr. GRPO's constant divisor)


@dataclass(frozen=True)
class Case:
    """One pair that claims to be the same algorithm: TRL's GRPOConfig fields and our `--set`s."""
    name: str
    trl: dict
    ours: list[str]
    method: str = "grpo"
    temperature: float = 0.7
    noise: float = 0.3  # std of the old log-probs' offset from the current ones
    dead_row: bool = False  # one completion with no trained token (a masked truncated completion)
    notes: str = ""


CASES = [
    Case("dapo=token-mean", {"loss_type": "dapo"}, ["algorithm.rl.loss_agg=token-mean"]),
    Case("bnpo=token-mean", {"loss_type": "bnpo"}, ["algorithm.rl.loss_agg=token-mean"]),
    Case("grpo=seq-mean-token-mean", {"loss_type": "grpo"}, ["algorithm.rl.loss_agg=seq-mean-token-mean"]),
    Case("dr_grpo=seq-mean-token-sum-norm", {"loss_type": "dr_grpo"},
         ["algorithm.rl.loss_agg=seq-mean-token-sum-norm", f"algorithm.rl.loss_horizon={MAX_COMPLETION}"]),
    Case("symmetric clip", {"loss_type": "dapo", "epsilon": 0.2, "epsilon_high": 0.2},
         ["algorithm.rl.clip_low=0.2", "algorithm.rl.clip_high=0.2"]),
    Case("wider clip-higher", {"loss_type": "dapo", "epsilon": 0.1, "epsilon_high": 0.4},
         ["algorithm.rl.clip_low=0.1", "algorithm.rl.clip_high=0.4"]),
    Case("k3 KL", {"loss_type": "dapo", "beta": 0.1, "use_bias_correction_kl": False}, ["algorithm.rl.kl_coef=0.1"]),
    Case("gspo", {"loss_type": "grpo", "importance_sampling_level": "sequence", "epsilon": 3e-4,
                  "epsilon_high": 4e-4}, [], method="gspo", noise=0.002),
    Case("entropy bonus, T=1", {"loss_type": "dapo", "entropy_coef": 0.05}, ["algorithm.rl.entropy_coef=0.05"],
         temperature=1.0),
]

# named departures: the same batch, a case each, where the two differ by definition (docs/METHODS.md)
DEPARTURES = {
    "kl bias correction": Case("k3 KL, TRL's default ratio-weighted KL", {"loss_type": "dapo", "beta": 0.1},
                               ["algorithm.rl.kl_coef=0.1"]),
    "entropy temperature": Case("entropy bonus, T=0.7", {"loss_type": "dapo", "entropy_coef": 0.05},
                                ["algorithm.rl.entropy_coef=0.05"]),
    "grpo empty row": Case("grpo with an empty completion", {"loss_type": "grpo"},
                           ["algorithm.rl.loss_agg=seq-mean-token-mean"], dead_row=True),
    "dr_grpo empty row": Case("dr_grpo with an empty completion", {"loss_type": "dr_grpo"},
                              ["algorithm.rl.loss_agg=seq-mean-token-sum-norm",
                               f"algorithm.rl.loss_horizon={MAX_COMPLETION}"], dead_row=True),
}


def quiet_import_trl():
    """trl, with its import-time warnings (vLLM's version range, Triton on a CPU) kept off the console."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        import trl
    return trl


def _our_policy():
    from utils.core.schema import LoraConfig
    from utils.train.policy import load_policy

    torch.manual_seed(0)
    model = load_policy(BASE, LoraConfig(rank=8, alpha=16, dropout=0.0))
    for p in model.parameters():
        if p.requires_grad:
            torch.nn.init.normal_(p, std=0.05)  # a fresh adapter's B is 0: every product would vanish
    return model


def _trl_policy(ours):
    """peft's own LoRA model over a fresh copy of the base, holding `ours`'s adapter weights."""
    from peft import LoraConfig as PeftLoraConfig
    from peft import get_peft_model
    from transformers import AutoModelForCausalLM

    base = AutoModelForCausalLM.from_pretrained(BASE, dtype=torch.float32)
    cfg = ours.peft_config["default"]
    model = get_peft_model(base, PeftLoraConfig(r=cfg.r, lora_alpha=cfg.lora_alpha, lora_dropout=0.0,
                                                target_modules=sorted(cfg.target_modules), task_type="CAUSAL_LM"))
    missing = model.load_state_dict({k: v for k, v in ours.state_dict().items() if "lora_" in k}, strict=False)
    assert not missing.unexpected_keys, missing.unexpected_keys
    return model


def trl_trainer(model, tokenizer, trl_args: dict, temperature: float, out_dir: Path, n: int = 2, kind: str = "grpo"):
    """A `trl.GRPOTrainer` (or `trl.RLOOTrainer`, `kind` "rloo") on CPU, generating with transformers
    (use_vllm=False), with the loop state its loss reads outside `train()` (one accumulation step).
    Its reward function hands back each dataset row's `reward` column."""
    trl = quiet_import_trl()
    from datasets import Dataset

    with warnings.catch_warnings():  # TRL's lazy submodules warn about vLLM's version when first touched
        warnings.simplefilter("ignore")
        return _trl_trainer(trl, Dataset, model, tokenizer, trl_args, temperature, out_dir, n, kind)


def _trl_trainer(trl, Dataset, model, tokenizer, trl_args, temperature, out_dir, n, kind):  # noqa: N803
    def fixed_reward(prompts, completions, reward, **kwargs):  # noqa: ARG001 - TRL's signature
        return [float(r) for r in reward]

    config, trainer_class = (trl.GRPOConfig, trl.GRPOTrainer) if kind == "grpo" else (trl.RLOOConfig, trl.RLOOTrainer)
    settings = {"epsilon": 0.2, "epsilon_high": 0.28, **trl_args}  # our schema's clip (TRL's default is symmetric)
    args = config(output_dir=str(out_dir), per_device_train_batch_size=n * 3, num_generations=n,
                  max_completion_length=MAX_COMPLETION, temperature=temperature, use_cpu=True, report_to=[],
                  save_strategy="no", bf16=False, use_vllm=False, disable_tqdm=True, logging_strategy="no",
                  **settings)
    data = Dataset.from_list([{"prompt": "1+2=", "reward": 0.0}] * 3)
    trainer = trainer_class(model=model, reward_funcs=fixed_reward, args=args, train_dataset=data,
                            processing_class=tokenizer)
    trainer.current_gradient_accumulation_steps = 1  # what Trainer's loop sets before a step
    return trainer


@dataclass
class Layouts:
    """One batch both ways: TRL's inputs, and our RlBatch plus the index map between their token
    positions (TRL's completion position j of row b is our next-token position starts[b] + j)."""
    trl: dict
    ours: object
    starts: list[int]
    lengths: list[int]

    def to_ours(self, x: torch.Tensor) -> torch.Tensor:
        out = torch.zeros(self.ours.mask.shape)
        for b, (s, n) in enumerate(zip(self.starts, self.lengths)):
            out[b, s:s + n] = x[b, :n]
        return out

    def to_trl(self, x: torch.Tensor) -> torch.Tensor:
        out = torch.zeros(len(self.lengths), self.trl["completion_ids"].shape[1])
        for b, (s, n) in enumerate(zip(self.starts, self.lengths)):
            out[b, :n] = x[b, s:s + n]
        return out


def layouts(advantages: torch.Tensor, pad_id: int, dead_row: bool = False, seed: int = 0) -> Layouts:
    from utils.core.tensors import pad
    from utils.train.batch import RlBatch

    g = torch.Generator().manual_seed(seed)
    prompts = [PROMPTS[b // 2] for b in range(len(COMPLETION_LENGTHS))]
    completions = [torch.randint(3, 90, (n,), generator=g).tolist() for n in COMPLETION_LENGTHS]
    width = max(len(p) for p in prompts)
    prompt_ids = torch.tensor([[pad_id] * (width - len(p)) + p for p in prompts])  # left-padded, as TRL's
    prompt_mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts])
    completion_ids, completion_mask = pad(completions, pad_id, torch.long)
    completion_mask = completion_mask.float()
    if dead_row:
        completion_mask[1] = 0  # as TRL's mask_truncated_completions leaves a truncated completion
    ids, attn = pad([p + c for p, c in zip(prompts, completions)], pad_id, torch.long)
    starts = [len(p) - 1 for p in prompts]  # our position predicting the first completion token
    lengths = [int(m.sum()) for m in completion_mask]
    trl_inputs = {"prompt_ids": prompt_ids, "prompt_mask": prompt_mask, "completion_ids": completion_ids,
                  "completion_mask": completion_mask.long(), "advantages": advantages.clone(),
                  "num_items_in_batch": completion_mask.sum()}
    batch = RlBatch(ids, attn, torch.zeros(len(ids), ids.shape[1] - 1), None, advantages.clone(),
                    ["planner"] * len(ids), episode=torch.arange(len(ids)))
    lay = Layouts(trl_inputs, batch, starts, lengths)
    batch.mask = lay.to_ours(completion_mask)
    return lay


@dataclass
class Outcome:
    case: str
    ours_loss: float
    trl_loss: float
    grad_max_abs_diff: float
    grad_scale: float
    extra: dict = field(default_factory=dict)

    @property
    def loss_rel_diff(self) -> float:
        return abs(self.ours_loss - self.trl_loss) / max(abs(self.trl_loss), 1e-12)

    @property
    def grad_rel_diff(self) -> float:
        return self.grad_max_abs_diff / max(self.grad_scale, 1e-12)


def _grads(model) -> dict[str, torch.Tensor]:
    return {n: p.grad.detach().clone() for n, p in model.named_parameters() if p.grad is not None}


def compare(case: Case, out_dir: Path) -> Outcome:
    """Both losses and gradients of `case` on the one batch (see the module docstring)."""
    from utils.core.loader import load_run_config
    from utils.core.models import load_tokenizer
    from utils.core.schema import MemoryConfig
    from utils.train.update import red_grpo_loss
    from utils.train.policy import batch_logprobs
    from utils.train.red import RedState

    tok = load_tokenizer(BASE)
    ours = _our_policy()
    theirs = _trl_policy(ours)
    adv = torch.tensor([1.0, -0.5, 0.8, -1.2, 0.3, -0.7])
    lay = layouts(adv, tok.pad_token_id, case.dead_row)
    batch = lay.ours
    trainer = trl_trainer(theirs, tok, case.trl, case.temperature, out_dir)
    model = trainer.model

    ours.eval()  # no dropout either way; eval only for the no-grad current log-probs
    current = batch_logprobs(ours, batch.ids, batch.attn, batch.mask > 0, case.temperature)
    g = torch.Generator().manual_seed(1)
    mask_trl = lay.trl["completion_mask"].float()
    old_trl = (lay.to_trl(current) + case.noise * torch.randn(mask_trl.shape, generator=g)) * mask_trl
    ref_trl = (lay.to_trl(current) + 0.2 * torch.randn(mask_trl.shape, generator=g)) * mask_trl
    inputs = {**lay.trl, "old_per_token_logps": old_trl, "ref_per_token_logps": ref_trl}

    alg = load_run_config(algorithm=case.method, overrides=[f"algorithm.rl.temperature={case.temperature}",
                                                            *case.ours]).algorithm
    ours.train()
    ours.zero_grad(set_to_none=True)
    terms = red_grpo_loss(ours, batch, lay.to_ours(old_trl), None, alg, RedState(), 0.5, lay.to_ours(ref_trl), {},
                          memory=MemoryConfig(micro_batch_tokens=0))
    g_ours = _grads(ours)

    model.train()
    model.zero_grad(set_to_none=True)
    loss = trainer._compute_loss(model, inputs)
    loss.backward()
    g_trl = _grads(model)
    assert g_ours.keys() == g_trl.keys(), sorted(g_ours.keys() ^ g_trl.keys())[:4]
    diff = max((g_ours[k] - g_trl[k]).abs().max().item() for k in g_ours)
    scale = max(g_trl[k].abs().max().item() for k in g_trl)
    metrics = {k: v[-1] for k, v in trainer._metrics["train"].items() if v}
    return Outcome(case.name, terms.loss.item(), loss.item(), diff, scale,
                   {"ours_stats": terms.stats, "trl_metrics": metrics})


# our advantage estimator -> (TRL trainer, its settings) that claims the same
ADVANTAGE_PEERS = {"group": ("grpo", {"scale_rewards": "group"}), "batch": ("grpo", {"scale_rewards": "batch"}),
                   "none": ("grpo", {"scale_rewards": "none"}), "rloo": ("rloo", {"normalize_advantages": False})}


def trl_advantages(rewards: list[float], n: int, ours: str, out_dir: Path) -> torch.Tensor:
    """The advantages that TRL's trainer for our estimator `ours` (ADVANTAGE_PEERS) gives completions
    whose reward function returns `rewards` (groups of `n`, in order), from its
    `_generate_and_score_completions`: it generates, scores and normalises as in training."""
    from transformers import AutoModelForCausalLM

    from utils.core.models import load_tokenizer

    tok = load_tokenizer(BASE)
    model = AutoModelForCausalLM.from_pretrained(BASE, dtype=torch.float32)
    kind, settings = ADVANTAGE_PEERS[ours]
    trainer = trl_trainer(model, tok, settings if kind == "grpo" else {**settings, "epsilon_high": 0.2}, 0.7,
                          out_dir, n=n, kind=kind)
    trainer.args.per_device_train_batch_size = len(rewards)
    inputs = [{"prompt": f"{i // n}+{i // n + 2}=", "reward": r} for i, r in enumerate(rewards)]
    model.train()
    with torch.no_grad():
        out = trainer._generate_and_score_completions(inputs)
    return out["advantages"].detach()


def oracle(out_dir: Path) -> list[Outcome]:
    """Every case of CASES, in order."""
    return [compare(case, out_dir) for case in CASES]

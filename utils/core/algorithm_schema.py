"""The algorithm tier's part of the run config's schema (utils/core/schema.py holds the rest): the RL
step, the SFT term and how it is weighted (RED, CHORD, SRFT), and the peers' settings (red_paper,
SRFT), then a section for each method that lives in one file (utils/core/method_files.py).

A method is its config file, configs/algorithms/<name>.yaml (utils/core/methods.py): the names are
the files' stems, not a copy.
"""
from __future__ import annotations

from dataclasses import dataclass, make_dataclass

from utils.core.choices import (ADV_SCALINGS, LOSS_AGGS, OFFLINE_SHIFTS, POLICY_LOSS_NAMES, REFILLS, RL_INITS,
                                SFT_WEIGHTINGS, TRAIN_ROLES)
from utils.core.config import CONFIG_DIR, field
from utils.core.method_files import METHOD_DIR, sections

METHOD_NAMES = tuple(sorted(p.stem for p in (CONFIG_DIR / "algorithms").glob("*.yaml")))


@dataclass
class SftConfig:
    enabled: bool = field(True, "Add the SFT cross-entropy term to the RL loss.")
    loss_coef: float = field(0.1, "alpha: base weight of the SFT term.", minimum=0.0)
    batch_size: int = field(16, "SFT examples per optimizer step.", minimum=1)
    match_red: bool = field(False, "matched_sft: multiply loss_coef by the mean red/final_weight of the same "
                                   "seed's red run (05_train_red_grpo/red must have run).")
    weighting: str = field("red", "How a step weighs the SFT term against the policy loss (utils/train/sft_weights.py): "
                                  "red, L_GRPO + w·α·L_SFT with RED's w (G = 1: a constant); chord, "
                                  "(1−μ)·L_GRPO + μ·α·L_SFT on CHORD's μ schedule (algorithm.chord); srft, "
                                  "L_policy + α·L_SFT with each token's NLL × exp(−H) of its sequence.", SFT_WEIGHTINGS)


@dataclass
class ChordConfig:
    mu_peak: float = field(0.9, "CHORD's μ at the end of its warmup (CHORD-μ 0.9; CHORD-φ's constant 0.1).",
                           minimum=0.0)
    mu_valley: float = field(0.05, "μ after its cosine decay.", minimum=0.0)
    mu_warmup_steps: int = field(0, "Steps over which μ rises linearly from 0 to mu_peak.", minimum=0)
    mu_decay_steps: int = field(30, "Steps over which μ then falls on a cosine to mu_valley (0: none).", minimum=0)
    phi: bool = field(False, "CHORD-φ: weigh each SFT token's NLL by sg(p·(1−p)), p its probability.")


@dataclass
class RedConfig:
    G: float = field(5.0, "Upper bound of the entropy weight, base of the accuracy factor; 1 disables RED.",
                     minimum=1.0)
    sft_entropy_ema_decay: float = field(0.99, "EMA decay of the SFT entropy.")
    rl_entropy_ema_decay: float = field(0.99, "EMA decay of the RL entropy.")
    accuracy_aware_policy_shift: bool = field(True, "RED Part 2: multiply by G^(1-2*acc).")
    weight_min: float = field(0.0, "Lower clamp of the final SFT weight.", minimum=0.0)
    weight_max: float = field(25.0, "Upper clamp of the final SFT weight (G^2 for G=5).")


@dataclass
class RlConfig:
    enabled: bool = field(True, "Run GRPO; false gives SFT only.")
    steps: int = field(30, "Optimizer steps.", minimum=0)
    questions_per_step: int = field(16, "Questions per rollout batch (chosen on val, docs/RESULTS.md).", minimum=1)
    n_samples: int = field(4, "Samples per question (GRPO group size).", minimum=2)
    dynamic_sampling: int = field(0, "DAPO's dynamic sampling: drop groups whose answer scores are all equal (zero "
                                     "advantage) and refill from the next questions, at most this many extra "
                                     "rounds a step (0 = off). One rank only; not with red_paper.", minimum=0)
    refill: str = field("rounds", "How dynamic sampling refills: rounds waits for a round's last group, then "
                                  "draws as many questions as groups were dropped; pipelined starts each "
                                  "replacement as soon as its dropped group ends, the same questions with the "
                                  "same seeds, but sharing engine steps with other episodes, so on vLLM not "
                                  "the same training bit for bit (utils/train/sampler.py, docs/PERFORMANCE.md).",
                        REFILLS)
    min_subtasks: int = field(0, "RL questions: only train rows whose gold decomposition has at least this many "
                                 "subtasks (0 = every row). SFT traces are unaffected (traces.*).", minimum=0)
    max_subtasks: int = field(0, "RL questions: only train rows whose gold decomposition has at most this many "
                                 "subtasks (0 = no upper bound).", minimum=0)
    stratify: bool = field(False, "Draw RL questions in a fixed gold-length mix: each epoch interleaves the "
                                  "lengths' shuffled rows in proportion, so every step's batch holds about the "
                                  "pool's mix (utils/core/stream.py). Every row needs a gold decomposition.")
    temperature: float = field(0.7, "Rollout sampling temperature (chosen on val, docs/RESULTS.md).", minimum=0.0)
    lr: float = field(1e-4, "Learning rate (regime D's, chosen on val; imperfect_teacher sets 4e-4).", minimum=0.0)
    lr_warmup_steps: int = field(0, "Linear learning-rate warmup: step s of the first N trains at lr · s / N "
                                    "(0 = the lr from the first step).", minimum=0)
    lr_decay_start: int = field(0, "Step where a cosine decay of the lr to final_lr_ratio · lr begins (0: right after "
                                   "the warmup); the warmup's schedule (utils/train/schedule.py).", minimum=0)
    final_lr_ratio: float = field(1.0, "The lr at the last step as a share of lr (1: constant after the warmup).",
                                  minimum=0.0)
    init: str = field("warmup", "Where RL starts: warmup, 04's adapter (every SFT→RL method), or base, a fresh LoRA "
                                "on the bare base model (joint: SFT and RL together from the start).", RL_INITS)
    clip_low: float = field(0.2, "PPO clip below 1.", minimum=0.0)
    clip_high: float = field(0.28, "PPO clip above 1 (clip-higher, as in DAPO).", minimum=0.0)
    loss_agg: str = field("token-mean", "How per-token losses are averaged (seq-mean: over episodes).", LOSS_AGGS)
    loss_horizon: int = field(1024, "The token-sum-norm modes' constant divisor (of an episode's token sum, or of the batch's).", minimum=1)
    adv_scaling: str = field("none", "Advantage: r - group mean scaled by the group's or batch's std, or not (none = "
                                     "Dr. GRPO: a 0.1 format gap is not blown up to a correct answer's size; chosen "
                                     "on val), or rloo (r - mean of the group's other samples).", ADV_SCALINGS)
    policy_loss: str = field("ppo_clip", "Policy loss: ppo_clip (per-token ratio), gspo (one clipped "
                                         "ratio per sequence; method gspo) or unclipped (−A·r, as the SRFT, HPT "
                                         "and ReLIFT releases train).", POLICY_LOSS_NAMES)
    tis_cap: float = field(0.0, "Truncated importance sampling: weight each token's policy loss by "
                                "min(p_trainer / p_sampler, tis_cap), detached (0 = off). For bf16 "
                                "engines whose probabilities differ from the trainer's; ~1 in fp32 here.", minimum=0.0)
    mismatch_every: int = field(1, "Ask the sampler for its tokens' log-probs on every Nth step, from the first, "
                                   "and log rollout/logprob_mismatch on those steps only (0 = never). Training "
                                   "does not read them unless tis_cap > 0, which asks on every step; on CPU "
                                   "vLLM they cost about a tenth of a rollout (docs/PERFORMANCE.md).", minimum=0)
    train_roles: str = field("both", "Whose segments the policy loss trains: both roles share the episode's "
                                     "advantage (the paper), or only the planner's (the executor keeps its "
                                     "warmup behaviour, plus the SFT term when on).", TRAIN_ROLES)
    process_weight: float = field(1.0, "With reward.process on: a planner token's advantage is the episode's plus "
                                       "this times the discounted sum of its group-normalised step rewards from "
                                       "its turn on (executor tokens keep the episode's).")
    process_gamma: float = field(1.0, "Discount of later steps' process rewards.")
    kl_coef: float = field(0.0, "k3 KL coefficient to the reference: the SFT warmup RL starts from (not with init "
                                "base).", minimum=0.0)
    entropy_coef: float = field(0.0, "beta: entropy bonus.")
    ppo_epochs: int = field(1, "Optimizer passes per rollout batch.", minimum=1)
    ppo_minibatches: int = field(1, "Optimizer steps per pass: the batch's episodes split into this many parts "
                                    "(whole episodes), each with its share of the SFT batch.", minimum=1)
    weight_decay: float = field(0.0, "AdamW weight decay of the RL optimizer.", minimum=0.0)
    max_grad_norm: float = field(1.0, "Gradient-norm clip of each RL optimizer step.", minimum=0.0)
    max_skips_in_a_row: int = field(5, "Stop the run when this many optimizer steps in a row were skipped "
                                       "for a non-finite loss, gradient or reward (0 = never stop).", minimum=0)
    save_freq: int = field(10, "Checkpoint every N steps.", minimum=1)
    save_minutes: float = field(10.0, "Also checkpoint once this many minutes have passed since the last one, so "
                                      "a pre-empted machine loses at most that much (0 = by steps only).",
                                minimum=0.0)
    keep_last: int = field(2, "Checkpoints kept.", minimum=1)
    dump_freq: int = field(10, "Dump episodes every N steps.", minimum=0)


@dataclass
class RedPaperConfig:
    offline: bool = field(False, "red_paper: a question with an expert trace (03's sft_traces.jsonl) has that "
                                 "trace in place of its group's last rollout, trained through the policy loss "
                                 "(utils/train/losses.py red_paper_loss).")
    policy_shift: str = field("accuracy", "The offline tokens' ratio: accuracy (pi / (pi + (1 - pi) * group "
                                          "accuracy), the paper's accuracy-aware policy shift) or none (pi: an "
                                          "assumed behaviour probability of 1).", OFFLINE_SHIFTS)
    entropy_weight_max: float = field(7.0, "Upper clamp of the entropy-change weight on the offline samples' "
                                           "advantages (the paper's code: 7).")


@dataclass
class SrftConfig:
    enabled: bool = field(False, "SRFT (method srft, utils/train/srft.py): demonstrations inside the groups with LUFFY's "
                                 "shaped ratio, the same demonstrations' SFT term weighted by exp(−H), and rollouts "
                                 "trained by REINFORCE with c·exp(H) when right and `negative_coef` when wrong.")
    positive_coef: float = field(0.1, "c: a right rollout's advantage is c·exp(H), H its sequence's mean entropy.",
                                 minimum=0.0)
    negative_coef: float = field(-1.0, "A wrong rollout's advantage: −1 as the paper's equation and the released "
                                       "script have it (method srft); 0 as the released loss's clamp gives when left "
                                       "on (method srft_clamped): a constant loss with no gradient.", maximum=0.0)
    shape: float = field(0.1, "γ of the demonstrations' shaped ratio p / (p + γ) (LUFFY's 0.1).", minimum=1e-6)


@dataclass
class BuiltinAlgorithmConfig:
    """The sections every run has; `AlgorithmConfig` adds one per method file (utils/core/method_files.py)."""
    method: str = field("red", "The method's name; its flags below must agree with it.", METHOD_NAMES)
    rl: RlConfig = field(RlConfig(), "GRPO settings.")
    sft: SftConfig = field(SftConfig(), "SFT co-training settings.")
    red: RedConfig = field(RedConfig(), "RED weighting settings.")
    red_paper: RedPaperConfig = field(RedPaperConfig(), "RED as its paper's code has it (method red_paper).")
    chord: ChordConfig = field(ChordConfig(), "CHORD's μ schedule and φ (algorithm.sft.weighting chord).")
    srft: SrftConfig = field(SrftConfig(), "SRFT's entropy-weighted single-stage SFT and RL (method srft).")


# A method in one file (utils/train/methods/<name>.py) adds its section algorithm.<name>, read from the
# file's SETTINGS; each section class is bound here so that a config pickles (a Ray worker gets one).
for _name, _cls in sections().items():
    if _name in BuiltinAlgorithmConfig.__dataclass_fields__ or _cls.__name__ in globals():
        raise ValueError(f"{METHOD_DIR}/{_name}.py: a method file cannot be named like the built-in section or "
                         f"class it would replace ({_name}, {_cls.__name__})")
    globals()[_cls.__name__] = _cls
AlgorithmConfig = make_dataclass(
    "AlgorithmConfig", [(n, c, field(c(), f"Method {n}'s settings ({METHOD_DIR}/{n}.py).")) for n, c in sections().items()],
    bases=(BuiltinAlgorithmConfig,))
AlgorithmConfig.__module__ = __name__
AlgorithmConfig.__doc__ = "The algorithm tier: the built-in sections, then one section per method file."

"""The method registry: every training method's one name, the stage that trains it, and the flags
that define it (docs/ARCHITECTURE.md, "Methods").

A method is a config, not a copy of the trainer: `configs/algorithms/<name>.yaml` sets the flags,
and the same trainer runs them all. Which script trains it says what kind it is: 05 trains every
method with an SFT term (red, fixed_sft, matched_sft, and sft, which has nothing else), 06 every
pure-RL method (grpo, rloo, gspo, red_paper); each refuses the other's methods. The name is the single spelling used everywhere: the config
file, the trainer's output folder (`05_train_red_grpo/<name>/` or `06_ablate_grpo_only/<name>/`), the evaluation folder
(`07_evaluate/<name>/`) and the report's rows. Two evaluated checkpoints are not methods: `base`
(the bare base model) and `sft_warmup` (04's adapter, the start of every method).

`contradictions` refuses a config whose flags say another method than its `method` label, e.g.
`--algorithm red --set algorithm.sft.enabled=false` (that is grpo, and must not be filed as red).

`rloo` and `gspo` are grpo with another advantage (leave-one-out baseline) or another policy loss
(one clipped ratio per sequence): the field's variants for comparison beside the RED study. They
are not part of `09_driver.py --method all`, whose arms are the RED study's (`in_study`); they run
by name on the same run and seeds, and 08 compares them with the rest.

`red_paper` is RED as the RED paper's public code has it, beside `red` as RED-CoDA has it: the
question's expert trace takes one place in its GRPO group and is trained through the policy loss
(docs/ARCHITECTURE.md, "Methods"; utils/train/losses.py `red_paper_loss`). It runs by name.

`matched_sft` is the weight-matched control for red: a constant SFT weight equal to α times red's
mean `red/final_weight` over the same seed's red run, read from that run after it finishes. red vs
fixed_sft mixes "dynamic" with "more SFT"; red vs matched_sft isolates the dynamics.
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Method:
    name: str
    trainer: str  # the numbered script that trains it
    rl: bool  # algorithm.rl.enabled
    sft: bool  # algorithm.sft.enabled
    dynamic: bool | None  # RED weighting on (algorithm.red.G > 1) or off (G == 1); None: no SFT term in RL
    summary: str
    matched: bool = False  # algorithm.sft.match_red: the constant weight is red's mean weight (same seed)
    needs: tuple[str, ...] = ()  # methods whose outputs this one reads (the driver runs them first)
    policy_loss: str = "ppo_clip"  # algorithm.rl.policy_loss
    loo: bool = False  # algorithm.rl.adv_scaling is "rloo" (leave-one-out baseline) for this method only
    in_study: bool = True  # one of the RED study's arms: run by `09_driver.py --method all`
    offline: bool = False  # algorithm.red_paper.offline: expert traces enter the groups (red_paper)


METHODS: dict[str, Method] = {m.name: m for m in (
    Method("red", "05_train_red_grpo", True, True, True, "GRPO + SFT term weighted by RED (G > 1)"),
    Method("grpo", "06_ablate_grpo_only", True, False, None, "GRPO, no SFT term"),
    Method("fixed_sft", "05_train_red_grpo", True, True, False, "GRPO + constant-weight SFT term (G = 1)"),
    Method("matched_sft", "05_train_red_grpo", True, True, False,
           "GRPO + constant SFT weight equal to red's mean weight in the same seed's run (G = 1)",
           matched=True, needs=("red",)),
    Method("sft", "05_train_red_grpo", False, True, None, "the SFT term alone, no rollouts"),
    Method("rloo", "06_ablate_grpo_only", True, False, None, "GRPO with RLOO's leave-one-out advantage, no SFT term",
           loo=True, in_study=False),
    Method("gspo", "06_ablate_grpo_only", True, False, None, "GSPO: one clipped ratio per sequence, no SFT term",
           policy_loss="gspo", in_study=False),
    Method("red_paper", "06_ablate_grpo_only", True, False, None,
           "RED as its paper's code has it: expert traces inside the GRPO groups, accuracy-aware ratio, "
           "entropy-change weight on their advantages; no SFT term, no KL", offline=True, in_study=False),
)}
STUDY = tuple(m.name for m in METHODS.values() if m.in_study)  # `09_driver.py --method all`
BASE = "base"  # the bare base model, evaluated by 07
SFT_WARMUP = "sft_warmup"  # 04's adapter, evaluated by 07
# The study's positive control: CONTROL − sft_warmup is the effect the setup must detect. 08 tests it
# alone (a family of one), so its verdict does not depend on which other arms a run trained.
CONTROL = "grpo"
CHECKPOINTS = (*METHODS, SFT_WARMUP, BASE)  # what 07 --checkpoint accepts by name, in report order


def contradictions(alg) -> list[str]:
    """What in an AlgorithmConfig contradicts its `method` label (empty: consistent)."""
    m = METHODS.get(alg.method)
    if m is None:
        return [f"unknown method '{alg.method}'"]
    return contradictions_with(alg, m)


def contradictions_with(alg, m: Method) -> list[str]:
    """What in an AlgorithmConfig's flags contradicts method `m`'s (empty: the flags are m's)."""
    out = []
    if alg.rl.enabled != m.rl:
        out.append(f"algorithm.rl.enabled={str(alg.rl.enabled).lower()} (method '{m.name}' has it "
                   f"{str(m.rl).lower()})")
    if alg.sft.enabled != m.sft:
        out.append(f"algorithm.sft.enabled={str(alg.sft.enabled).lower()} (method '{m.name}' has it "
                   f"{str(m.sft).lower()})")
    if m.dynamic is True and alg.red.G <= 1:
        out.append(f"algorithm.red.G={alg.red.G} (method 'red' needs G > 1; G = 1 is fixed_sft)")
    if m.dynamic is False and alg.red.G != 1:
        out.append(f"algorithm.red.G={alg.red.G} (method '{m.name}' needs G = 1; G > 1 is red)")
    if alg.sft.match_red != m.matched:
        out.append(f"algorithm.sft.match_red={str(alg.sft.match_red).lower()} (method '{m.name}' has it "
                   f"{str(m.matched).lower()})")
    if alg.rl.policy_loss != m.policy_loss:
        out.append(f"algorithm.rl.policy_loss={alg.rl.policy_loss} (method '{m.name}' has {m.policy_loss})")
    if alg.red_paper.offline != m.offline:
        out.append(f"algorithm.red_paper.offline={str(alg.red_paper.offline).lower()} (method '{m.name}' has it "
                   f"{str(m.offline).lower()})")
    if m.offline and alg.rl.tis_cap > 0:
        out.append(f"algorithm.rl.tis_cap={alg.rl.tis_cap} (method '{m.name}' trains expert tokens, which have no "
                   f"sampler probabilities to weight; set it to 0)")
    if (alg.rl.adv_scaling == "rloo") != m.loo:
        want = "rloo" if m.loo else "group, batch or none"
        out.append(f"algorithm.rl.adv_scaling={alg.rl.adv_scaling} (method '{m.name}' has {want})")
    return out


def implied_method(alg) -> str | None:
    """The registered method whose flags the config has, if any."""
    for m in METHODS.values():
        if not contradictions_with(alg, m):
            return m.name
    return None

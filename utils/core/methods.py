"""The method registry: every training method's one name, what it is beyond its config, and the
flags that say which method a config is (docs/ARCHITECTURE.md, "Methods").

A method is a config, not a copy of the trainer, and each of its facts is written once:
- its flags and hyperparameters in `configs/algorithms/<name>.yaml` (`method_flags` reads the flags
  from there; nothing else restates them);
- its summary, the methods it needs first and whether the study runs it, in `METHODS` below;
- its trainer follows from its flags: 05 trains every method with an SFT term, 06 every pure-RL
  method; each refuses the other's methods. `python -m utils.core.methods` prints the table (name,
  trainer, study arm, what it needs first, summary) from `METHODS`, the one list there is.
The name is the single spelling used everywhere: the config file, the trainer's output folder
(`05_train_red_grpo/<name>/` or `06_ablate_grpo_only/<name>/`), the evaluation folder
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
from functools import cache

from utils.core.method_files import method_files
from utils.core.registry import Registry

SFT_TRAINER = "05_train_red_grpo"  # every method with an SFT term
RL_TRAINER = "06_ablate_grpo_only"  # every pure-RL method
TRAINERS = (SFT_TRAINER, RL_TRAINER)


@dataclass(frozen=True)
class Method:
    """What a method is beyond its config: its config file configs/algorithms/<name>.yaml holds its
    flags and hyperparameters (read by `flags`), and its trainer follows from them."""
    name: str
    summary: str
    needs: tuple[str, ...] = ()  # methods whose outputs this one reads (the driver runs them first)
    in_study: bool = True  # one of the RED study's arms: run by `09_driver.py --method all`

    @property
    def flags(self) -> dict:
        return method_flags(self.name)

    @property
    def trainer(self) -> str:
        """The numbered script that trains it: 05 if it has an SFT term, else 06."""
        return SFT_TRAINER if self.flags["sft"] else RL_TRAINER


_BUILTIN = {m.name: m for m in (
    Method("red", "GRPO + SFT term weighted by RED (G > 1)"),
    Method("grpo", "GRPO, no SFT term"),
    Method("fixed_sft", "GRPO + constant-weight SFT term (G = 1)"),
    Method("matched_sft", "GRPO + constant SFT weight equal to red's mean weight in the same seed's run (G = 1)",
           needs=("red",)),
    Method("sft", "the SFT term alone, no rollouts"),
    Method("rloo", "GRPO with RLOO's leave-one-out advantage, no SFT term", in_study=False),
    Method("gspo", "GSPO: one clipped ratio per sequence, no SFT term", in_study=False),
    Method("red_paper", "RED as its paper's code has it: expert traces inside the GRPO groups, accuracy-aware "
                        "ratio, entropy-change weight on their advantages; no SFT term, no KL", in_study=False),
    Method("chord_mu", "CHORD-μ: (1 − μ)·GRPO + μ·SFT, μ decaying on a cosine from 0.9 to 0.05", in_study=False),
    Method("chord_phi", "CHORD-φ: (1 − μ)·GRPO + μ·SFT at μ = 0.1, each SFT token weighted by p·(1 − p)",
           in_study=False),
    Method("joint", "RED co-training from the base model, no warmup: SFT and RL together from the first step, at "
                    "the SFT→RL path's optimizer steps and demonstrations", in_study=False),
    Method("srft", "SRFT: demonstrations in the groups (shaped ratio) and as SFT weighted by exp(−H); rollouts by "
                   "REINFORCE, 0.1·exp(H) when right, −1 when wrong", in_study=False),
    Method("srft_clamped", "SRFT with the released loss's clamp on (no released script runs it): srft, but a wrong "
                           "rollout adds no gradient (its advantage 0, its tokens still in the mean)", in_study=False),
)}
for _mf in method_files():  # then each method that lives in one file (utils/core/method_files.py)
    if _mf.name in _BUILTIN:
        raise ValueError(f"{_mf.path}: method '{_mf.name}' is already registered in utils/core/methods.py")
METHODS: Registry[Method] = Registry("method", {**_BUILTIN, **{
    mf.name: Method(mf.name, mf.method["summary"], tuple(mf.method["needs"]), mf.method["in_study"])
    for mf in method_files()}})
# Methods renamed after runs were archived under the old name: 08 reads an archived evaluation or
# trainer by its new name (utils/eval/compare.py). srft_released was called the released form, but
# the released SRFT script turns the clamp off (docs/METHODS.md, SRFT's departures).
RENAMED = {"srft_released": "srft_clamped"}
STUDY = tuple(m.name for m in METHODS.values() if m.in_study)  # `09_driver.py --method all`
BASE = "base"  # the bare base model, evaluated by 07
SFT_WARMUP = "sft_warmup"  # 04's adapter, evaluated by 07
# The study's positive control: CONTROL − sft_warmup is the effect the setup must detect. 08 tests it
# alone (a family of one), so its verdict does not depend on which other arms a run trained.
CONTROL = "grpo"
CHECKPOINTS = (*METHODS, SFT_WARMUP, BASE)  # what 07 --checkpoint accepts by name, in report order


def defining_flags(alg) -> dict:
    """The settings of an AlgorithmConfig that say which method it is, as (setting, value) by flag:
    rl and sft on or off, how the SFT term is weighted (RED or CHORD) where RL has one, RED weighting
    on (G > 1) or off (G = 1), CHORD's φ, the matched weight, the policy loss, red_paper's offline
    traces, SRFT and whether it trains wrong rollouts, where RL starts
    (the warmup or the base), RLOO's advantage, and each method file's `enabled`
    (utils/core/method_files.py)."""
    both = alg.rl.enabled and alg.sft.enabled
    weighting = alg.sft.weighting if both else None
    return {"rl": ("algorithm.rl.enabled", alg.rl.enabled), "sft": ("algorithm.sft.enabled", alg.sft.enabled),
            "weighting": ("algorithm.sft.weighting", weighting),
            "dynamic": ("algorithm.red.G", alg.red.G > 1 if weighting == "red" else None),
            "phi": ("algorithm.chord.phi", alg.chord.phi if weighting == "chord" else None),
            "srft": ("algorithm.srft.enabled", alg.srft.enabled),
            "srft_wrong": ("algorithm.srft.negative_coef", alg.srft.negative_coef < 0 if alg.srft.enabled else None),
            "init": ("algorithm.rl.init", alg.rl.init),
            "matched": ("algorithm.sft.match_red", alg.sft.match_red),
            "policy_loss": ("algorithm.rl.policy_loss", alg.rl.policy_loss),
            "offline": ("algorithm.red_paper.offline", alg.red_paper.offline),
            "loo": ("algorithm.rl.adv_scaling", alg.rl.adv_scaling == "rloo"),
            **{mf.name: (f"algorithm.{mf.name}.enabled", getattr(alg, mf.name).enabled) for mf in method_files()}}


@cache
def method_flags(name: str) -> dict:
    """flag -> value of method `name`, read from configs/algorithms/<name>.yaml over the schema's
    defaults: the one place a method's flags are written."""
    from utils.core.config import from_dict, read_yaml, tier_path
    from utils.core.schema import AlgorithmConfig  # the schema imports this registry for its choices

    path = tier_path("algorithms", name)
    body = read_yaml(path)
    body.pop("run", None)
    return {k: v for k, (_, v) in defining_flags(from_dict(AlgorithmConfig, body, str(path))).items()}


def contradictions(alg) -> list[str]:
    """What in an AlgorithmConfig contradicts its `method` label (empty: consistent)."""
    if alg.method not in METHODS:
        return [f"unknown method '{alg.method}'"]
    m = METHODS[alg.method]
    return contradictions_with(alg, m)


def _shown(value) -> str:
    return str(value).lower() if isinstance(value, bool) else str(value)


def contradictions_with(alg, m: Method) -> list[str]:
    """What in an AlgorithmConfig's flags contradicts method `m`'s (empty: the flags are m's)."""
    out = []
    for flag, (key, value) in defining_flags(alg).items():
        want = m.flags[flag]
        if flag in ("weighting", "phi") and None in (want, value):  # only where both weigh an SFT term
            continue
        if flag == "dynamic":  # only where both have RL with an SFT term (else rl or sft disagrees)
            if None not in (want, value) and value != want:
                out.append(f"{key}={alg.red.G} (method '{m.name}' needs " +
                           ("G > 1; G = 1 is fixed_sft)" if want else "G = 1; G > 1 is red)"))
        elif flag == "srft_wrong":  # only where both are SRFT (else srft disagrees)
            if None not in (want, value) and value != want:
                out.append(f"{key}={alg.srft.negative_coef} (method '{m.name}' needs " +
                           ("it below 0; 0 is srft_clamped)" if want else "0; below 0 is srft)"))
        elif flag == "loo" and value != want:
            out.append(f"{key}={alg.rl.adv_scaling} (method '{m.name}' has "
                       f"{'rloo' if want else 'group, batch or none'})")
        elif flag == "policy_loss" and value != want:
            out.append(f"{key}={value} (method '{m.name}' has {want})")
        elif value != want:
            out.append(f"{key}={_shown(value)} (method '{m.name}' has it {_shown(want)})")
    own = next((mf for mf in method_files() if mf.name == m.name), None)  # a method in one file
    if (m.flags["offline"] or m.flags["srft"] or (own and own.method["demonstration_tokens"])) and alg.rl.tis_cap > 0:
        out.append(f"algorithm.rl.tis_cap={alg.rl.tis_cap} (method '{m.name}' trains expert tokens, which have no "
                   f"sampler probabilities to weight; set it to 0)")
    return out


def implied_method(alg) -> str | None:
    """The registered method whose flags the config has, if any."""
    for m in METHODS.values():
        if not contradictions_with(alg, m):
            return m.name
    return None


def trained_by(trainer: str) -> list[str]:
    """The registered methods `trainer` (05 or 06) trains, in registry order."""
    return [m.name for m in METHODS.values() if m.trainer == trainer]


def table() -> list[str]:
    """The registry as a plain-text table, one method a line."""
    lines = [f"{'method':<14} {'trains in':<20} {'study':<6} {'needs':<6} summary"]
    for m in METHODS.values():
        lines.append(f"{m.name:<14} {m.trainer:<20} {'yes' if m.in_study else 'no':<6} "
                     f"{','.join(m.needs) or '-':<6} {m.summary}")
    return lines


if __name__ == "__main__":
    print("\n".join(table()))

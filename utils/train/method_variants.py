"""Which step variants (utils/train/variants.py) a run's config turns on: each joint method's wiring
into the step (red_paper's expert traces, HPT's switch, SRFT's demonstrations in the groups, ReLIFT's
buffer) and process rewards, so that the loop (utils/train/grpo_trainer.py) names no method."""
from __future__ import annotations

from utils.train.hpt import DemoSwitch
from utils.train.red_paper import ExpertTraces
from utils.train.relift import HardBuffer
from utils.train.srft import DemoGroups
from utils.train.state import TrainState
from utils.train.variants import ProcessRewards, StepVariant


def active_variants(alg, spec, offline: dict, prm=None, state: TrainState | None = None) -> list[StepVariant]:
    """The variants a run's config turns on, in hook order: expert traces (algorithm.red_paper.offline,
    with the traces `offline` read; utils/train/red_paper.py), HPT's switch to demonstrations
    (algorithm.hpt.enabled, the same traces; utils/train/hpt.py), SRFT's demonstrations in the groups
    (algorithm.srft.enabled; utils/train/srft.py), ReLIFT's buffer of failed questions (algorithm.relift,
    kept in `state`; utils/train/relift.py), then process rewards
    (reward.process.source; utils/train/variants.py)."""
    out: list[StepVariant] = []
    if alg.red_paper.offline and offline:
        out.append(ExpertTraces(offline, spec, alg.rl.n_samples))
    if alg.hpt.enabled:
        out.append(DemoSwitch(offline, alg.hpt.gate, alg.rl.n_samples))
    if alg.srft.enabled and offline:
        out.append(DemoGroups(offline, spec, alg.rl.n_samples))
    if alg.relift.enabled:
        out.append(HardBuffer(offline, alg.relift.buffer_size, alg.rl.n_samples, state or TrainState()))
    if spec.process.source != "none":
        out.append(ProcessRewards(spec.process.source, alg.rl, prm))
    return out

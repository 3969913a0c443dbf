"""Each joint method's wiring into the RL step, so that the loop (utils/train/grpo_trainer.py) and the
update (utils/train/update.py) name no method: which step variants (utils/train/variants.py) a run's
config turns on (red_paper's expert traces, SRFT's demonstrations in the groups, process
rewards), and which method's own policy loss an RL micro-batch takes in
place of the registered `algorithm.rl.policy_loss` (`piece_loss`). A method that lives in one file
(utils/train/methods/<name>.py, utils/core/method_files.py) brings both through its own `variants`
and `piece` functions, called here when its section is enabled: nothing here names it."""
from __future__ import annotations

from importlib import import_module

from utils.core.method_files import METHOD_DIR, enabled
from utils.train.red_paper import ExpertPiece, ExpertTraces
from utils.train.srft import DemoGroups, SrftPiece
from utils.train.state import TrainState
from utils.train.variants import ProcessRewards, StepVariant


def active_variants(alg, spec, offline: dict, prm=None, state: TrainState | None = None) -> list[StepVariant]:
    """The variants a run's config turns on, in hook order: expert traces (algorithm.red_paper.offline,
    with the traces `offline` read; utils/train/red_paper.py), SRFT's demonstrations in the groups
    (algorithm.srft.enabled; utils/train/srft.py), each method file's that the config turns on (its
    `variants(alg, spec, offline, state)`), then process rewards (reward.process.source;
    utils/train/variants.py)."""
    out: list[StepVariant] = []
    if alg.red_paper.offline and offline:
        out.append(ExpertTraces(offline, spec, alg.rl.n_samples))
    if alg.srft.enabled and offline:
        out.append(DemoGroups(offline, spec, alg.rl.n_samples))
    for mf in enabled(alg):  # each method that lives in one file, in name order
        out += getattr(_module(mf.name), "variants", lambda *a: [])(alg, spec, offline, state or TrainState())
    if spec is not None and spec.process.source != "none":  # None: a trainer built for its update alone
        out.append(ProcessRewards(spec.process.source, alg.rl, prm))
    return out


def piece_loss(alg, experts: bool):
    """A method's own policy loss for the update's RL micro-batches, or None for the registered one
    (utils/train/losses.py POLICY_LOSSES): a method file's when the config turns it on and its
    `piece(alg, experts)` returns one, SRFT's when its config turns it on, red_paper's when the
    batch holds expert rows (`experts`, counted over every rank). Each has `prepare(model, batch,
    norms, memory, world, pieces)`, called once before the pieces, and `loss(part, logp, old_lp, ent,
    h_rl, norms, agg, piece_state, tally)` -> (loss, stats, each stat's weight), stats named as logged
    (a name without a "/" goes under actor/)."""
    for mf in enabled(alg):
        piece = getattr(_module(mf.name), "piece", lambda *a: None)(alg, experts)
        if piece is not None:
            return piece
    if alg.srft.enabled:
        return SrftPiece(alg.srft)
    if experts:
        return ExpertPiece(alg)
    return None


def _module(name: str):
    """The method file `name` (utils/core/method_files.py), imported by its name: the files the schema
    read are the files the step calls."""
    return import_module(f"{METHOD_DIR.replace('/', '.')}.{name}")

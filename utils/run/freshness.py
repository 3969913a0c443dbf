"""What a difference between a stage's recorded config slice and today's means for the driver: which
differences leave the stage up to date, and how to name one that does not.

Three kinds keep a stage (each with a reason the driver prints): a setting the code gained after the
stage ran, left at its schema default; a setting that changes only what a step logs
(`RESULT_NEUTRAL`); and an evaluation that ran a pass@k curve pass (eval.curve_samples) a plain
evaluation is now asked for, since 07 samples the curve after the greedy and mean@k passes and apart
from them, so those figures are the plain evaluation's bit for bit (docs/ARCHITECTURE.md "Stages").
Anything else re-runs the stage.

The first rests on a rule for every new setting: its schema default keeps the code's behaviour from
before it. Each added so far was checked to train bit for bit as before (`ppo_minibatches`,
`max_subtasks`, `stratify` and `lr_warmup_steps` on 3 red steps from a val warmup: the same adapter
digest), so an upgrade does not retrain every run folder.
"""
from __future__ import annotations

import json

from utils.run.diff import flatten, key_changes

RESULT_NEUTRAL = ("algorithm.rl.mismatch_every",)  # changes what a step logs, never what it trains or writes
CURVE = "eval.curve_samples"
CURVE_ONLY = (CURVE, "algorithm.rl.temperature")  # what 07's slice gains with a curve pass (utils/core/stages.py)


def _flat(config: dict) -> dict:
    return flatten(json.loads(json.dumps(config)))  # as a manifest records it (tuples become lists)


def config_changes(recorded: dict, now: dict, shown: int = 3) -> str:
    """What differs between a manifest's recorded config slice and the one a run would use now, as
    dotted keys: `key old → new`, `key added (= value)` (a setting the recorded run did not have,
    e.g. one a newer version of the code introduced) or `key removed`; the first `shown`, then how
    many more."""
    old, new = _flat(recorded), _flat(now)
    say = {"added": lambda k: f"{k} added (= {new[k]!r})", "removed": lambda k: f"{k} removed",
             "changed": lambda k: f"{k} {old[k]!r} → {new[k]!r}"}
    changes = [say[kind](key) for key, kind in key_changes(old, new)]
    more = f" and {len(changes) - shown} more" if len(changes) > shown else ""
    return ", ".join(changes[:shown]) + more if changes else "the config hash differs"


def schema_defaults() -> dict[str, object]:
    """Every setting's schema default, by dotted key (utils/core/schema.py)."""
    from utils.core.config import to_dict
    from utils.core.schema import RunConfig

    return _flat(to_dict(RunConfig()))


def without_new_defaults(recorded: dict, now: dict) -> tuple[dict, str]:
    """`now` without the settings the recorded slice lacks and that sit at their schema default, and
    their names. A setting the code gained after a stage ran, left at its default, does not make the
    stage stale: a new setting's default must keep the behaviour the code had before it (every one
    so far has been checked to train bit for bit as before; docs/ARCHITECTURE.md)."""
    out = json.loads(json.dumps(now))
    old, new, defaults = _flat(recorded), flatten(out), schema_defaults()
    dropped = [k for k in new if k not in old and k in defaults and new[k] == defaults[k]]
    for key in dropped:
        *path, leaf = key.split(".")
        parents = [out]
        for part in path:
            parents.append(parents[-1][part])
        del parents[-1][leaf]
        for depth in range(len(path), 0, -1):  # a section left empty goes too, as the recorded one lacks it
            if parents[depth]:
                break
            del parents[depth - 1][path[depth - 1]]
    return out, ", ".join(sorted(dropped))


def kept_despite(recorded: dict, now: dict) -> str | None:
    """Why a stage whose recorded slice differs from `now` is still up to date, as the note the
    driver prints, or None when it must run again. Kept: a difference only in `RESULT_NEUTRAL`
    settings, or a recorded curve pass (eval.curve_samples = n > 0) where `now` asks for none and
    is otherwise the same; an evaluation asked for a curve it lacks, or for another n, re-runs."""
    old, new = _flat(recorded), _flat(now)
    if {k: v for k, v in old.items() if k not in RESULT_NEUTRAL} == {k: v for k, v in new.items()
                                                                       if k not in RESULT_NEUTRAL}:
        return f"differs only in what a step logs: {config_changes(recorded, now)}"
    if old.get(CURVE) and not new.get(CURVE):
        extra = [k for k in CURVE_ONLY if k not in new]
        if {k: v for k, v in old.items() if k not in extra} == new:
            return (f"holds a pass@k curve ({CURVE} = {old[CURVE]}) beside the figures asked for; kept "
                    f"(07 by hand replaces it)")
    return None

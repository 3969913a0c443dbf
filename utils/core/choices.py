"""The value sets that config fields accept (`choices` in utils/core/schema.py).

A set that names a registry's entries is read from that registry's source, not written twice: the
schema lives in `core` and is parsed before any stage imports torch or an engine, so it cannot import
the registry, but it can read the module's text. `registry_names` parses the file (the standard
library's `ast`, a few milliseconds) and takes the keys of the `Registry(...)` literal assigned to the
named variable: a dict with string keys, or a comprehension over constructor calls whose first
argument is the name. A registry written any other way is refused here, naming its file, so adding a
variant is its registry entry alone (docs/EXTENDING.md). tests/test_config.py checks that every set
read this way equals the imported registry's keys. The other sets below are plain branches in the
code they name, with no registry to read.
"""
from __future__ import annotations

import ast
from functools import lru_cache
from pathlib import Path

_ROOT = Path(__file__).resolve().parents[2]


def registry_names(module: str, variable: str, root: Path = _ROOT) -> tuple[str, ...]:
    """The names of the `Registry(what, {...})` assigned to `variable` in `module` (a path from the
    repository root), in source order, without importing the module."""
    node = _assignment(module, variable, root)
    names = _literal_names(node.value)
    if names is None:
        raise ValueError(f"{module}:{node.lineno}: {variable} must be Registry(what, {{'name': entry, ...}}) or "
                         f"Registry(what, {{x.name: x for x in (Kind('name', ...), ...)}}) so that the config "
                         f"schema can read its names without importing it (utils/core/choices.py)")
    return names


def registry_levels(module: str, variable: str, root: Path = _ROOT) -> dict[str, str]:
    """For a registry whose entries are `(function, "level")` tuples, like `POLICY_LOSSES`: each name's
    level string, read from the source as `registry_names` reads the names."""
    node = _assignment(module, variable, root)
    entries = node.value.args[1] if isinstance(node.value, ast.Call) and len(node.value.args) == 2 else None
    levels = {k.value: v.elts[-1].value for k, v in zip(entries.keys, entries.values)
              if isinstance(v, ast.Tuple) and isinstance(v.elts[-1], ast.Constant)} \
        if isinstance(entries, ast.Dict) else {}
    if set(levels) != set(registry_names(module, variable, root)):
        raise ValueError(f"{module}:{node.lineno}: every entry of {variable} must be (function, \"level\") "
                         f"so that the config can read its level without importing it (utils/core/choices.py)")
    return levels


def _assignment(module: str, variable: str, root: Path):
    """The top-level assignment to `variable` in `module`'s source."""
    for node in _body(root / module):
        targets = node.targets if isinstance(node, ast.Assign) else [getattr(node, "target", None)]
        if any(isinstance(t, ast.Name) and t.id == variable for t in targets):
            return node
    raise ValueError(f"{module}: no top-level assignment to {variable} (utils/core/choices.py reads it there)")


@lru_cache(maxsize=None)
def _body(path: Path) -> list:
    return ast.parse(path.read_text(), str(path)).body


def _literal_names(value) -> tuple[str, ...] | None:
    if not (isinstance(value, ast.Call) and len(value.args) == 2):
        return None
    entries = value.args[1]
    if isinstance(entries, ast.Dict):
        keys = [k.value if isinstance(k, ast.Constant) else None for k in entries.keys]
    elif isinstance(entries, ast.DictComp) and isinstance(entries.generators[0].iter, (ast.Tuple, ast.List)):
        calls = entries.generators[0].iter.elts
        keys = [c.args[0].value if isinstance(c, ast.Call) and c.args and isinstance(c.args[0], ast.Constant)
                else None for c in calls]
    else:
        return None
    return tuple(keys) if keys and all(isinstance(k, str) for k in keys) else None


DTYPES = ("float32", "bfloat16", "float16")
ENGINE_NAMES = registry_names("utils/agent/engines.py", "ENGINES")
LORA_SERVING = ("adapter", "merged")  # utils/agent/engines.py VLLMEngine
LORA_FORWARDS = registry_names("utils/train/lora_fast.py", "FORWARDS")
LOSS_AGGS = registry_names("utils/train/losses.py", "AGGREGATIONS")
ADV_SCALINGS = registry_names("utils/train/losses.py", "ADVANTAGES")
POLICY_LOSS_NAMES = registry_names("utils/train/losses.py", "POLICY_LOSSES")
POLICY_LOSS_LEVELS = registry_levels("utils/train/losses.py", "POLICY_LOSSES")  # "token" or "sequence"
SFT_WEIGHTINGS = registry_names("utils/train/sft_weights.py", "SFT_WEIGHTINGS")
SCORER_NAMES = registry_names("utils/reward/scorers.py", "SCORERS")
ADAPTER_NAMES = registry_names("utils/data/adapters.py", "ADAPTERS")
RETRIEVER_NAMES = ("none", *registry_names("utils/agent/retrieval.py", "RETRIEVERS"))  # or no tool
TRACE_SOURCE_NAMES = registry_names("utils/data/trace_sources.py", "TRACE_SOURCES")
TRAIN_ROLES = ("both", "planner", "executor")  # utils/train/batch.py build_rl_batch
REFILLS = ("rounds", "pipelined")  # utils/train/sampler.py DynamicSampler
RL_INITS = ("warmup", "base")  # utils/train/rl_stage.py build_trainer
INDEPENDENCE_REFS = (r"\b(it|its|this|that|these|those|above|previous|prior|earlier|last|same|former|latter)\b"
                     r"|\bthe (result|answer|output|value)s?\b|\bstep\s*\d+|#\d+|<result>")
OFFLINE_SHIFTS = ("accuracy", "none")  # utils/train/losses.py offline_ratio
THINKING_MODES = ("plain", "actor_critic")  # utils/agent/protocol.py split_actor_critic
PRIMARY_METRICS = ("greedy", "mean_at_k")  # utils/eval/evaluation.py, 08's paired tests
LEAKAGE_POLICIES = ("drop_from_train", "warn", "error")  # utils/data/prepare.py

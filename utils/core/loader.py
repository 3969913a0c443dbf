"""Assemble a RunConfig (utils/core/schema.py) from its sources, in this order, each over the last:

1. the three tiers: configs/models/, configs/algorithms/ and configs/data/;
2. the tiers' `run:` sections: run-level defaults that belong with a tier, e.g. the warmup length
   the embedded task was tuned with (configs/data/synthetic_arith.yaml);
3. the regime, configs/regimes/<regime>.yaml: run-level settings of a named experimental regime
   (how the demonstrations are made, what 08 tests, how RL samples). A data tier's `run:` names
   its default; a run-level YAML or `--set regime=NAME` picks another. The method's own
   `algorithm.rl` settings then go over the regime's: they are what the method is (`joint`'s steps
   and learning-rate schedule), where the regime's are the setting every method shares;
4. the optional run-level YAML (`--config`);
5. the `--set` overrides.

It then refuses a method label that its flags contradict (utils/core/methods.py), process rewards
on a method that cannot take them, and a run id that would write outside outputs_dir.
"""
from __future__ import annotations

import re
from pathlib import Path

from utils.core.choices import POLICY_LOSS_LEVELS
from utils.core.config import ROOT, ConfigError, apply_overrides, deep_merge, from_dict, read_yaml, tier_path
from utils.core.method_files import wants
from utils.core.methods import contradictions, implied_method
from utils.core.schema import RunConfig


def load_run_config(model: str = "tiny-arith", algorithm: str = "red", data: str = "synthetic_arith",
                    overrides: list[str] | None = None, run: str | None = None) -> RunConfig:
    """The run's config from its tiers, their `run:` sections, the regime, the run-level YAML `run`
    and the `overrides` (`a.b=value`), each over the last."""
    return config_from_layers(config_layers(model, algorithm, data, overrides, run))


def config_from_layers(layers: list[tuple[str, dict]]) -> RunConfig:
    """Merge `config_layers`' output in order, parse it, and refuse what no layer may say alone."""
    tree: dict = {}
    for _, layer in layers:
        tree = deep_merge(tree, layer)
    cfg = from_dict(RunConfig, tree, "config")
    problems = contradictions(cfg.algorithm)
    if problems:
        other = implied_method(cfg.algorithm)
        hint = f"; these flags are method '{other}': use --algorithm {other}" if other else ""
        raise ConfigError(f"algorithm.method '{cfg.algorithm.method}' contradicts {'; '.join(problems)}{hint}")
    check_process(cfg)
    check_minibatches(cfg)
    check_init(cfg)
    check_lora_rank(cfg)
    check_run_id(cfg.run_id)
    return cfg


def config_layers(model: str = "tiny-arith", algorithm: str = "red", data: str = "synthetic_arith",
                  overrides: list[str] | None = None, run: str | None = None) -> list[tuple[str, dict]]:
    """(source, partial tree) for every layer of the config, in merge order; each layer is checked
    against the schema here, so an error names its file."""
    tiers, tier_runs = [], []
    for key, tier, name in (("model", "models", model), ("algorithm", "algorithms", algorithm),
                            ("data", "data", data)):
        path = tier_path(tier, name)
        body = read_yaml(path)
        section = body.pop("run", None)
        from_dict(type(getattr(RunConfig(), key)), body, str(path))  # fail early, naming the file
        tiers.append((_shown(path), {key: body}))
        if section is not None:
            if not isinstance(section, dict) or set(section) & {"model", "algorithm", "data"}:
                raise ConfigError(f"{path}: 'run' must be a mapping of run-level sections (e.g. traces, warmup, "
                                  f"regime), not of the model, algorithm or data tiers")
            from_dict(RunConfig, section, f"{path} (run)")
            tier_runs.append((f"{_shown(path)} (run:)", section))
    layers = tiers + tier_runs
    run_tree = {}
    if run:
        run_tree = read_yaml(Path(run))
        from_dict(RunConfig, run_tree, run)
    overrides = overrides or []
    set_tree: dict = {}
    apply_overrides(set_tree, overrides, RunConfig)
    regime = _chosen_regime([t for _, t in tier_runs], run_tree, set_tree)
    if regime:
        regime_tree = read_regime(regime)
        layers.append((_shown(tier_path("regimes", regime)), regime_tree))
        regime_rl = (regime_tree.get("algorithm") or {}).get("rl") or {}
        method_rl = {k: v for k, v in (tiers[1][1]["algorithm"].get("rl") or {}).items() if k in regime_rl}
        if method_rl:  # the method's own RL settings over the regime's
            layers.append((f"{tiers[1][0]} (over the regime)", {"algorithm": {"rl": method_rl}}))
    if run:
        layers.append((run, run_tree))
    if overrides:
        layers.append(("--set", set_tree))
    return layers


def config_sources(layers: list[tuple[str, dict]]) -> dict[str, str]:
    """Dotted key -> the last layer that sets it."""
    sources: dict[str, str] = {}

    def walk(node: dict, prefix: str, source: str) -> None:
        for key, value in node.items():
            if isinstance(value, dict):
                walk(value, f"{prefix}{key}.", source)
            else:
                sources[f"{prefix}{key}"] = source
    for source, tree in layers:
        walk(tree, "", source)
    return sources


def _shown(path: Path) -> str:
    """A config file as --help-config names it: relative to the repo where it lies inside it."""
    try:
        return str(path.resolve().relative_to(ROOT))
    except ValueError:
        return str(path)


def _chosen_regime(tier_runs: list[dict], run_tree: dict, set_tree: dict) -> str:
    """The regime's name: `--set regime=...` (empty: none), else the run-level YAML's, else the last
    tier `run:` section's that names one."""
    for tree in (set_tree, run_tree, *reversed(tier_runs)):
        if "regime" in tree:
            return str(tree["regime"] or "")
    return ""


def read_regime(name: str) -> dict:
    """The regime `name` (a stem in configs/regimes/ or a YAML path), checked against the schema. A
    regime sets run-level sections, the algorithm's RL sampling included, but no tier, no method and
    no other regime."""
    path = tier_path("regimes", name)
    tree = read_yaml(path)
    algorithm = tree.get("algorithm") or {}
    if "regime" in tree or set(tree) & {"model", "data"} or not isinstance(algorithm, dict) or \
            set(algorithm) - {"rl"}:
        raise ConfigError(f"{path}: a regime sets run-level sections and algorithm.rl only, not 'regime', the "
                          f"model or data tier, or the method's flags")
    from_dict(RunConfig, tree, str(path))
    return tree


def check_process(cfg: RunConfig) -> None:
    """Process rewards give planner tokens their own advantages: only a policy loss registered at the
    token level takes them (utils/train/losses.py POLICY_LOSSES: GSPO's ratio is per sequence), and
    red_paper's expert sequences have no planner turns of their own (nor a method file's that trains
    demonstration tokens, utils/core/method_files.py); SRFT sets its own advantages."""
    alg = cfg.algorithm
    if cfg.reward.process.source == "none" or not alg.rl.enabled:
        return
    if POLICY_LOSS_LEVELS[alg.rl.policy_loss] != "token" or alg.red_paper.offline or alg.srft.enabled \
            or wants(alg, "demonstration_tokens"):
        raise ConfigError(f"reward.process.source={cfg.reward.process.source} needs per-token advantages, which "
                          f"method '{alg.method}' does not take (policy_loss {alg.rl.policy_loss}, red_paper.offline "
                          f"{str(alg.red_paper.offline).lower()}, srft.enabled {str(alg.srft.enabled).lower()}); "
                          f"use it with red, grpo, fixed_sft, matched_sft or rloo")


def check_init(cfg: RunConfig) -> None:
    """RL from the base (algorithm.rl.init base) has no warmup adapter to serve as the KL reference or
    as the process-reward judge."""
    alg = cfg.algorithm
    if alg.rl.init != "base":
        return
    if alg.rl.kl_coef > 0 or cfg.reward.process.source == "judge":
        raise ConfigError(f"algorithm.rl.init=base with algorithm.rl.kl_coef={alg.rl.kl_coef} and reward.process.source="
                          f"{cfg.reward.process.source}: the KL reference and the judge are the SFT warmup's adapter, "
                          f"which a run from the base does not read; set kl_coef=0 and no judge, or init=warmup")


def check_minibatches(cfg: RunConfig) -> None:
    """red_paper's entropy weight compares the expert and the rollout tokens of one batch, which
    minibatches (algorithm.rl.ppo_minibatches > 1) would split between optimizer steps."""
    if cfg.algorithm.rl.ppo_minibatches > 1 and cfg.algorithm.red_paper.offline and cfg.algorithm.rl.enabled:
        raise ConfigError(f"algorithm.rl.ppo_minibatches={cfg.algorithm.rl.ppo_minibatches} with red_paper's expert "
                          f"traces (algorithm.red_paper.offline): their entropy weight needs the expert and rollout "
                          f"tokens in one batch; set algorithm.rl.ppo_minibatches=1")


VLLM_LORA_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)  # vLLM 0.32's LoRAConfig.max_lora_rank values


def uses_vllm(cfg: RunConfig) -> bool:
    """Whether a stage run with `cfg` may start a vLLM engine: its sampler or its process-reward judge."""
    return "vllm" in (cfg.model.engine.name, cfg.reward.process.judge_engine)


def check_lora_rank(cfg: RunConfig) -> None:
    """A vLLM engine that serves the policy's adapter must allow its rank: refused here, before any
    stage runs, instead of at vLLM's first adapter load. Only where an engine is vLLM and serves
    LoRA adapters (not full fine-tuning)."""
    engine, rank = cfg.model.engine, cfg.model.lora.rank
    if not uses_vllm(cfg) or cfg.model.lora.full_finetune:
        return
    if engine.max_lora_rank not in VLLM_LORA_RANKS:
        raise ConfigError(f"model.engine.max_lora_rank={engine.max_lora_rank}: vLLM serves only "
                          f"{', '.join(map(str, VLLM_LORA_RANKS))}")
    if engine.max_lora_rank < rank:
        fit = min(r for r in VLLM_LORA_RANKS if r >= rank) if rank <= VLLM_LORA_RANKS[-1] else None
        fix = f"set model.engine.max_lora_rank={fit}" if fit else "no vLLM rank is that large: use the hf engine"
        raise ConfigError(f"model.engine.max_lora_rank={engine.max_lora_rank} is smaller than model.lora.rank={rank}: "
                          f"vLLM could not load the adapter; {fix}")


_RUN_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*(/[A-Za-z0-9][A-Za-z0-9._-]*)*")


def check_run_id(run_id: str) -> None:
    """A run id names a folder inside outputs_dir: letters, digits, '.', '_', '-', and '/' between
    parts (`study/seed_2`); no absolute path, no '..', no empty part, so no run writes outside it."""
    if not _RUN_ID.fullmatch(run_id) or ".." in run_id.split("/"):
        raise ConfigError(f"run_id {run_id!r}: must name a folder inside outputs_dir (letters, digits, '.', '_', "
                          f"'-', parts joined by '/'; no leading '/', no '..')")


"""The plan behind `09_driver.py`: which stage runs with which arguments, and when it may be skipped.

A stage is skipped (the `dvc repro` rule, DESIGN.md §1) when its manifest says completed, its
config hash equals the hash of the config slice it would run with now, every recorded input
still hashes the same, and every recorded parent manifest still has the same digest. Anything
else (a new config value, a changed input, a re-run parent, a killed run) runs it again.
"""
from __future__ import annotations

import importlib
from dataclasses import dataclass, field
from pathlib import Path

from utils.cli import parse_stage_args
from utils.manifest import MANIFEST_NAME, config_sha256, manifest_digest, path_sha256, read_manifest
from utils.run_config import repo_path
from utils.stages import config_slice, stage_dir

METHODS = ("red", "grpo", "fixed_sft", "sft")
TRAIN_STEP = {"red": ("05_train_red_grpo", "red"), "fixed_sft": ("05_train_red_grpo", "fixed_sft"),
              "sft": ("05_train_red_grpo", "sft"), "grpo": ("06_ablate_grpo_only", "grpo")}
EVAL_NAME = {"red": "red", "fixed_sft": "fixed_sft", "sft": "sft_method", "grpo": "grpo"}


@dataclass
class Step:
    script: str  # module name, e.g. "05_train_red_grpo"
    dir_name: str  # stage directory under the run, e.g. "05_train_red_grpo/red"
    args: list[str] = field(default_factory=list)  # stage-specific arguments
    extra: dict = field(default_factory=dict)  # settings hashed beside the config slice (07)


def plan(methods: list[str]) -> list[Step]:
    steps = [Step(s, s) for s in ("00_check_data", "01_prepare_dataset", "02_build_rewards",
                                  "03_generate_sft_traces", "04_sft_warmup")]
    steps += [Step("07_evaluate", f"07_evaluate/{c}", ["--checkpoint", c], {"checkpoint": c, "pass_k": 0, "limit": 0})
              for c in ("base", "sft")]
    for m in methods:
        script, method = TRAIN_STEP[m]
        steps.append(Step(script, f"{script}/{method}", ["--algorithm", method if method != "grpo" else "grpo"]))
        ckpt = EVAL_NAME[m]
        steps.append(Step("07_evaluate", f"07_evaluate/{ckpt}", ["--checkpoint", ckpt],
                          {"checkpoint": ckpt, "pass_k": 0, "limit": 0}))
    return steps


REPORT = Step("08_compare_runs", "08_compare_runs")


def expected_sha(step: Step, common: list[str]) -> tuple[str, object]:
    module = importlib.import_module(step.script if step.script != "06_ablate_grpo_only" else "05_train_red_grpo")
    argv = [a for a in common + step.args]
    if step.script == "08_compare_runs":  # its settings list the evaluations it would read now
        cfg, _ = parse_stage_args("", argv)
        return config_sha256(module.stage_settings(cfg, [], module.DEFAULT_RESAMPLES)), cfg
    if step.script == "07_evaluate":
        argv = [a for a in argv if a not in ("--checkpoint", step.extra["checkpoint"])]
    cfg, _ = parse_stage_args("", argv)
    return config_sha256({**config_slice(cfg, module.CONFIG_KEYS), **step.extra}), cfg


def up_to_date(step: Step, common: list[str]) -> tuple[Path, bool, str]:
    """(stage directory, skip?, reason) for one step."""
    sha, cfg = expected_sha(step, common)
    directory = stage_dir(cfg, step.dir_name)
    return (directory, *_verdict(directory / MANIFEST_NAME, sha, cfg))


def _verdict(path: Path, sha: str, cfg) -> tuple[bool, str]:
    if not path.is_file():
        return False, "never ran"
    m = read_manifest(path)
    if m.get("status") != "completed":
        return False, f"last run {m.get('status')}"
    if m.get("config_sha256") != sha:
        return False, "config changed"
    for p, digest in m.get("inputs", {}).items():
        if not repo_path(p).exists() or path_sha256(repo_path(p)) != digest:
            return False, f"input changed: {p}"
    for parent, digest in m.get("parents", {}).items():
        ppath = stage_dir(cfg, parent) / MANIFEST_NAME
        if not ppath.is_file() or manifest_digest(read_manifest(ppath)) != digest:
            return False, f"parent re-ran: {parent}"
    return True, "up to date"


def stage_path(common: list[str], step: Step) -> Path:
    _, cfg = expected_sha(step, common)
    return stage_dir(cfg, step.dir_name)

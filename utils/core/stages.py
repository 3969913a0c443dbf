"""What every numbered stage shares: its name, the config keys it reads, its directory, its parents
and its exit codes.

A stage's manifest hashes only the config keys the stage reads (`CONFIG_KEYS`, through
`config_slice`), so changing one value re-runs exactly the stages downstream of it (the `dvc repro`
behaviour, docs/ARCHITECTURE.md "Stages"). The table lives here, below the scripts, so the driver
can compute a stage's hash without importing the script. `run_main` turns user-facing errors into
one clear line on stderr and exit code 1, and SIGTERM into an orderly stop (utils/core/signals.py).
"""
from __future__ import annotations

import errno
import os
import sys
import traceback
from pathlib import Path
from typing import Callable

from utils.core.config import ConfigError, apply_overrides, from_dict, repo_path, to_dict
from utils.core.errors import StageError  # noqa: F401 - where the stages' callers import it from
from utils.core.io import DataError
from utils.core.lock import HOLDER_ENV, RunLocked
from utils.core.manifest import MANIFEST_NAME, StageRun, read_manifest
from utils.core.methods import BASE, CHECKPOINTS, METHODS, SFT_WARMUP
from utils.core.schema import RunConfig
from utils.core.signals import (DRIVER_ENV, PARENT_ENV, TERMINATED_EXIT, Terminated, die_with_parent,
                                exit_when_orphaned, is_spawned_child, sigterm_as_interrupt, stop_with)

if is_spawned_child():  # this module runs in vLLM's engine core too (spawn re-imports the stage script):
    die_with_parent()   # let it end with its stage, even a SIGKILLed one (utils/core/signals.py),
    exit_when_orphaned()  # and at the latest a minute after, should its shutdown hang

# stage -> the config keys it reads (08's settings are the evaluations it finds: utils/eval/compare.py)
CONFIG_KEYS: dict[str, tuple[str, ...]] = {
    "00_check_data": ("data", "agent.tool"),
    "01_prepare_dataset": ("data", "model.templates", "model.path", "model.trust_remote_code",
                           "model.engine.max_model_len", "agent.max_new_tokens_planner", "agent.tool"),
    "02_build_rewards": ("data.scorer", "reward"),
    "03_generate_sft_traces": ("traces", "model.path", "model.trust_remote_code", "model.templates", "model.engine",
                               "agent", "seed"),
    "04_sft_warmup": ("model", "warmup", "agent", "seed", "threads"),
    "05_train_red_grpo": ("model", "algorithm", "agent", "seed", "threads"),
    "06_ablate_grpo_only": ("model", "algorithm", "agent", "seed", "threads"),
    "07_evaluate": ("model", "agent", "seed"),
}
STAGES = (*CONFIG_KEYS, "08_compare_runs")
# a full disk or quota, a read-only or forbidden folder: the user's to fix, reported in one line
DISK_ERRORS = {errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EACCES, errno.EPERM}


def run_dir(cfg: RunConfig) -> Path:
    return repo_path(cfg.outputs_dir) / cfg.run_id


def stage_dir(cfg: RunConfig, stage: str) -> Path:
    return run_dir(cfg) / stage


def config_slice(cfg: RunConfig, keys: tuple[str, ...]) -> dict:
    """The resolved config restricted to dotted `keys` (e.g. "data", "model.templates")."""
    full, out = to_dict(cfg), {}
    for key in keys:
        src, dst = full, out
        parts = key.split(".")
        for part in parts[:-1]:
            src = src[part]
            dst = dst.setdefault(part, {})
        dst[parts[-1]] = src[parts[-1]]
    return out


def parent(run: StageRun, cfg: RunConfig, stage: str) -> tuple[Path, dict]:
    """The parent stage's directory and manifest, recorded in `run`; clear error if it has not run."""
    d = stage_dir(cfg, stage)
    if not (d / MANIFEST_NAME).is_file():
        script, _, method = stage.partition("/")  # a trainer's stage is <script>/<method>
        how = f"{script}.py --algorithm {method}" if method else f"{script}.py"
        raise StageError(f"{d / MANIFEST_NAME} not found: run {how} (or 09_driver.py) for run '{cfg.run_id}' first")
    try:
        return d, run.add_parent(d)
    except RuntimeError as exc:
        raise StageError(str(exc)) from None


def output_path(manifest: dict, suffix: str) -> Path:
    """The parent output whose repo-relative path ends with `suffix` (found via the manifest)."""
    hits = [p for p in manifest["outputs"] if p.endswith(suffix)]
    if len(hits) != 1:
        raise StageError(f"manifest of {manifest['stage']} lists {len(hits)} outputs ending in '{suffix}', expected 1")
    return repo_path(hits[0])


def _checkpoint_stage(name: str) -> tuple[str, str] | None:
    """(the stage that writes checkpoint `name`, the adapter's folder inside it), None for a directory."""
    if name == SFT_WARMUP:
        return "04_sft_warmup", "ckpt_sft/best"
    if name in METHODS:
        return f"{METHODS[name].trainer}/{name}", "final_adapter"
    return None


def resolve_checkpoint(run: StageRun | None, cfg: RunConfig, name: str) -> Path | None:
    """The adapter directory of checkpoint `name` (None for the bare base): `sft_warmup` is 04's best
    adapter, a method its trainer's final adapter, anything else a peft adapter directory. Its stage
    must have completed; with a `run` it is recorded as that run's parent."""
    if name == BASE:
        return None
    source = _checkpoint_stage(name)
    if source is None:
        path = repo_path(name)
        if not (path / "adapter_config.json").is_file():
            raise StageError(f"--checkpoint {name}: not one of {', '.join(CHECKPOINTS)} nor an adapter directory")
        return path
    stage, inner = source
    if run is not None:
        return parent(run, cfg, stage)[0] / inner
    d = stage_dir(cfg, stage)
    status = read_manifest(d).get("status") if (d / MANIFEST_NAME).is_file() else "missing"
    if status != "completed":
        raise StageError(f"checkpoint {name}: {d / MANIFEST_NAME} is {status}, not completed: run "
                         f"{stage.split('/')[0]}.py (or 09_driver.py) for run '{cfg.run_id}' first")
    return d / inner


def model_dir(cfg: RunConfig, path: str | None = None) -> Path:
    """The local directory of the base model (model.path); a clear error if it is not there."""
    p = repo_path(path or cfg.model.path)
    if not (p / "config.json").is_file():
        hint = ("run `bash download.sh` to check or rebuild the embedded tiny-arith" if "tiny-arith" in str(p)
                else "run `bash download.sh --model HUB_ID` or copy the model there")
        raise StageError(f"model.path: no model at {p} (no config.json); {hint}")
    return p


# keys a stage reads that decide whether it starts or when it saves, never what it computes, so a
# run from before each existed stays up to date: the memory preflight (utils/train/preflight.py) and
# the checkpoints' time floor (utils/train/guard.py `SaveClock`)
UNHASHED = ("model.memory.preflight", "warmup.save_minutes", "algorithm.rl.save_minutes")


def stage_config(cfg: RunConfig, stage: str) -> dict:
    """The slice of the config that `stage` reads: what its manifest records and hashes. Without
    the search tool (agent.tool.retriever none) `agent.tool` is left out, since no stage reads it
    then; so is 07's `eval` section while it asks for greedy accuracy alone, and `UNHASHED` always."""
    keys = CONFIG_KEYS[stage]
    if stage == "07_evaluate" and (cfg.eval.samples or cfg.eval.primary != "greedy"):
        keys += ("eval.samples", "eval.primary", "algorithm.rl.temperature")  # the margin is 08's
    if stage == "07_evaluate" and cfg.eval.curve_samples:  # off, it leaves 07's slice as before it existed
        keys = tuple(dict.fromkeys(keys + ("eval.curve_samples", "algorithm.rl.temperature")))
    out = config_slice(cfg, keys)
    for key in UNHASHED:
        *path, name = key.split(".")
        node = out
        for part in path:
            node = node.get(part, {})
        node.pop(name, None)
    if cfg.agent.tool.retriever == "none" and "agent" in out:
        out["agent"].pop("tool", None)
        if not out["agent"]:  # 00 reads only the tool
            del out["agent"]
    return out


def recorded_config(stage: Path, overrides: list[str] = ()) -> RunConfig:
    """The config a completed stage of a run ran with: its manifest's slice (`stage_config`), the rest
    at the schema's defaults, `overrides` (KEY=VALUE) on top. What a benchmark of that run measures,
    rather than today's configs' defaults."""
    tree = apply_overrides(read_manifest(stage)["config"], list(overrides), RunConfig)
    return from_dict(RunConfig, tree, f"{stage / MANIFEST_NAME} (config)")


def evaluation_settings(cfg: RunConfig, checkpoint: str, limit: int = 0) -> dict:
    """What one 07 evaluation records and hashes: its config slice, the checkpoint's name and
    `--limit` (0: every test item). 07 writes it, and the driver recomputes it to decide whether
    an evaluation is up to date, so the two cannot drift apart."""
    return {**stage_config(cfg, "07_evaluate"), "checkpoint": checkpoint, "limit": limit}


def disk_error(exc: OSError) -> str:
    """One line for a full disk or an unwritable folder (`DISK_ERRORS`): what, where, what to do."""
    where = f": {exc.filename}" if exc.filename else ""
    return (f"{exc.strerror}{where}; nothing completed was overwritten: make room (or choose a writable "
            "outputs_dir) and run it again")


LAUNCHER_ENV = "TORCHELASTIC_RUN_ID"  # set in every rank by torch's elastic launcher (`accelerate launch`, torchrun)


def run_main(stage: str, fn: Callable[[], int | None]) -> int:
    """Run a stage's main; user errors become one line on stderr and exit code 1. Ctrl-C and
    SIGTERM unwind it (manifest "failed", lock released, engine shut down): exit 130 or 143."""
    if str(os.getppid()) in (os.environ.get(HOLDER_ENV), os.environ.get(PARENT_ENV)) or LAUNCHER_ENV in os.environ:
        die_with_parent()  # run by the driver, a Ray task or a launcher (a rank): stop with it, even if it is SIGKILLed
    if os.environ.get(DRIVER_ENV):
        stop_with(os.environ[DRIVER_ENV])  # a Ray task's stage: its driver is not its parent
    try:
        with sigterm_as_interrupt():
            return fn() or 0
    except (StageError, ConfigError, DataError, FileNotFoundError, RunLocked) as exc:
        print(f"{stage}: error: {exc}", file=sys.stderr)
        return 1
    except OSError as exc:
        if exc.errno not in DISK_ERRORS:
            traceback.print_exc()
            return 1
        print(f"{stage}: error: {disk_error(exc)}", file=sys.stderr)
        return 1
    except KeyboardInterrupt as exc:
        how = "terminated" if isinstance(exc, Terminated) else "interrupted"
        print(f"{stage}: {how}; its manifest says 'failed'; run it again to resume", file=sys.stderr)
        return TERMINATED_EXIT if isinstance(exc, Terminated) else 130
    except Exception:  # noqa: BLE001 - unexpected: keep the traceback
        traceback.print_exc()
        return 1

"""The plan behind `09_driver.py`: which stage runs with which arguments, and when it may be skipped.

A stage is skipped (the `dvc repro` rule, docs/ARCHITECTURE.md "Stages") when its manifest says
completed, its config hash equals the hash of the config slice it would run with now, every
recorded input still hashes the same, and every recorded parent manifest still has the same
digest. Anything else (a new config value, a changed input, a re-run parent, a killed run) runs
it again; the config differences that do not are in utils/run/freshness.py. The per-method steps
come from the method registry (utils/core/methods.py); a stage's hash is computed from the stage
table (utils/core/stages.py), never by importing the scripts.

The plan puts every evaluation last (base, sft_warmup, then each method), and those not up to date
run in one 07 process (`07_evaluate.py --checkpoint base,sft_warmup,red`): one engine serves them
all and swaps adapters, since starting a vLLM engine on a 2-core CPU (about 25 s plus imports) costs
more than evaluating 200 items on it (about 12 s). Each checkpoint still gets its own folder and
manifest, the same as evaluating it alone writes (tests/test_evaluate.py).
"""
from __future__ import annotations

import contextlib
import gc
import importlib
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from utils.core.cli import parse_stage_args
from utils.core.config import ROOT, repo_path
from utils.core.console import filtered_here
from utils.core.loader import uses_vllm
from utils.core.files import atomic_write_json, rel
from utils.core.hashing import config_sha256, model_changes, path_sha256
from utils.core.manifest import MANIFEST_NAME, manifest_digest, read_manifest, seal_state
from utils.core.provenance import utc_now
from utils.core.methods import BASE, METHODS, SFT_WARMUP
from utils.core.signals import run_child, run_forked, stop_word
from utils.core.stages import StageError, evaluation_settings, stage_config, stage_dir
from utils.eval.compare import DEFAULT_RESAMPLES, compare_settings
from utils.run.freshness import config_changes, kept_despite, without_new_defaults

DATA_STAGES = ("00_check_data", "01_prepare_dataset", "02_build_rewards", "03_generate_sft_traces", "04_sft_warmup")


@dataclass
class Step:
    script: str  # module name, e.g. "05_train_red_grpo"
    dir_name: str  # stage directory under the run, e.g. "05_train_red_grpo/red"
    algorithm: str | None = None  # --algorithm for a trainer (it selects the config)
    checkpoint: str | None = None  # --checkpoint for 07

    @property
    def args(self) -> list[str]:
        """The step's own command-line arguments, after the run's common ones."""
        if self.algorithm:
            return ["--algorithm", self.algorithm]
        return ["--checkpoint", self.checkpoint] if self.checkpoint else []


def _evaluate(checkpoint: str) -> Step:
    return Step("07_evaluate", f"07_evaluate/{checkpoint}", checkpoint=checkpoint)


def with_needs(methods: list[str]) -> list[str]:
    """The methods in order, each preceded by the methods it reads (matched_sft needs red)."""
    out: list[str] = []
    for name in methods:
        for need in (*METHODS[name].needs, name):
            if need not in out:
                out.append(need)
    return out


def plan(methods: list[str]) -> list[Step]:
    """The data stages, each method's trainer, then every evaluation (base, sft_warmup, the methods):
    consecutive evaluations run in one 07 process on one engine (`batches`)."""
    names = with_needs(methods)
    steps = [Step(s, s) for s in DATA_STAGES]
    steps += [Step(METHODS[n].trainer, f"{METHODS[n].trainer}/{n}", algorithm=n) for n in names]
    return steps + [_evaluate(c) for c in (BASE, SFT_WARMUP, *names)]


REPORT = Step("08_compare_runs", "08_compare_runs")


def parse_seeds(ap, text: str | None, run_root: Path, run_id: str) -> list:
    """09's --seeds as a list ([None]: the config's seed), refused with `ap.error` (exit 2) where it does
    not parse or where one seed would write beside a multi-seed run's seed folders (`single_seed_clash`)."""
    try:
        seeds = [int(s) for s in text.split(",")] if text else [None]
    except ValueError:
        ap.error(f"--seeds {text!r}: expected comma-separated integers, e.g. 1,2,3")
    if clash := single_seed_clash(run_root, run_id, seeds):
        ap.error(clash)
    return seeds


def single_seed_clash(run_root: Path, run_id: str, seeds: list) -> str | None:
    """Why a one-seed run may not go into `run_root`, or None: one seed writes into the run folder
    itself, so beside a multi-seed run's seed_<s>/ folders it would mix the two layouts (and 08
    would read the stray stages as a run of their own). The message says how to add the seed."""
    folders = sorted(p.name for p in run_root.glob("seed_*") if p.is_dir()) if len(seeds) == 1 else []
    if not folders:
        return None
    seed = seeds[0] if seeds[0] is not None else "N"
    return (f"--run_id {run_id}: {rel(run_root)} holds a multi-seed run ({', '.join(folders)}), and one seed "
            f"writes into the run folder itself; add seed {seed} to it with --seeds {seed} --run_id {run_id}/seed_{seed}")

# What a stage imports that is slow to import, by script: with `fork`, the driver imports it once,
# before the first stage that needs it, and every later stage forked from the driver has it already
# (docs/PERFORMANCE.md). vLLM's modules (11 s on a 2-core box) only for a stage whose config samples with
# vLLM. A wrong list costs time, never a result: the stage imports what it lacks.
_MODELS = ("torch", "transformers", "transformers.models.auto.tokenization_auto")
_TRAINER = (*_MODELS, "transformers.models.auto.modeling_auto", "peft")
_VLLM = ("vllm", "vllm.entrypoints.llm", "vllm.v1.engine.core", "vllm.v1.worker.cpu_model_runner")
PRELOAD = {"01_prepare_dataset": _MODELS, "03_generate_sft_traces": _MODELS, "04_sft_warmup": _TRAINER,
           "05_train_red_grpo": _TRAINER, "06_ablate_grpo_only": _TRAINER, "07_evaluate": _TRAINER}


def preload(script: str, cfg, console: Path | None = None) -> None:
    """Import the modules `script` will need under `cfg` (PRELOAD, and vLLM's if `uses_vllm`) into this
    process, where not yet imported, then hand every object alive to the garbage collector's
    permanent generation (`gc.freeze`), so that a forked stage's collections do not walk the imported
    modules (vLLM's engine start collects five times: 4.2 s in a forked child without the freeze,
    2.8 s with it, on a 2-core box)."""
    wanted = PRELOAD.get(script, ())
    if wanted is _TRAINER and uses_vllm(cfg):
        wanted = (*wanted, *_VLLM)
    missing = [name for name in wanted if name not in sys.modules]
    with filtered_here(console) if console is not None and missing else contextlib.nullcontext():
        for name in missing:  # vLLM's import warns on a CPU: that goes to the console filter
            importlib.import_module(name)
    if missing:
        gc.freeze()


def current_config(step: Step, common: list[str]) -> tuple[dict, object]:
    """(the config slice the step's manifest would record if it ran now, the run's config)."""
    cfg, _ = parse_stage_args("", common + (["--algorithm", step.algorithm] if step.algorithm else []))
    if step.script == REPORT.script:  # its settings list the evaluations it would read now
        return compare_settings(cfg, [], DEFAULT_RESAMPLES), cfg
    if step.checkpoint:  # an evaluation as 07 runs it for the driver: every test item
        return evaluation_settings(cfg, step.checkpoint), cfg
    return stage_config(cfg, step.script), cfg


def expected_sha(step: Step, common: list[str]) -> tuple[str, object]:
    """(the config hash the step's manifest would record if it ran now, its config)."""
    config, cfg = current_config(step, common)
    return config_sha256(config), cfg


def up_to_date(step: Step, common: list[str]) -> tuple[Path, bool, str]:
    """(stage directory, skip?, reason) for one step."""
    config, cfg = current_config(step, common)
    directory = stage_dir(cfg, step.dir_name)
    return (directory, *_verdict(directory / MANIFEST_NAME, config, cfg))


def _verdict(path: Path, config: dict, cfg) -> tuple[bool, str]:
    if not path.is_file():
        return False, "never ran"
    m = read_manifest(path)
    if m.get("status") != "completed":
        return False, f"last run {m.get('status')}"
    seal = seal_state(m)
    if seal != "sealed":
        return False, ("manifest edited by hand (its seal does not match)" if seal == "edited"
                       else "manifest written by an older version (no seal)")
    notes = []
    if m.get("config_sha256") != config_sha256(config):
        recorded = m.get("config") or {}
        config, added = without_new_defaults(recorded, config)
        if added:
            notes.append(f"settings added since, at their defaults: {added}")
        if m.get("config_sha256") != config_sha256(config):
            kept = kept_despite(recorded, config)
            if kept is None:
                return False, f"config changed: {config_changes(recorded, config)}"
            notes.append(kept)
    for p, digest in m.get("inputs", {}).items():
        if not repo_path(p).exists() or path_sha256(repo_path(p)) != digest:
            return False, f"input changed: {p}"
    if m.get("model") and (changed := model_changes(m["model"])):
        return False, f"base model changed: {changed}"
    for p, digest in m.get("outputs", {}).items():
        if not repo_path(p).exists() or path_sha256(repo_path(p)) != digest:
            return False, f"output changed: {p}"
    for parent, digest in m.get("parents", {}).items():
        ppath = stage_dir(cfg, parent) / MANIFEST_NAME
        if not ppath.is_file() or manifest_digest(read_manifest(ppath)) != digest:
            return False, f"parent re-ran: {parent}"
    return True, "; ".join(["up to date"] + notes)


def stage_path(common: list[str], step: Step) -> Path:
    _, cfg = expected_sha(step, common)
    return stage_dir(cfg, step.dir_name)


class RunManifest:
    """outputs/<run_id>/run_manifest.json: the regime the run's config names, every stage's manifest,
    what the driver did with it, and how long it took; rewritten after each stage, so an interrupted
    run still shows where it stopped. `common` is the driver's stage arguments."""

    def __init__(self, path: Path, run_id: str, methods: list[str], seeds: list, argv: list[str], common: list[str]):
        self.path, self.t0 = path, time.time()
        regime = expected_sha(REPORT, common)[1].regime or None  # a stage's manifest has only its config slice
        self.data = {"run_id": run_id, "methods": methods, "seeds": seeds, "regime": regime, "status": "running",
                     "command": " ".join(["python", "09_driver.py", *argv]),
                     "started_at": utc_now(), "stages": []}

    def record(self, seed, label, directory, action, reason, seconds=0.0, status=None):
        manifest = directory / MANIFEST_NAME
        self.data["stages"].append({"stage": label, "seed": seed, "action": action, "reason": reason,
                                    "seconds": round(seconds, 1), "manifest": rel(manifest),
                                    "status": status or ("completed" if action == "skipped" else "unknown")})
        self.write()

    def finish(self, status, report=None):
        self.data.update(status=status, report=report, wall_seconds=round(time.time() - self.t0, 1),
                         finished_at=utc_now())
        self.write()

    def write(self):
        atomic_write_json(self.path, self.data)


def batches(steps: list[Step]) -> list[list[Step]]:
    """The steps in order, consecutive evaluations in one batch (one 07 process, one engine for all of
    them: an engine start costs more than an evaluation), every other step alone."""
    out: list[list[Step]] = []
    for step in steps:
        if out and step.checkpoint and out[-1][-1].checkpoint:
            out[-1].append(step)
        else:
            out.append([step])
    return out


def console_log(log: RunManifest, seed, name: str) -> Path:
    """Where everything a stage process printed is kept, its harmless lines too (utils/core/console.py):
    <run>/logs/<stage>[.seed_N].log beside the run manifest."""
    stem = name.replace("/", ".").replace(",", "+") + (f".seed_{seed}" if seed is not None else "")
    return log.path.parent / "logs" / f"{stem}.log"


def run_batch(batch: list[Step], common, force, label, log: RunManifest, seed, stdout=None, fork=False) -> int:
    """Run the steps of a batch that are not up to date, in one process; skip the others. The
    process writes to `stdout` (an open file) if given, else to ours. With `fork` it is forked from
    this process after `preload` (`run_forked`, which starts a new interpreter instead if this
    process runs other Python threads); else a new interpreter."""
    todo = []
    for step in batch:
        directory, skip, reason = up_to_date(step, common)
        if force:
            skip, reason = False, "--force"
        if skip:
            print(f"{label(step)}: skipped ({reason})", flush=True)
            log.record(seed, step.dir_name, directory, "skipped", reason)
        else:
            todo.append((step, directory, reason))
    if not todo:
        return 0
    first = todo[0][0]
    name = first.dir_name if len(todo) == 1 else f"{first.script}/{','.join(s.checkpoint for s, _, _ in todo)}"
    reasons = sorted({r for _, _, r in todo})
    print(f"{label(first, name)}: running ({'; '.join(reasons)})", flush=True)
    t0 = time.time()
    args = first.args if len(todo) == 1 else ["--checkpoint", ",".join(s.checkpoint for s, _, _ in todo)]
    console = console_log(log, seed, name) if stdout is None else None  # the quiet console's full record
    if fork:
        preload(first.script, expected_sha(first, common)[1], console)
        code = run_forked(str(ROOT / f"{first.script}.py"), [*common, *args], ROOT, stdout, console)
    else:
        code = run_child([sys.executable, f"{first.script}.py", *common, *args], ROOT, stdout, console)  # SIGTERM first
    seconds = time.time() - t0
    for step, directory, reason in todo:
        m = directory / MANIFEST_NAME
        manifest = read_manifest(m) if m.is_file() else {}
        done = manifest.get("status") == "completed"
        own = manifest.get("wall_seconds", seconds) if done and len(todo) > 1 else seconds  # a batch: each its own
        log.record(seed, step.dir_name, directory, "ran", reason, own,
                   "completed" if code == 0 and done else f"failed (exit {code})")
    if code != 0:
        print(f"09_driver: {name} failed (exit {code}); fix it and re-run the same command to "
              f"resume from there", file=sys.stderr)
        return code
    print(f"{label(first, name)}: done in {seconds:.0f}s", flush=True)
    return 0


def stage_count(steps: list[Step], seeds: list) -> int:
    """The stages a driver run numbers in its labels: every step for every seed, then 08 (the last)."""
    return len(steps) * len(seeds) + 1


def run_sequential(steps: list[Step], seeds: list, common_of, force: bool, log: RunManifest, fork: bool) -> int:
    """The sequential executor: each seed's batches in plan order, one process at a time. Returns 0, or
    the first failed batch's exit code; a failure or an interrupt is written as the run manifest's end
    (an interrupt is raised on). `--executor ray` runs the same plan as branches
    (utils/run/ray_executor.py run_study). The caller runs 08 afterwards."""
    total = stage_count(steps, seeds)
    for k, seed in enumerate(seeds):
        common, seed_tag = common_of(seed), f" seed {seed}" if len(seeds) > 1 else ""

        def label(step, name=None, k=k, seed_tag=seed_tag):
            return f"[{k * len(steps) + steps.index(step) + 1}/{total}] {name or step.dir_name}{seed_tag}"

        for batch in batches(steps):
            try:
                code = run_batch(batch, common, force, label, log, seed, fork=fork)
            except KeyboardInterrupt as exc:
                log.finish(f"{stop_word(exc)} at {batch[0].dir_name}")
                raise
            if code:
                log.finish(f"failed at {batch[0].dir_name}")
                return code
    return 0


def _data_refusal(step: Step, common: list[str]) -> str:
    """For 00 about to run: what its check of a generated dataset's files would stop on (a generator
    setting the files were not written with), so the dry run says it before anything runs."""
    if step.dir_name != "00_check_data":
        return ""
    from utils.data.adapters import get_adapter

    _, cfg = current_config(step, common)
    try:
        get_adapter(cfg.data.name).file_warnings(cfg.data, repo_path(cfg.data.path))
    except StageError as exc:
        return f"; it will stop: {exc}"
    return ""


def dry_run(steps: list[Step], seeds: list, common_of, root: list[str], force: bool) -> int:
    """`09_driver.py --dry_run`: print, for every seed's steps in plan order and then 08, whether the
    driver would run or skip it and why, running and writing nothing. A stage that is up to date
    itself but records a parent that would run is marked to run after it (its parent's new manifest
    would not match). Returns how many stages would run."""
    total, count = stage_count(steps, seeds), 0
    for k, seed in enumerate(seeds):
        common, seed_tag, running = common_of(seed), f" seed {seed}" if len(seeds) > 1 else "", set()
        for i, step in enumerate(steps):
            directory, skip, reason = up_to_date(step, common)
            if force:
                skip, reason = False, "--force"
            elif skip:
                upstream = sorted(set(read_manifest(directory / MANIFEST_NAME).get("parents", {})) & running)
                if upstream:
                    skip, reason = False, f"after {', '.join(upstream)} re-runs"
            if not skip:
                running.add(step.dir_name)
                reason += _data_refusal(step, common)
            count += not skip
            print(f"[{k * len(steps) + i + 1}/{total}] {step.dir_name}{seed_tag}: "
                  f"{'would skip' if skip else 'would run'} ({reason})")
    _, skip, reason = up_to_date(REPORT, root)
    if force:
        skip, reason = False, "--force"
    elif skip and count:
        skip, reason = False, "after the stages above re-run"
    print(f"[{total}/{total}] {REPORT.dir_name}: {'would skip' if skip else 'would run'} ({reason})")
    return count + (not skip)

"""Each stage reads no config key outside the slice its manifest hashes (`stage_config`,
utils/core/stages.py CONFIG_KEYS): a key read but not hashed would let a changed value reuse a stale
output. The config's dataclasses record every field read while a stage's main() runs in this
process (a recording `__getattribute__`), except the reads the config machinery itself makes
(parsing, validating, slicing for the manifest); each recorded key must lie in the stage's slice
or be one of `WHERE`, the keys that say where outputs go and how runs are logged."""
import sys
from dataclasses import fields, is_dataclass
from pathlib import Path

import pytest

from helpers import run_rl_stage, run_stage, set_args, sft_args
from utils.core import schema
from utils.core.config import ROOT
from utils.core.stages import UNHASHED

pytestmark = pytest.mark.slow

# run-level keys that choose where outputs go and how they are logged, never what they hold
WHERE = {"outputs_dir", "run_id", "wandb_mode", "wandb_project", "regime"}
# the config machinery's own reads: parsing and validating the config, slicing it for manifests
MACHINERY = {(str(ROOT / "utils" / "core" / name), None) for name in ("config.py", "loader.py", "cli.py")} | {
    (str(ROOT / "utils" / "core" / "stages.py"), fn) for fn in ("config_slice", "stage_config", "evaluation_settings")}


class Reads:
    """Dotted keys read from any RunConfig while installed (`install`), with their sections' paths
    learnt as the reads descend from the root. Each section is kept alive beside its path, since a
    freed section's id can be reused by another config object, whose reads would then be filed
    under the wrong path (a `reward.enabled` read by no stage)."""

    def __init__(self):
        self.keys: set[str] = set()
        self.paths: dict[int, tuple[object, str]] = {}

    def record(self, obj, name: str, value) -> None:
        path = "" if type(obj) is schema.RunConfig else self.paths.get(id(obj), (None, None))[1]
        if path is None or name not in {f.name for f in fields(obj)} or self._in_machinery():
            return
        key = f"{path}.{name}" if path else name
        if is_dataclass(value):
            self.paths[id(value)] = (value, key)
        else:
            self.keys.add(key)

    @staticmethod
    def _in_machinery() -> bool:
        frame = sys._getframe(3)
        while frame is not None:
            code = frame.f_code
            if (code.co_filename, None) in MACHINERY or (code.co_filename, code.co_name) in MACHINERY:
                return True
            frame = frame.f_back
        return False

    def install(self, monkeypatch) -> None:
        for cls in {c for c in vars(schema).values() if isinstance(c, type) and is_dataclass(c)}:
            def getattribute(obj, name, _reads=self):
                value = object.__getattribute__(obj, name)
                if not name.startswith("__"):
                    _reads.record(obj, name, value)
                return value
            monkeypatch.setattr(cls, "__getattribute__", getattribute)


def outside(keys: set[str], hashed: dict) -> list[str]:
    """The keys not within the hashed slice (a key is within it if it or a section above it is there)."""
    def within(key: str) -> bool:
        node = hashed
        for part in key.split("."):
            if not isinstance(node, dict) or part not in node:
                return False
            node = node[part]
        return True
    return sorted(k for k in keys if k not in WHERE and not within(k))


# keys whose value decides whether a section is in the slice at all (`stage_config`): with the tool
# off the slice leaves `agent.tool` out, and 07's leaves `eval` out while it asks for greedy alone
DECIDE_THE_SLICE = {"agent.tool.retriever", "eval.samples", "eval.primary", "eval.curve_samples"}
# keys that decide whether a stage starts or when it saves, never what it computes (the memory
# preflight, the checkpoints' time floor): left out of the slice so that runs from before them stay current
DECIDE_TO_START = set(UNHASHED)
CHAIN = set_args("data.n_train=24", "data.n_val=4", "data.n_test=4", "regime=regime_d", "warmup.steps=2",
                 "warmup.batch_size=4", "warmup.eval_every=0", "warmup.eval_size=2", "algorithm.rl.steps=1",
                 "algorithm.rl.questions_per_step=2", "algorithm.rl.n_samples=2", "model.engine.name=hf",
                 "eval.samples=2", "eval.curve_samples=2", "wandb_mode=disabled")
STAGE_ARGS = {"04_sft_warmup": sft_args(set_args("warmup.steps=2", "warmup.save_every=2")),
              "05_train_red_grpo": set_args("algorithm.rl.save_freq=1"),
              "07_evaluate": ["--checkpoint", "sft_warmup", "--limit", "2"]}


def _run(stage: str, out: Path, *args: str) -> int:
    return run_rl_stage(stage, out, *args) if stage == "05_train_red_grpo" else run_stage(stage, out, *args)


def _slice(out: Path, stage: str) -> dict:
    """What the stage's manifest hashes (07's: the evaluation's; 05's: the method's)."""
    import json

    nested = stage in ("05_train_red_grpo", "07_evaluate")
    path = next((out / "t" / stage).glob("*/manifest.json")) if nested else out / "t" / stage / "manifest.json"
    return json.loads(path.read_text())["config"]


def test_every_stage_reads_only_the_keys_its_manifest_hashes(tmp_path, monkeypatch):
    from utils.core.schema import DataConfig
    from utils.data.synthetic import write_dataset

    write_dataset(DataConfig(n_train=24, n_val=4, n_test=4), tmp_path / "synth")
    out, reads = tmp_path / "outputs", Reads()
    reads.install(monkeypatch)
    found = {}
    for stage in ("00_check_data", "01_prepare_dataset", "02_build_rewards", "03_generate_sft_traces",
                  "04_sft_warmup", "05_train_red_grpo", "07_evaluate"):
        reads.keys.clear()
        assert _run(stage, out, *CHAIN, "--set", f"data.path={tmp_path / 'synth'}", *STAGE_ARGS.get(stage, ())) == 0
        found[stage] = outside(reads.keys - DECIDE_THE_SLICE - DECIDE_TO_START, _slice(out, stage))
        assert reads.keys, f"{stage}: no read recorded (the recorder is not installed)"
    assert found == {stage: [] for stage in found}, "keys read outside the stage's hashed slice"

"""Kill anywhere (docs/OPERATIONS.md, "Failure behaviour"): the driver's process group is SIGKILLed at eight
exact points (utils/core/faults.py), one after another, each time re-running the same command;
the run that survives them all ends with the same numbers as an uninterrupted one, on CPU. The
rollouts run on the HF engine: on vLLM the same chain took 18 minutes on this box (an engine start
for every restarted stage), too long for the suite. Marked `slow`; CI runs it."""
import json
import os
import signal
import subprocess
import sys

import pytest

from helpers import REGIME_D, set_args
from utils.core.config import ROOT
from utils.core.schema import DataConfig
from utils.data.synthetic import write_dataset

pytestmark = pytest.mark.slow

# short chains and enough SFT for a protocol-following start, so that episodes run several turns
# and the rollout kill points fall mid-episode (a 6-step warmup ends every episode at turn one)
SETS = [REGIME_D, "data.n_train=40", "data.n_val=4", "data.n_test=6", "data.min_steps=2", "data.max_steps=3",
        "warmup.steps=150", "warmup.lr=0.003", "warmup.decay_start=0", "warmup.save_every=50",
        "warmup.eval_every=0", "warmup.eval_size=4", "warmup.batch_size=8", "algorithm.rl.steps=3",
        "algorithm.rl.save_freq=1", "algorithm.rl.questions_per_step=2", "algorithm.rl.n_samples=2",
        "model.engine.name=hf", "wandb_mode=disabled"]

# (stage script or None, point[:n]): in pipeline order, each reached only after the ones before it
KILLS = [
    ("03_generate_sft_traces", "write:sft_traces.jsonl"),  # the traces complete in a temporary file
    ("04_sft_warmup", "sft_step:120"),  # mid-step, after the checkpoint of step 100
    ("04_sft_warmup", "checkpoint"),  # the resumed run's checkpoint of step 150, half assembled
    ("04_sft_warmup", "publish:last"),  # the next one's, complete, between publish_dir's two renames
    ("05_train_red_grpo", "rollout:3"),  # mid-rollout
    ("05_train_red_grpo", "checkpoint:2"),  # the resumed run's second checkpoint, half assembled
    ("07_evaluate", "rollout:4"),  # mid-evaluation
    ("08_compare_runs", "write:report.md"),  # the report complete in a temporary file
]


def _driver(out, data, fault=None):
    env = {k: v for k, v in os.environ.items() if not k.startswith("REDCODA_FAULT")}
    if fault:
        env.update(REDCODA_FAULT_STAGE=fault[0], REDCODA_FAULT=fault[1])
    sets = set_args(*SETS, f"outputs_dir={out}", f"data.path={data}")
    proc = subprocess.run([sys.executable, "09_driver.py", "--method", "red", "--run_id", "k", *sets], cwd=ROOT,
                          env=env, capture_output=True, text=True, timeout=1200, start_new_session=True)
    return proc


def _numbers(run) -> dict:
    """What a run ends with: every evaluation's metrics, the trainers' logs without timings."""
    out = {}
    for m in sorted(run.glob("07_evaluate/*/metrics.json")):
        out[m.parent.name] = json.loads(m.read_text())
    for log in (run / "04_sft_warmup" / "logs" / "train.jsonl", run / "05_train_red_grpo" / "red" / "metrics.jsonl"):
        rows = [json.loads(x) for x in log.read_text().splitlines()]
        out[log.parent.name] = [{k: v for k, v in r.items() if not k.startswith(("time/", "perf/"))} for r in rows]
    out["summary"] = [line.split(",")[:8] for line in (run / "08_compare_runs" / "summary.csv").read_text().splitlines()]
    return out


def test_killed_at_eight_points_the_run_ends_as_an_uninterrupted_one(tmp_path):
    data = tmp_path / "synth"
    write_dataset(DataConfig(n_train=40, n_val=4, n_test=6, min_steps=2, max_steps=3), data)
    reference = _driver(tmp_path / "ref", data)
    assert reference.returncode == 0, reference.stderr[-3000:]

    out = tmp_path / "killed"
    run = out / "k"
    expected_resume = {}  # run index -> the step its stage must resume from
    for k, fault in enumerate(KILLS):
        proc = _driver(out, data, fault)
        assert proc.returncode == -signal.SIGKILL, f"{fault}: not killed (exit {proc.returncode})\n{proc.stdout[-2000:]}"
        if k in expected_resume:
            assert f"from step {expected_resume[k]}" in proc.stdout, (fault, proc.stdout[-2000:])
        if fault[1].startswith("write:"):  # the cut write left only its temporary file, not the output
            name = fault[1].split(":")[1]
            assert not list(run.rglob(name)) and list(run.rglob(f".{name}.*.tmp")), fault
        if fault[1].startswith(("sft_step", "checkpoint")):  # the next run resumes from the last good one
            cut = [p.name for p in run.rglob("*.tmp") if p.is_dir()]
            assert (cut != []) == fault[1].startswith("checkpoint"), (fault, cut)
            expected_resume[k + 1] = _last_good_step(run, fault[0])
        if fault[1].startswith("publish:"):  # neither folder has the name; the old one waits aside
            ckpt = run / fault[0] / "ckpt_sft"
            aside = sorted(ckpt.glob(".last.old-*"))
            assert len(aside) == 1 and not (ckpt / "last").exists() and (ckpt / "last.tmp").is_dir(), fault
            expected_resume[k + 1] = json.loads((aside[0] / "state.json").read_text())["step"]
    final = _driver(out, data)
    assert final.returncode == 0, final.stdout[-3000:] + final.stderr[-3000:]
    assert sorted(expected_resume) == [2, 3, 4, 6]

    assert not list(run.rglob("*.tmp")), "a temporary file or folder survived"
    assert not list(run.rglob(".*.old-*")), "a folder moved aside survived"
    trained = [json.loads(x)["step"] for x in (run / "05_train_red_grpo" / "red" / "metrics.jsonl").read_text().splitlines()]
    assert trained == [1, 2, 3]  # no step lost or repeated
    numbers = _numbers(run)
    assert numbers["sft_warmup"]["turns"] > 2  # the start follows the protocol: the kills fell mid-episode
    assert numbers == _numbers(tmp_path / "ref" / "k")


def _last_good_step(run, stage: str) -> int:
    if stage == "04_sft_warmup":
        return json.loads((run / stage / "ckpt_sft" / "last" / "state.json").read_text())["step"]
    return max(int(p.parent.name.split("_")[1]) for p in (run / stage / "red" / "ckpt").glob("step_*/state.json")
               if not p.parent.name.endswith(".tmp"))

"""Data-parallel training under `accelerate launch` (utils/train/world.py): two gloo ranks on this
CPU train on the same global batches as one process, rank 0 alone writes, and a killed two-rank
run resumes to the numbers of an uninterrupted one; ranks whose launcher is killed stop with it."""
import json
import os
import shutil
import subprocess
import sys
import time

import pytest

from helpers import free_port, REGIME_D, run_stage, set_args, sft_args
from utils.core.config import ROOT


def two_ranks() -> list[str]:
    """Two ranks on a rendezvous port of their own (accelerate's default, 29500, is shared by every
    launch on the machine, such as tests/test_device.py's running beside these under pytest-xdist)."""
    return [sys.executable, "-m", "accelerate.commands.launch", "--config_file", "configs/accelerate/local_2proc.yaml",
            "--main_process_port", str(free_port())]


def _sft(out, args, run_id, launch=(), env=None, extra=()):
    cmd = [*launch, *([] if launch else [sys.executable]), "04_sft_warmup.py", "--set", f"outputs_dir={out}", *args,
           *sft_args(extra), "--run_id", run_id]
    return subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=600,
                          env={k: v for k, v in os.environ.items() if not k.startswith("REDCODA_FAULT")} | (env or {}))


def _log(out, run_id) -> list[dict]:
    """The warmup's log rows without their timings (time/step differs between any two runs)."""
    rows = [json.loads(x) for x in (out / run_id / "04_sft_warmup" / "logs" / "train.jsonl").read_text().splitlines()]
    return [{k: v for k, v in r.items() if not k.startswith("time/")} for r in rows]


VLLM_VALIDATION = set_args("model.engine.name=vllm", "warmup.eval_every=6")


@pytest.mark.slow
def test_two_ranks_train_as_one_process_and_resume_after_a_kill(prepared):  # noqa: F811
    out, args = prepared
    assert run_stage("03_generate_sft_traces", out, *args) == 0
    for run_id in ("one", "two", "killed"):
        shutil.copytree(out / "t", out / run_id)
    one = _sft(out, args, "one")
    assert one.returncode == 0, one.stderr
    # validated mid-run and at the end on vLLM, in rank 0's process, while rank 1 trains on
    two = _sft(out, args, "two", two_ranks(), extra=VLLM_VALIDATION)
    assert two.returncode == 0, two.stderr[-3000:]

    single, double = _log(out, "one"), _log(out, "two")
    assert [r["step"] for r in double] == list(range(1, 13))  # rank 0 alone logs: each step once
    for a, b in zip(single, double):
        assert abs(a["loss"] - b["loss"]) <= 1e-5 * abs(a["loss"]), (a, b)
        assert a["lr"] == b["lr"] and a["epoch"] == b["epoch"]
    for run_id, size in (("one", 1), ("two", 2)):
        m = json.loads((out / run_id / "04_sft_warmup" / "manifest.json").read_text())
        assert m["status"] == "completed" and m["world_size"] == size
        assert m["metrics"]["steps"] == 12 and m["metrics"]["final_val_accuracy"] is not None
    for step in (6, 12):
        assert json.loads((out / "two" / "04_sft_warmup" / "valid_samples" / f"step_{step}.json").read_text())["samples"]

    # killed at the 8th step of a rank (after the checkpoint of step 6), then the same command again
    killed = _sft(out, args, "killed", two_ranks(), {"REDCODA_FAULT": "sft_step:8", "REDCODA_FAULT_STAGE": "04_sft_warmup"})
    assert killed.returncode != 0 and "SIGKILL" in killed.stderr
    state = json.loads((out / "killed" / "04_sft_warmup" / "manifest.json").read_text())["status"]
    assert state == "running" and len(_log(out, "killed")) == 7
    resumed = _sft(out, args, "killed", two_ranks())
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert "resuming from step 6" in resumed.stdout and resumed.stdout.count("resuming") == 1
    assert _log(out, "killed") == double  # every step once, the same numbers as the uninterrupted run


@pytest.mark.slow
def test_ranks_stop_with_a_killed_launcher_and_the_same_command_resumes(prepared):  # noqa: F811
    """The launcher SIGKILLed mid-run (the OOM killer, a lost job): each rank is told by the kernel
    (PR_SET_PDEATHSIG, utils/core/stages.py run_main) and unwinds instead of training on as an orphan."""
    import psutil

    out, args = prepared
    assert run_stage("03_generate_sft_traces", out, *args) == 0
    shutil.copytree(out / "t", out / "orphan")
    steps = set_args("warmup.steps=60")  # long enough to be cut after step 10, short enough to finish
    cmd = [*two_ranks(), "04_sft_warmup.py", "--set", f"outputs_dir={out}", *args, *sft_args(steps), "--run_id", "orphan"]
    launcher = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    log = out / "orphan" / "04_sft_warmup" / "logs" / "train.jsonl"
    deadline = time.time() + 300
    while not (log.is_file() and len(log.read_text().splitlines()) >= 10) and time.time() < deadline:
        time.sleep(0.2)
    ranks = psutil.Process(launcher.pid).children(recursive=True)
    assert len(ranks) == 2 and launcher.poll() is None, "the run ended before it could be killed"
    launcher.kill()
    launcher.communicate()
    _, alive = psutil.wait_procs(ranks, timeout=60)
    assert not alive, f"ranks still running after their launcher died: {alive}"
    done = len(_log(out, "orphan"))
    assert 10 <= done < 60  # stopped part-way
    assert json.loads((out / "orphan" / "04_sft_warmup" / "manifest.json").read_text())["status"] == "failed"
    resumed = _sft(out, args, "orphan", two_ranks(), extra=steps)  # the lock was released: not refused
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert "resuming from step" in resumed.stdout
    assert [r["step"] for r in _log(out, "orphan")] == list(range(1, 61))  # every step once


RL = set_args(REGIME_D, "algorithm.rl.steps=2", "algorithm.rl.questions_per_step=4", "algorithm.rl.n_samples=2",
              "algorithm.rl.save_freq=1", "algorithm.rl.dump_freq=1", "wandb_mode=disabled")


def _rl(out, args, run_id, launch=(), env=None):
    cmd = [*launch, *([] if launch else [sys.executable]), "05_train_red_grpo.py", "--set", f"outputs_dir={out}",
           *args, *RL, "--run_id", run_id]
    return subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=900,
                          env={k: v for k, v in os.environ.items() if not k.startswith("REDCODA_FAULT")} | (env or {}))


def _rl_out(out, run_id, name):
    return [json.loads(x) for x in (out / run_id / "05_train_red_grpo" / "red" / name).read_text().splitlines()]


def _numbers(out, run_id) -> list[dict]:
    return [{k: v for k, v in m.items() if not k.startswith(("time/", "perf/"))}
            for m in _rl_out(out, run_id, "metrics.jsonl")]


@pytest.mark.slow
def test_two_rl_ranks_roll_out_on_their_own_engines_and_resume_after_a_kill(prepared):  # noqa: F811
    """Each rank samples its block of the step's questions on its own vLLM engine with the seeds one
    process would use, so the first step's episodes are one process's; rank 0 writes one set of
    outputs; a kill mid-checkpoint resumes to the uninterrupted run's numbers."""
    out, args = prepared
    assert run_stage("03_generate_sft_traces", out, *args) == 0
    warmup = _sft(out, args, "t")
    assert warmup.returncode == 0, warmup.stderr
    for run_id in ("one", "two", "killed"):
        shutil.copytree(out / "t", out / run_id)
    one, two = _rl(out, args, "one"), _rl(out, args, "two", two_ranks())
    assert one.returncode == 0, one.stderr[-3000:]
    assert two.returncode == 0, two.stderr[-3000:]

    m = json.loads((out / "two" / "05_train_red_grpo" / "red" / "manifest.json").read_text())
    assert m["status"] == "completed" and m["world_size"] == 2 and m["metrics"]["steps"] == 2
    assert [r["step"] for r in _rl_out(out, "two", "metrics.jsonl")] == [1, 2]
    single, double = _rl_out(out, "one", "episodes/step_1.jsonl"), _rl_out(out, "two", "episodes/step_1.jsonl")
    assert len(double) == 8 and [e["qid"] for e in double] == [e["qid"] for e in single]
    for a, b in zip(single, double):  # the same tokens; log-probs up to the engine's batch composition
        assert [(s["gen_ids"], s["text"]) for s in a["segments"]] == [(s["gen_ids"], s["text"]) for s in b["segments"]]
        for sa, sb in zip(a["segments"], b["segments"]):
            assert max(abs(x - y) for x, y in zip(sa["logprobs"], sb["logprobs"])) < 1e-5
    first = [_rl_out(out, r, "metrics.jsonl")[0] for r in ("one", "two")]
    for key in ("critic/rewards/mean", "answer_f1/mean", "rollout/turns_per_episode", "rollout/tokens_planner"):
        assert first[0][key] == first[1][key], key

    killed = _rl(out, args, "killed", two_ranks(), {"REDCODA_FAULT": "checkpoint:2",
                                               "REDCODA_FAULT_STAGE": "05_train_red_grpo"})
    assert killed.returncode != 0 and "SIGKILL" in killed.stderr
    # step 2 (the last) logged, its checkpoint cut short: no final adapter
    assert len(_rl_out(out, "killed", "metrics.jsonl")) == 2
    assert not (out / "killed" / "05_train_red_grpo" / "red" / "final_adapter").exists()
    resumed = _rl(out, args, "killed", two_ranks())
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert "resuming red from step 1" in resumed.stdout
    assert _numbers(out, "killed") == _numbers(out, "two")


def test_shards_and_blocks_split_a_batch_between_ranks():
    from utils.train.world import World

    items = ["a" * n for n in (5, 1, 9, 3, 7)]
    shards = [World(r, 2).shard(items) for r in range(2)]
    assert shards == [["a" * 5, "a" * 1, "a" * 9], ["a" * 3, "a" * 7]]  # dealt 9,7,5,3,1; batch order kept
    assert World().shard(items) is items
    assert [World(r, 3).block(list(range(7))) for r in range(3)] == [(0, [0, 1, 2]), (3, [3, 4]), (5, [5, 6])]
    assert World().block(items) == (0, items)


@pytest.mark.parametrize("rank, killed", [(None, True), ("0", True), ("1", False)])
def test_a_fault_point_fires_in_one_process_or_in_rank_0_alone(rank, killed):
    """Only the writing rank fires (utils/core/faults.py): with every rank firing, whichever died first
    had the launcher stop the rest, so the killed run's manifest was 'running' or 'failed' by chance."""
    code = "from utils.core.faults import fault_point; fault_point('p'); fault_point('p'); print('alive')"
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "REDCODA_FAULT_STAGE")} | {"REDCODA_FAULT": "p:2"}
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env | ({"RANK": rank} if rank else {}),
                          capture_output=True, text=True, timeout=60, start_new_session=True)
    assert (proc.returncode == -9, "alive" in proc.stdout) == (killed, not killed), proc.stderr

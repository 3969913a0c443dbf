"""09_driver.py --executor ray on a local Ray with 2 CPUs (started and shut down by the driver): the
branch graph, a failed branch that does not stop the others, a re-run that runs only what is
missing, and the same evaluations as the sequential driver at the same thread count."""
import json
import os
import subprocess
import sys

import pytest

from helpers import set_args, TINY, wait_for
from utils.core.config import ROOT
from utils.core.schema import DataConfig
from utils.data.synthetic import write_dataset
from utils.run.driver import plan
from utils.run.ray_executor import branches



def _driver(out, data, run, *extra, seeds="1,2", env=None):
    sets = set_args(*TINY, f"outputs_dir={out}", f"data.path={data}")
    cmd = [sys.executable, "09_driver.py", "--method", "fixed_sft,sft", "--seeds", seeds, "--run_id", run, *sets, *extra]
    return subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=1200,
                          env={**os.environ, "OMP_NUM_THREADS": "1", **(env or {})})


def _ran(proc) -> list[str]:
    """The stages a driver ran, as '<branch or seed> <stage>' labels, from its output."""
    return sorted(line.split(": running")[0].split("] ", 1)[0].split("[")[-1] + " " +
                  line.split(": running")[0].split("] ", 1)[1] for line in (proc.stdout + proc.stderr).splitlines()
                  if ": running (" in line)


def test_branches_follow_the_study_graph():
    steps = plan(["matched_sft", "grpo", "joint"])
    out = branches(steps, [1, 2], lambda s: ["--seed", str(s)])
    names = [b.name for b in out]
    assert names == [f"seed_{s}/{b}" for s in (1, 2)
                     for b in ("data", "warmup", "red", "matched_sft", "grpo", "joint", "evaluate")]
    by = {b.name: b for b in out}
    assert [s.script for s in by["seed_1/data"].steps] == ["00_check_data", "01_prepare_dataset", "02_build_rewards",
                                                            "03_generate_sft_traces"]
    assert [s.script for s in by["seed_1/warmup"].steps] == ["04_sft_warmup"] and by["seed_1/warmup"].needs == ["seed_1/data"]
    assert by["seed_2/grpo"].needs == ["seed_2/warmup"] and by["seed_2/grpo"].common == ["--seed", "2"]
    assert by["seed_1/matched_sft"].needs == ["seed_1/warmup", "seed_1/red"]  # it reads red's mean SFT weight
    assert by["seed_1/joint"].needs == ["seed_1/data"]  # RL from the base: it trains beside the warmup
    assert by["seed_1/evaluate"].needs == ["seed_1/data", "seed_1/warmup", "seed_1/red", "seed_1/matched_sft",
                                           "seed_1/grpo", "seed_1/joint"]
    assert [s.checkpoint for s in by["seed_1/evaluate"].steps] == ["base", "sft_warmup", "red", "matched_sft", "grpo",
                                                                   "joint"]
    assert [b.name for b in branches(steps, [None], lambda s: [])][:3] == ["data", "warmup", "red"]  # one seed: no prefix


@pytest.mark.slow
def test_ray_runs_the_branches_as_the_sequential_driver_does(tmp_path):
    data = tmp_path / "synth"
    write_dataset(DataConfig(n_train=40, n_val=6, n_test=6), data)
    out = tmp_path / "outputs"

    # the sequential reference: seed 1 alone (its outputs go to seq/, with the same --seed 1 as a study's seed_1/)
    sequential = _driver(out, data, "seq", seeds="1")
    assert sequential.returncode == 0, sequential.stderr[-2000:]

    # seed 2's first stage cannot write its folder: that branch fails, and the ones that need it do not run
    (out / "ray" / "seed_2").mkdir(parents=True)
    (out / "ray" / "seed_2" / "00_check_data").write_text("in the way")
    first = _driver(out, data, "ray", "--executor", "ray", "--ray_cpus", "2")
    assert first.returncode == 1, first.stdout[-2000:] + first.stderr[-3000:]
    log = out / "ray" / "logs" / "seed_2_data.log"
    assert f"seed_2/data: failed (exit 1); log: {log}" in first.stderr
    assert "00_check_data" in log.read_text()
    for name in ("warmup", "evaluate"):
        assert f"seed_2/{name}: not run (needs seed_2/data" in first.stderr
    for name in ("fixed_sft", "sft"):
        assert f"seed_2/{name}: not run (needs seed_2/warmup)" in first.stderr
    seed_1 = out / "ray" / "seed_1" / "07_evaluate"
    # seed 1's two 05 stages ran side by side in one seed folder (seed 2's slot was free)
    assert all((seed_1 / c / "manifest.json").is_file() for c in ("base", "sft_warmup", "fixed_sft", "sft"))
    assert not (out / "ray" / "08_compare_runs").exists()  # no report from half a study
    manifest = json.loads((out / "ray" / "run_manifest.json").read_text())
    assert manifest["status"] == "failed: see the branches above"
    assert {s["stage"] for s in manifest["stages"] if s["seed"] == 1} >= {"04_sft_warmup", "05_train_red_grpo/fixed_sft",
                                                                           "05_train_red_grpo/sft"}

    # the same command again, with the obstacle gone: only seed 2 and the report run
    (out / "ray" / "seed_2" / "00_check_data").unlink()
    second = _driver(out, data, "ray", "--executor", "ray", "--ray_cpus", "2")
    assert second.returncode == 0, second.stdout[-2000:] + second.stderr[-3000:]
    ran = _ran(second)
    assert ran[0].endswith(" 08_compare_runs") and all(label.startswith("seed_2/") for label in ran[1:]), ran
    assert "seed_2/warmup 04_sft_warmup" in ran and "seed_2/evaluate 07_evaluate/base,sft_warmup,fixed_sft,sft" in ran
    manifest = json.loads((out / "ray" / "run_manifest.json").read_text())
    assert manifest["status"] == "completed" and manifest["report"].endswith("08_compare_runs/report.md")
    skipped = {(s["seed"], s["stage"]) for s in manifest["stages"] if s["action"] == "skipped"}
    assert (1, "04_sft_warmup") in skipped and (1, "07_evaluate/fixed_sft") in skipped

    # seed 1's evaluations (its two 05 stages side by side), transcript for transcript, as the sequential
    # driver's at one thread
    for ckpt in ("base", "sft_warmup", "fixed_sft", "sft"):
        a = out / "seq" / "07_evaluate" / ckpt
        b = out / "ray" / "seed_1" / "07_evaluate" / ckpt
        assert (a / "samples" / "predictions.jsonl").read_bytes() == (b / "samples" / "predictions.jsonl").read_bytes()
        assert json.loads((a / "metrics.json").read_text())["accuracy"] == \
            json.loads((b / "metrics.json").read_text())["accuracy"]


def _stage_pids(out) -> list[int]:
    """Processes of this machine running a stage of the run folder `out` (their command lines name it)."""
    found = []
    for proc in os.listdir("/proc"):
        try:
            cmd = open(f"/proc/{proc}/cmdline", "rb").read().decode(errors="replace").split("\0")
        except OSError:
            continue
        if any(a.endswith("_sft_warmup.py") for a in cmd) and any(str(out) in a for a in cmd):
            found.append(int(proc))
    return found


def _start_and_wait_for_the_warmup(out, data, run):
    """A ray driver whose SFT warmup runs long (2,000 steps), once the warmup's manifest says running."""
    sets = set_args(*TINY, f"outputs_dir={out}", f"data.path={data}", "warmup.steps=2000", "warmup.save_every=2000")
    cmd = [sys.executable, "09_driver.py", "--method", "fixed_sft", "--run_id", run, "--executor", "ray",
           "--ray_cpus", "2", *sets]
    driver = subprocess.Popen(cmd, cwd=ROOT, start_new_session=True, stdout=subprocess.DEVNULL,
                              stderr=subprocess.PIPE, text=True, env={**os.environ, "OMP_NUM_THREADS": "1"})
    manifest = out / run / "04_sft_warmup" / "manifest.json"
    wait_for(lambda: driver.poll() is not None or (manifest.is_file() and '"running"' in manifest.read_text()
                                                   and _stage_pids(out)), 300, "04 to run under Ray")
    assert driver.poll() is None, driver.stderr.read()[-3000:]
    return driver


def _assert_gone_within(out, seconds: float) -> None:
    wait_for(lambda: not _stage_pids(out), seconds, "the run's stages to end",
             lambda: f": still running {_stage_pids(out)}")


def test_a_driver_terminated_or_killed_under_ray_takes_its_stages_with_it(tmp_path):
    """SIGTERM to the driver: its run manifest says so (Ray's own handler used to exit on the spot,
    leaving "running") and the stage unwinds. SIGKILL to the driver's process group: the stage, whose
    parent is a Ray worker outside that group, notices its driver is gone and stops, so the next start
    is not refused by a lock an orphan holds."""
    import signal

    data, out = tmp_path / "synth", tmp_path / "outputs"
    write_dataset(DataConfig(n_train=40, n_val=6, n_test=6), data)

    driver = _start_and_wait_for_the_warmup(out, data, "term")
    driver.send_signal(signal.SIGTERM)
    assert driver.wait(timeout=180) == 143, driver.stderr.read()[-3000:]
    assert json.loads((out / "term" / "run_manifest.json").read_text())["status"] == "terminated (ray)"
    _assert_gone_within(out, 60)
    assert json.loads((out / "term" / "04_sft_warmup" / "manifest.json").read_text())["status"] == "failed"

    driver = _start_and_wait_for_the_warmup(out, data, "kill")
    os.killpg(driver.pid, signal.SIGKILL)
    driver.wait(timeout=60)
    _assert_gone_within(out, 90)
    from utils.core.lock import RunLock

    with RunLock(out / "kill"):  # what the next start takes first: no live process holds the run
        pass

"""One writer per run: a second driver or stage on a run in use is refused at once, naming the
holder; a lock left by a killed process is taken over; the driver's own stages get through."""
import json
import os
import socket
import subprocess
import sys
import time

import pytest

from helpers import run_stage
from utils.core.config import ROOT
from utils.core.lock import HOLDER_ENV, RunLock, RunLocked, live_holder


def _hold(path, pid, command="09_driver.py --method red"):
    path.mkdir(parents=True, exist_ok=True)
    (path / ".lock").write_text(json.dumps({"pid": pid, "host": socket.gethostname(), "command": command,
                                            "started": "2026-01-01T00:00:00Z"}))


@pytest.fixture
def other():
    """A live process that is neither this one nor its driver."""
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    yield proc
    proc.kill()
    proc.wait()


def test_a_run_in_use_is_refused_naming_its_holder(tmp_path, other):
    _hold(tmp_path / "run", other.pid)
    with pytest.raises(RunLocked, match=rf"in use by pid {other.pid} .*09_driver.py --method red"):
        RunLock(tmp_path / "run").acquire()
    with pytest.raises(RunLocked, match=f"pid {other.pid}"):  # a seed folder below a held run
        RunLock(tmp_path / "run" / "seed_2").acquire()
    os.environ[HOLDER_ENV] = str(other.pid)  # ... unless the holder is our driver
    try:
        with RunLock(tmp_path / "run" / "seed_2") as lock:
            assert json.loads(lock.path.read_text())["pid"] == os.getpid()
        assert not lock.path.exists()  # released
    finally:
        del os.environ[HOLDER_ENV]


def test_live_holder_names_a_live_holder_and_nothing_else(tmp_path, other):
    """What benchmarks/chaos_soak.py waits on: a lock held by a live process, not a dead or absent one."""
    _hold(tmp_path / "live", other.pid)
    assert live_holder(tmp_path / "live" / ".lock")["pid"] == other.pid
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    _hold(tmp_path / "dead", dead.pid)
    assert live_holder(tmp_path / "dead" / ".lock") is None
    assert live_holder(tmp_path / "none" / ".lock") is None


def test_a_stale_lock_is_taken_over(tmp_path, capsys):
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    _hold(tmp_path / "run", dead.pid)
    with RunLock(tmp_path / "run") as lock:
        assert json.loads(lock.path.read_text())["pid"] == os.getpid()
    assert f"taking over a stale lock on {tmp_path / 'run'} (pid {dead.pid} is gone)" in capsys.readouterr().err
    (tmp_path / "run" / ".lock").write_text("")  # cut off mid-write by a kill: stale too
    with RunLock(tmp_path / "run"):
        pass


def test_a_stage_on_a_run_in_use_stops_before_writing(tmp_path, other, capsys):
    out = tmp_path / "o"
    _hold(out / "t", other.pid)
    assert run_stage("00_check_data", out) == 1
    assert f"in use by pid {other.pid}" in capsys.readouterr().err
    assert not (out / "t" / "00_check_data").exists()  # nothing written, no manifest


def test_a_second_driver_is_refused_at_once(tmp_path, other):
    _hold(tmp_path / "outputs" / "r", other.pid, "09_driver.py --method grpo")
    proc = subprocess.run([sys.executable, "09_driver.py", "--method", "red", "--run_id", "r", "--set",
                           f"outputs_dir={tmp_path / 'outputs'}"], cwd=ROOT, capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 1
    assert f"09_driver: error: {tmp_path / 'outputs' / 'r'} is in use by pid {other.pid}" in proc.stderr
    assert "09_driver.py --method grpo" in proc.stderr
    assert not (tmp_path / "outputs" / "r" / "run_manifest.json").exists()


def test_a_zombie_holder_is_stale_and_method_stages_lock_the_run(tmp_path, other):
    """A SIGKILLed stage not yet reaped is a zombie: its lock is stale. A method's stage folder
    (<run>/06_ablate_grpo_only/grpo) locks <run> itself."""
    from utils.core.manifest import StageRun

    zombie = subprocess.Popen([sys.executable, "-c", "pass"])
    time.sleep(1.0)  # exited, never waited for: a zombie
    _hold(tmp_path / "run", zombie.pid)
    with RunLock(tmp_path / "run"):
        pass
    zombie.wait()
    _hold(tmp_path / "run", other.pid)
    with pytest.raises(RunLocked, match=f"run is in use by pid {other.pid}"):
        with StageRun("06_ablate_grpo_only/grpo", tmp_path / "run" / "06_ablate_grpo_only" / "grpo", {}):
            pass
    other_lock = tmp_path / "run" / ".lock"
    other_lock.unlink()
    with StageRun("05_train_red_grpo/red", tmp_path / "run" / "05_train_red_grpo" / "red", {}):
        assert json.loads(other_lock.read_text())["pid"] == os.getpid()  # the run's lock, not the script folder's
        assert not (tmp_path / "run" / "05_train_red_grpo" / ".lock").exists()

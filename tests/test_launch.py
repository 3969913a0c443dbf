"""How the driver starts a stage: forked from itself (`run_forked`, the default) or as a new
interpreter (`run_child`). A forked stage must behave as a fresh one: its own argv, exit code and
output, its exit handlers run, none of the parent's `finally` blocks run in it, a SIGTERM stops it
the same way; and the whole chain gives the same files either way."""
import json
import subprocess
import sys
import threading
import time

import pytest

from helpers import set_args, TINY
from utils.core.config import ROOT
from utils.core.schema import DataConfig
from utils.core.signals import PARENT_ENV, run_forked, single_threaded
from utils.data.synthetic import write_dataset


SCRIPT = """
import atexit, json, os, sys
out = sys.argv[1]
atexit.register(lambda: open(out + ".atexit", "w").write("ran"))
print("stdout line"); print("stderr line", file=sys.stderr)
json.dump({"argv": sys.argv[1:], "parent": os.environ.get("%s"), "ppid": os.getppid(),
           "name": __name__, "fresh": sys.orig_argv[1:2] == [sys.argv[0]],
           "comm": open("/proc/self/comm").read().strip()}, open(out, "w"))
sys.exit(int(sys.argv[2]))
""" % PARENT_ENV


def _script(tmp_path):
    path = tmp_path / "probe.py"
    path.write_text(SCRIPT)
    return path


def test_a_forked_script_gets_its_argv_exit_code_output_and_exit_handlers(tmp_path):
    """Run from a fresh interpreter of its own: pytest's process may hold other tests' threads (an
    engine's, a pool's), beside which `run_forked` rightly refuses to fork."""
    script, out, log = _script(tmp_path), tmp_path / "seen.json", tmp_path / "log.txt"
    runner = tmp_path / "runner.py"
    runner.write_text(
        "import json, os, sys\n"
        f"sys.path.insert(0, {str(ROOT)!r})\n"
        "from utils.core.signals import run_forked, single_threaded\n"
        "alone, finally_ran = single_threaded(), []\n"
        "try:\n"
        f"    with open({str(log)!r}, 'w') as fh:\n"
        f"        code = run_forked({str(script)!r}, [{str(out)!r}, '3'], {str(tmp_path)!r}, fh)\n"
        "finally:\n"
        "    finally_ran.append(os.getpid())  # a child returning into this stack would append from its pid\n"
        "print(json.dumps({'code': code, 'pid': os.getpid(), 'alone': alone, 'finally': finally_ran}))\n")
    proc = subprocess.run([sys.executable, str(runner)], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    ran = json.loads(proc.stdout.splitlines()[-1])  # only the parent prints it
    assert ran["alone"] and ran["code"] == 3
    seen = json.loads(out.read_text())
    assert seen["argv"] == [str(out), "3"] and seen["name"] == "__main__"
    assert seen["parent"] == str(ran["pid"]) == str(seen["ppid"])  # it stops with us (run_main reads this)
    assert seen["fresh"] is False  # forked: the interpreter's own command line is the runner's
    assert seen["comm"] == "probe"  # what top shows: the script's name, not the parent's
    assert (tmp_path / "seen.json.atexit").read_text() == "ran"
    # both streams reach the file; stdout is block-buffered there, as in a new interpreter
    assert sorted(log.read_text().splitlines()) == ["stderr line", "stdout line"]
    assert ran["finally"] == [ran["pid"]]


def test_a_process_with_other_threads_starts_a_fresh_interpreter_instead(tmp_path):
    script, out = _script(tmp_path), tmp_path / "seen.json"
    stop = threading.Event()
    worker = threading.Thread(target=stop.wait)
    worker.start()
    try:
        assert not single_threaded()
        code = run_forked(str(script), [str(out), "0"], tmp_path)
    finally:
        stop.set()
        worker.join()
    assert code == 0
    assert json.loads(out.read_text())["fresh"] is True


def test_sigterm_to_the_parent_stops_a_forked_child_through_its_handlers(tmp_path):
    """The driver's path: SIGTERM raises in the parent's wait, which stops the child with SIGTERM;
    the child's stage handler (run_main) turns it into exit 143 after unwinding."""
    script = tmp_path / "stage.py"
    script.write_text(
        "import sys, time\n"
        "from utils.core.stages import run_main\n"
        "def main():\n"
        "    open(sys.argv[1], 'w').write('started')\n"
        "    time.sleep(60)\n"
        "sys.exit(run_main('probe', main))\n")
    started = tmp_path / "started"
    runner = tmp_path / "runner.py"
    runner.write_text(
        "import sys\n"
        f"sys.path.insert(0, {str(ROOT)!r})\n"
        "from utils.core.signals import run_forked, sigterm_as_interrupt\n"
        "try:\n"
        "    with sigterm_as_interrupt():\n"
        f"        run_forked({str(script)!r}, [{str(started)!r}], {str(ROOT)!r})\n"
        "except KeyboardInterrupt as exc:\n"
        "    print('parent stopped:', type(exc).__name__)\n")
    proc = subprocess.Popen([sys.executable, str(runner)], cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)
    deadline = time.time() + 60
    while not started.exists() and time.time() < deadline:
        time.sleep(0.1)
    assert started.exists()
    t0 = time.time()
    proc.terminate()
    out, err = proc.communicate(timeout=60)
    assert time.time() - t0 < 30  # not the child's 60-s sleep
    assert "parent stopped: Terminated" in out
    assert "probe: terminated; its manifest says 'failed'" in err


PRELOAD_PROBE = """
import json, sys
from utils.run.driver import Step, expected_sha, preload
step = Step("05_train_red_grpo", "05_train_red_grpo/red", algorithm="red")
for argv in json.loads(sys.argv[1]):  # one config after another, in this one process
    preload(step.script, expected_sha(step, argv)[1])
    print("peft" in sys.modules, "vllm" in sys.modules)
"""


def test_the_driver_preloads_vllm_only_for_a_stage_that_samples_with_it():
    def loaded(*configs):
        argv = json.dumps([set_args(*sets) for sets in configs])
        proc = subprocess.run([sys.executable, "-c", PRELOAD_PROBE, argv], cwd=ROOT, capture_output=True, text=True,
                              timeout=300)
        assert proc.returncode == 0, proc.stderr[-2000:]
        return [line.split() for line in proc.stdout.splitlines()[-len(configs):]]

    # HF sampling leaves vLLM out; the same process then preloading for vLLM sampling takes it in
    assert loaded(["model.engine.name=hf"], ["model.engine.name=vllm"]) == [["True", "False"], ["True", "True"]]
    assert loaded(["model.engine.name=hf", "reward.process.source=judge", "reward.process.judge_engine=vllm"]) == [
        ["True", "True"]]


VOLATILE = {"started_at", "finished_at", "wall_seconds", "peak_rss_mb", "peak_rss_children_mb", "seal_sha256"}


def _comparable(path, out) -> bytes | dict | list:
    """A file's content with what legitimately differs between two runs taken out: the run's own
    folder in recorded paths, a manifest's times and memory (and its seal, a hash over them), and
    the `time/` keys of metric lines."""
    if path.suffix == ".pt":  # a resumable checkpoint: all but Python's `random` state, which no stage
        import torch            # seeds (a fresh interpreter draws it from the OS, a forked one inherits it)

        state = torch.load(path, weights_only=False)
        state.pop("python_rng", None)
        return _plain(state)
    text = path.read_bytes()
    if path.suffix not in (".json", ".jsonl"):
        return text
    text = text.decode().replace(out.resolve().as_posix(), "<out>")
    if path.name == "manifest.json":  # recorded hashes by name only: every file is compared itself, and a
        m = {k: v for k, v in json.loads(text).items() if k not in VOLATILE}  # folder's hash covers its
        return {**m, **{k: sorted(m.get(k, {})) for k in ("parents", "inputs", "outputs")}}  # adapter_config
    if path.name == "adapter_config.json":  # peft writes target_modules from a set: its order is the hash seed's
        return {k: sorted(v) if k == "target_modules" else v for k, v in json.loads(text).items()}
    if path.suffix == ".jsonl":
        return [{k: v for k, v in json.loads(ln).items() if not k.startswith("time/")} for ln in text.splitlines() if ln]
    return json.loads(text)


def _plain(x):
    """A checkpoint's nested state with every tensor as (dtype, shape, raw bytes): comparable with ==."""
    if isinstance(x, dict):
        return {k: _plain(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_plain(v) for v in x]
    if hasattr(x, "numpy"):
        return (str(x.dtype), tuple(x.shape), x.detach().contiguous().view(-1).numpy().tobytes())
    return x


@pytest.mark.slow
def test_fork_and_exec_give_the_same_files(tmp_path):
    """The tiny chain for the sft method (00-05, 07) once with each launch: every file under the
    stages is the same, byte for byte, but for times, memory and the run's own folder."""
    data = tmp_path / "data"
    write_dataset(DataConfig(n_train=40, n_val=6, n_test=6), data)
    trees, outs = {}, {}
    for launch in ("fork", "exec"):
        out = outs[launch] = tmp_path / launch
        sets = set_args(*TINY, f"outputs_dir={out}", f"data.path={data}")
        proc = subprocess.run([sys.executable, "09_driver.py", "--method", "sft", "--run_id", "r", "--launch", launch,
                               *sets], cwd=ROOT, capture_output=True, text=True, timeout=900)
        assert proc.returncode == 0, proc.stderr[-3000:]
        trees[launch] = {p.relative_to(out / "r"): p for p in (out / "r").rglob("*") if p.is_file()
                         and p.relative_to(out / "r").parts[0] not in ("08_compare_runs", "run_manifest.json", ".lock",
                                                                        "logs")}  # console logs: pids, rates
    assert trees["fork"].keys() == trees["exec"].keys()
    assert len(trees["fork"]) > 30
    for rel, path in sorted(trees["fork"].items()):
        assert _comparable(path, outs["fork"]) == _comparable(trees["exec"][rel], outs["exec"]), rel

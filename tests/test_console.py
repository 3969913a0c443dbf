"""The quiet console (utils/core/console.py): a stage's known-harmless dependency messages stay out of
the driver's console and in the stage's log; everything else, real warnings and errors first,
still reaches the console, each on the stream it was written to."""
import io
import json
import os
import subprocess
import sys

import pytest

from helpers import set_args
from utils.core.config import ROOT
from utils.core.console import Filter, harmless

VLLM_LINE = ("(MainProcess pid=12807) WARNING 12-02 01:46:36 [layerwise.py:266] RotaryEmbedding: Failed to "
             "load weights\n")
REAL = "/x/y.py:3: UserWarning: the learning rate is negative\n  warnings.warn(msg)\n"
NANOBIND = 'nanobind: leaked 4 instances!\n - leaked instance 0x7f of type "triton._C.libtriton.ir.attribute"\n'


def _through(*chunks: str) -> tuple[str, str]:
    console, log = io.BytesIO(), io.BytesIO()
    f = Filter(console, log)
    for c in chunks:
        f.feed(c.encode())
    f.finish()
    return console.getvalue().decode(), log.getvalue().decode()


def test_harmless_lines_and_their_continuations_stay_in_the_log_only():
    text = ["stage: running\n", VLLM_LINE, NANOBIND, "nanobind: this is likely caused by a reference counting issue\n",
            REAL, "stage: done\n"]
    console, log = _through(*text)
    assert log == "".join(text)
    assert console == "stage: running\n" + REAL + "stage: done\n"  # the real warning keeps its source line


def test_a_line_split_across_reads_is_filtered_whole_and_progress_bars_pass_as_they_come():
    half = len(VLLM_LINE) // 2
    console, _ = _through(VLLM_LINE[:half], VLLM_LINE[half:], "\rsft:  50%|#####     | 3/6", "\rsft: 100%|##########| 6/6\n")
    assert console == "\rsft:  50%|#####     | 3/6\rsft: 100%|##########| 6/6\n"
    # a harmless warning printed right after a bar that had no newline: the bar stays, the warning goes
    bar = "\rsft: 100%|##| 6/6]/v/dispatcher.py:138: FutureWarning: `torch.distributed.reduce_op` is deprecated\n"
    console, log = _through(bar, "  if hasattr(value, '__dict__'):\n", "next\n")
    assert console == "\rsft: 100%|##| 6/6]\nnext\n" and "reduce_op" in log


def test_every_pattern_matches_the_message_it_was_written_for_and_not_its_neighbours():
    seen = [VLLM_LINE, "Triton is installed, but doesn't include CPU backend. Disabling Triton.",
            "[W1202 01:46:34.548168925 utils.cpp:68] Warning: NUMA binding: Using MEMBIND policy for memory",
            "(MainProcess pid=1) WARNING 12-02 01:46:34 [cpu_worker.py:114] libiomp is not found in LD_PRELOAD.",
            "(MainProcess pid=1) WARNING 12-02 01:46:35 [cpu_worker.py:140] CPU backend doesn't allow to use "
            "`torch.set_num_threads` after the thread binding, skip it."]
    assert all(harmless(line) is not None for line in seen)
    real = ["(MainProcess pid=1) WARNING 12-02 01:46:34 [scheduler.py:10] KV cache is full: preempting",
            "(MainProcess pid=1) ERROR 12-02 01:46:34 [core.py:9] RotaryEmbedding: Failed to load weights",
            "Traceback (most recent call last):", "05_train_red_grpo: error: no usable traces", REAL.splitlines()[0]]
    assert all(harmless(line) is None for line in real)


CHILD = """
import sys, warnings
print("stage: started", flush=True)
print({vllm!r}, end="", flush=True)
warnings.warn("a real problem")
print("stage: error: it broke", file=sys.stderr, flush=True)
sys.exit(3)
""".format(vllm=VLLM_LINE)

PARENT = """
import sys
from pathlib import Path
from utils.core.signals import run_child, run_forked
how, script, log = sys.argv[1:]
if how == "child":
    sys.exit(run_child([sys.executable, script], ".", console_log=Path(log)))
sys.exit(run_forked(script, [], ".", console_log=Path(log)))
"""


@pytest.mark.parametrize("how", ["child", "forked"])
def test_a_stage_process_through_the_filter_keeps_its_streams_its_exit_code_and_everything_in_the_log(tmp_path, how):
    (tmp_path / "child.py").write_text(CHILD)
    (tmp_path / "parent.py").write_text(PARENT)
    log = tmp_path / "logs" / "stage.log"
    out = subprocess.run([sys.executable, str(tmp_path / "parent.py"), how, str(tmp_path / "child.py"), str(log)],
                         cwd=ROOT, capture_output=True, text=True, timeout=120, env={"PYTHONPATH": str(ROOT)})
    assert out.returncode == 3
    assert out.stdout == "stage: started\n"
    assert "UserWarning: a real problem" in out.stderr and "stage: error: it broke" in out.stderr
    assert "RotaryEmbedding" not in out.stdout + out.stderr
    kept = log.read_text()
    assert "RotaryEmbedding: Failed to load weights" in kept and "a real problem" in kept and "it broke" in kept


QUIET_CHAIN = ["regime=regime_d", "data.n_train=40", "data.n_val=6", "data.n_test=6", "warmup.steps=4",
               "warmup.eval_every=0", "warmup.eval_size=3", "warmup.batch_size=8", "algorithm.rl.steps=1",
               "algorithm.rl.questions_per_step=2", "algorithm.rl.n_samples=2", "wandb_mode=disabled"]


@pytest.mark.slow
def test_a_tiny_chain_on_vllm_prints_no_harmless_warning_and_its_logs_keep_them(tmp_path):
    from utils.core.schema import DataConfig
    from utils.data.synthetic import write_dataset

    data = tmp_path / "synth"
    write_dataset(DataConfig(n_train=40, n_val=6, n_test=6), data)
    out = tmp_path / "outputs"

    # a user's shell: none of the vLLM variables that this test worker's own in-process engines left behind
    env = {k: v for k, v in os.environ.items() if not k.startswith("VLLM_")}

    def driver(*extra):
        sets = set_args(*QUIET_CHAIN, f"outputs_dir={out}", f"data.path={data}", *extra)
        return subprocess.run([sys.executable, "09_driver.py", "--method", "red", "--run_id", "q", *sets], cwd=ROOT,
                              capture_output=True, text=True, timeout=1200, env=env)

    run = driver()
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    console = run.stdout + run.stderr
    lines = [line for chunk in console.splitlines() for line in chunk.split("\r")]
    assert [line for line in lines if harmless(line) is not None] == []
    assert "nanobind" not in console and "WARNING" not in console, [ln for ln in lines if "nanobind" in ln
                                                                      or "WARNING" in ln]
    assert "[6/10] 05_train_red_grpo/red: done" in run.stdout and "05_train_red_grpo: red 1 steps" in run.stdout
    logs = out / "q" / "logs"
    kept = {p.name: p.read_text() for p in logs.glob("*.log")}
    assert "RotaryEmbedding: Failed to load weights" in kept["05_train_red_grpo.red.log"]
    assert any("RotaryEmbedding" in text for name, text in kept.items() if name.startswith("07_evaluate"))
    assert json.loads((out / "q" / "run_manifest.json").read_text())["status"] == "completed"

    broken = driver(f"data.path={tmp_path / 'missing'}")  # a real error still shows
    assert broken.returncode == 1 and "dataset directory not found" in broken.stderr

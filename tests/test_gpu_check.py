"""benchmarks/gpu_check.py's CPU dry run: the GPU check's code paths (the hf chain in float32 and
bfloat16, the killed and resumed 05, the seed-shaped models) on this machine, with vLLM, wandb and
ray hidden as on the GPU image, so that the script cannot rot between the times a GPU is at hand."""
import json
import os
import signal
import subprocess
import sys

from utils.core.config import ROOT

HIDDEN = "vllm,wandb,ray"


def test_hidden_packages_are_not_installed_as_far_as_python_can_tell():
    probe = ("import sys; sys.path.insert(0, 'benchmarks'); import gpu_check; gpu_check.hide('vllm,wandb,ray')\n"
             "import importlib.util, importlib.metadata as md\n"
             "assert all(importlib.util.find_spec(n) is None for n in ('vllm', 'wandb', 'ray'))\n"
             "assert not [d for d in md.distributions() if d.metadata['Name'].lower() in ('vllm', 'wandb', 'ray')]\n"
             "import peft, transformers, utils.agent.engines, utils.train.rl_stage  # the hf path imports\n"
             "try:\n    import wandb\nexcept ImportError:\n    print('hidden')\n")
    done = subprocess.run([sys.executable, "-c", probe], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0 and done.stdout.strip() == "hidden", done.stderr[-3000:]


SHAPES = ("qwen2.5-0.5b", "gemma-2-2b")


def test_the_gpu_check_dry_run_passes_on_the_cpu_with_vllm_wandb_and_ray_hidden(tmp_path):
    cmd = [sys.executable, "benchmarks/gpu_check.py", "--dry_run", "--out", str(tmp_path)]
    done = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    r = json.loads((tmp_path / "gpu_check.json").read_text())
    assert (tmp_path / "gpu_check.txt").read_text().startswith("env: ")
    assert r["env"]["vllm"] is None and r["env"]["wandb"] is None and r["env"]["ray"] is None
    assert r["env"]["transformers"] and r["env"]["peft"] and r["skipped"] == []
    assert list(r["seed_shape"]) == list(SHAPES) and list(r["chain"]) == ["bfloat16", "float32"]  # the order run
    for dtype in ("float32", "bfloat16"):
        c = r["chain"][dtype]
        assert "failed" not in c, c
        assert [s["status"] for s in c["stages"].values()] == ["completed"] * 7
        assert [s["step"] for s in c["rl_steps"]] == [1, 2, 3]
        assert all(s["time/rollout"] > 0 and s["time/update"] > 0 for s in c["rl_steps"])
        assert c["sft_step_s_median"] > 0 and set(c["accuracy"]) == {"sft_warmup", "red"}
    # trainer and hf engine in fp32 on one machine agree to rounding (measured 3.5e-7 here and
    # 1.4e-7 on an H100); bf16 does not (3.9e-3 here, 7.1e-3 on the H100)
    assert max(s["rollout/logprob_mismatch"] for s in r["chain"]["float32"]["rl_steps"]) < 1e-4
    resume = r["chain"]["bfloat16"]["resume"]
    assert resume["ok"] and resume["killed_returncode"] == -9 and resume["steps_logged"] == [1, 2, 3], resume
    assert resume["expected"] == "resuming red from step 1" and resume["said_it"]
    for name in SHAPES:
        s = r["seed_shape"][name]
        assert s["params"] > 0 and s["rollout"]["tokens"] > 0 and s["oom_at_episodes"] == [], s
        assert s["update_s"] > 0 and s["update_episodes"] == 4 and s["sft_step_s"] > 0, s
        assert s["memory"]["activation_checkpointing"] is True and s["update_tokens_per_s"] > 0, s
        assert [b["micro_batch_tokens"] for b in s["budget_sweep"]] == [128] and s["budget_sweep"][0]["update_s"] > 0
        # the CPU's tiny --dry_run passes are all fixed cost, so the fitted slope is noise of either
        # sign; a slope at or below zero must leave the cost unstated, never negative
        cost = s["pass_cost"]
        assert len(cost["points"]) == 5 and all(t > 0 for _, t in cost["points"]), cost
        assert (cost["tokens"] is None) == (cost["per_token_s"] <= 0) and (cost["tokens"] or 0) >= 0, cost
        assert "failed" not in s, s
        assert s["lora"] == {"rank": 16, "targets": ["q_proj", "v_proj"]}  # configs/models/<name>.yaml
    assert r["gemma_estimate_from_qwen"]["update_s"] > 0
    assert not any((tmp_path / name).exists() for name in SHAPES)  # the random models are removed


def test_a_run_killed_mid_shape_keeps_every_phase_before_the_kill(tmp_path):
    """The rehearsal of a timeout: the dry run SIGKILLed (its whole process group) as Gemma's SFT step
    starts, Qwen's shape and Gemma's update done. Both files hold every figure measured before."""
    env = {**os.environ, "REDCODA_FAULT": "gpu_check:gemma-2-2b/sft_step"}
    done = subprocess.run([sys.executable, "benchmarks/gpu_check.py", "--dry_run", "--out", str(tmp_path)], cwd=ROOT,
                          env=env, capture_output=True, text=True, timeout=900, start_new_session=True)
    assert done.returncode == -signal.SIGKILL, done.stdout[-3000:] + done.stderr[-3000:]
    r = json.loads((tmp_path / "gpu_check.json").read_text())
    qwen, gemma = (r["seed_shape"][n] for n in SHAPES)
    assert qwen["update_s"] > 0 and qwen["sft_step_s"] > 0 and qwen["update_episodes"] == 4, qwen
    assert gemma["update_s"] > 0 and gemma["update_tokens_per_s"] > 0 and "sft_step_s" not in gemma, gemma
    assert "budget_sweep" not in qwen and "rollout" not in qwen and r["chain"] == {}  # not reached
    assert r["gemma_estimate_from_qwen"]["sft_step_s"] > 0
    text = (tmp_path / "gpu_check.txt").read_text()
    assert '"update_s"' in text and "seed shape gemma-2-2b" in text, text


def test_a_phase_that_fails_keeps_the_figures_before_it_and_the_run_goes_on(tmp_path, monkeypatch):
    """An out-of-memory error in Qwen's SFT step (injected: the real update runs first) is named in
    its section, the update's figures stay, the estimate takes what Qwen has (it raised KeyError
    when the SFT step was missing, and the text summary was never written), and Gemma's shape runs."""
    import utils.train.sft_trainer

    monkeypatch.syspath_prepend(str(ROOT / "benchmarks"))
    import gpu_check

    def out_of_memory(*args, **kwargs):
        raise RuntimeError("CUDA out of memory (injected)")

    monkeypatch.setattr(utils.train.sft_trainer, "sft_backward", out_of_memory)
    monkeypatch.setattr(sys, "argv", ["gpu_check.py", "--device", "cpu", "--quick", "--out", str(tmp_path),
                                      "--dtypes", "", "--sweep", "", "--no_rollout"])
    assert gpu_check.main() == 1
    r = json.loads((tmp_path / "gpu_check.json").read_text())
    qwen, gemma = (r["seed_shape"][n] for n in SHAPES)
    assert qwen["failed"] == ["qwen2.5-0.5b/sft_step: RuntimeError: CUDA out of memory (injected)"], qwen
    assert qwen["update_s"] > 0 and qwen["update_episodes"] == 4 and "sft_step_s" not in qwen, qwen
    assert gemma["update_s"] > 0 and gemma["failed"] == ["gemma-2-2b/sft_step: RuntimeError: CUDA out of memory "
                                                         "(injected)"], gemma
    assert set(r["gemma_estimate_from_qwen"]) == {"param_ratio", "basis", "update_s"}
    assert "qwen2.5-0.5b/sft_step: RuntimeError" in (tmp_path / "gpu_check.txt").read_text()


def test_phases_past_the_budget_are_skipped_and_listed(tmp_path):
    done = subprocess.run([sys.executable, "benchmarks/gpu_check.py", "--dry_run", "--out", str(tmp_path),
                           "--budget", "0", "--dtypes", "float32", "--sweep", ""], cwd=ROOT, capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    r = json.loads((tmp_path / "gpu_check.json").read_text())
    assert r["skipped"] == [f"{n}/{p}" for n in SHAPES for p in ("build", "update", "sft_step")] + \
        [f"{n}/pass_cost" for n in SHAPES] + [f"{n}/rollout" for n in SHAPES] + ["chain/float32"], r["skipped"]
    assert "skipped (over the budget): qwen2.5-0.5b/build" in (tmp_path / "gpu_check.txt").read_text()


def test_a_sigterm_stops_the_check_and_says_where(tmp_path):
    """`timeout`'s SIGTERM, sent once Qwen's SFT step is written: the check stops (a stage run in
    process used to catch it as its own stop, and the check went on to the next phase), exits 143,
    and both files say in which phase."""
    import time

    proc = subprocess.Popen([sys.executable, "benchmarks/gpu_check.py", "--dry_run", "--out", str(tmp_path)], cwd=ROOT,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    deadline = time.time() + 300
    while time.time() < deadline:
        try:
            if "sft_step_s" in json.loads((tmp_path / "gpu_check.json").read_text())["seed_shape"]["qwen2.5-0.5b"]:
                break
        except (OSError, ValueError, KeyError):
            pass
        time.sleep(0.2)
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=300)
    assert proc.returncode == 143, err[-3000:]
    r = json.loads((tmp_path / "gpu_check.json").read_text())
    assert r["stopped"].startswith("terminated in "), r.get("stopped")
    assert r["seed_shape"]["qwen2.5-0.5b"]["sft_step_s"] > 0
    assert f"stopped: {r['stopped']}" in (tmp_path / "gpu_check.txt").read_text()

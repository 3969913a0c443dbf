"""benchmarks/gpu_check.py's CPU dry run: the GPU check's code paths (the hf chain in float32 and
bfloat16, the killed and resumed 05, the seed-shaped models) on this machine, with vLLM, wandb and
ray hidden as on the GPU image, so that the script cannot rot between the times a GPU is at hand."""
import json
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


def test_the_gpu_check_dry_run_passes_on_the_cpu_with_vllm_wandb_and_ray_hidden(tmp_path):
    cmd = [sys.executable, "benchmarks/gpu_check.py", "--device", "cpu", "--quick", "--hide", HIDDEN,
           "--out", str(tmp_path)]
    done = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    r = json.loads((tmp_path / "gpu_check.json").read_text())
    assert (tmp_path / "gpu_check.txt").read_text().startswith("env: ")
    assert r["env"]["vllm"] is None and r["env"]["wandb"] is None and r["env"]["ray"] is None
    assert r["env"]["transformers"] and r["env"]["peft"]
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
    for name in ("qwen2.5-0.5b", "gemma-2-2b"):
        s = r["seed_shape"][name]
        assert s["params"] > 0 and s["rollout"]["tokens"] > 0 and s["oom_at_episodes"] == [], s
        assert s["update_s"] > 0 and s["update_episodes"] == 4 and s["sft_step_s"] > 0, s
        assert s["memory"]["activation_checkpointing"] is True and s["update_tokens_per_s"] > 0, s
        assert [b["micro_batch_tokens"] for b in s["budget_sweep"]] == [128] and s["budget_sweep"][0]["update_s"] > 0
        assert "failed" not in s and "phase" not in s, s
        assert s["lora"] == {"rank": 16, "targets": ["q_proj", "v_proj"]}  # configs/models/<name>.yaml
    assert r["gemma_estimate_from_qwen"]["update_s"] > 0


def test_a_seed_shape_that_fails_keeps_the_figures_measured_before_and_names_the_phase(tmp_path, monkeypatch):
    """An out-of-memory error in the SFT step (injected: the real rollout and update run first) must
    not lose the rollout's and the update's figures, as it once lost Gemma-2-2B's on an H200."""
    import argparse

    import utils.train.sft_trainer

    monkeypatch.syspath_prepend(str(ROOT / "benchmarks"))
    import gpu_shapes

    def out_of_memory(*args, **kwargs):
        raise RuntimeError("CUDA out of memory (injected)")

    monkeypatch.setattr(utils.train.sft_trainer, "sft_backward", out_of_memory)
    s = gpu_shapes.seed_shape(argparse.Namespace(quick=True, device="cpu", sweep="128"), "qwen2.5-0.5b", tmp_path)
    assert s["failed"] == "sft_step: RuntimeError: CUDA out of memory (injected)", s
    assert s["rollout"]["tokens"] > 0 and s["update_s"] > 0 and s["update_episodes"] == 4, s
    assert "sft_step_s" not in s and "phase" not in s

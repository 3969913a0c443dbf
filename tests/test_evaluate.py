"""07 on several checkpoints in one process: one engine serves them all, swapping adapters, and every
checkpoint's outputs and manifest are what evaluating it alone gives."""
import json
import shutil

from helpers import run_stage, sft_args

EVAL = ["--set", "model.engine.memory_share=0.1", "--set", "model.engine.lora_serving=merged"]


def _outputs(out, checkpoint):
    d = out / "t" / "07_evaluate" / checkpoint
    m = json.loads((d / "manifest.json").read_text())
    return (d / "samples" / "predictions.jsonl").read_text(), (d / "metrics.json").read_text(), m


def test_checkpoints_sharing_one_engine_equal_separate_evaluations(prepared):  # noqa: F811
    out, args = prepared
    assert run_stage("03_generate_sft_traces", out, *args) == 0
    assert run_stage("04_sft_warmup", out, *args, *sft_args()) == 0
    # adapter first, then the bare base: the engine must unmerge what it served before
    assert run_stage("07_evaluate", out, *args, *EVAL, "--checkpoint", "sft_warmup,base") == 0
    shared = {c: _outputs(out, c) for c in ("sft_warmup", "base")}
    assert shared["sft_warmup"][0] != shared["base"][0]  # the adapter changes what is generated
    shutil.rmtree(out / "t" / "07_evaluate")
    for checkpoint in ("base", "sft_warmup"):
        assert run_stage("07_evaluate", out, *args, *EVAL, "--checkpoint", checkpoint) == 0
        alone = _outputs(out, checkpoint)
        assert alone[0] == shared[checkpoint][0], checkpoint  # token-identical transcripts
        assert alone[1] == shared[checkpoint][1], checkpoint
        for key in ("config_sha256", "inputs", "outputs", "parents", "metrics"):
            assert alone[2][key] == shared[checkpoint][2][key], (checkpoint, key)


def test_checkpoint_list_is_validated(prepared):  # noqa: F811
    out, args = prepared
    import subprocess
    import sys

    from utils.core.config import ROOT

    res = subprocess.run([sys.executable, "07_evaluate.py", "--set", f"outputs_dir={out}", "--run_id", "t", *args,
                          "--checkpoint", "base,base"], cwd=ROOT, capture_output=True, text=True)
    assert res.returncode == 2 and "expected distinct comma-separated names" in res.stderr

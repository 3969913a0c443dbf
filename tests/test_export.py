"""Export: a trained adapter folded into the base is a plain Hugging Face model that transformers
and vLLM load without peft, and that vLLM serves token for token as it serves the adapter itself
(a LoRARequest); bad checkpoints get one clear line."""
import json
import subprocess
import sys

import torch
from transformers import AutoTokenizer

from helpers import greedy_episodes, peft_logprobs, arith_rows
from utils.core.config import ROOT
from utils.core.hashing import path_sha256
from utils.core.schema import EngineConfig


def _export(tmp_path, *args):
    return subprocess.run([sys.executable, "-m", "utils.deploy.export", "--set", f"outputs_dir={tmp_path / 'out'}",
                           *args], cwd=ROOT, capture_output=True, text=True, timeout=300)


def test_exported_model_loads_without_peft_and_serves_identically(protocol_adapter, vllm_engine, base_dir, tmp_path):
    from transformers import AutoModelForCausalLM

    from utils.agent.engines import VLLMEngine

    out = tmp_path / "merged"
    done = _export(tmp_path, "--checkpoint", str(protocol_adapter), "--out", str(out))
    assert done.returncode == 0, done.stderr
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["status"] == "completed" and manifest["stage"] == "export/adapter"
    assert manifest["metrics"]["adapter_sha256"] == path_sha256(protocol_adapter)
    assert manifest["metrics"]["base_sha256"] == path_sha256(base_dir)
    assert {"config.json", "tokenizer.json", "model.safetensors"} <= {p.name for p in out.iterdir()}

    tok = AutoTokenizer.from_pretrained(out)
    ids = tok.encode("plan: 12+30-7\n<think>12+30-7</think><task>12+30</task>")
    model = AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32).eval()
    with torch.no_grad():
        logp = torch.log_softmax(model(input_ids=torch.tensor([ids])).logits[0], -1)
    merged = [logp[k - 1, ids[k]].item() for k in range(8, len(ids))]
    unmerged = peft_logprobs(base_dir, protocol_adapter, ids, 8)
    assert max(abs(a - b) for a, b in zip(merged, unmerged)) < 1e-4
    assert max(abs(a - b) for a, b in zip(merged, peft_logprobs(base_dir, None, ids, 8))) > 1e-2  # really merged

    rows = arith_rows(24)
    vllm_engine.set_adapter(protocol_adapter)
    served = greedy_episodes(vllm_engine, tok, rows)
    plain = VLLMEngine(out, EngineConfig(memory_share=0.1), enable_lora=False)
    try:
        exported = greedy_episodes(plain, tok, rows)
    finally:
        plain.close()
    assert sum(e.status == "answered" for e in served) >= len(rows) // 2 and max(e.n_turns for e in served) >= 2
    for a, b in zip(served, exported):
        assert (a.status, a.final_answer) == (b.status, b.final_answer)
        assert [(s.role, s.gen_ids) for s in a.segments] == [(s.role, s.gen_ids) for s in b.segments]


def test_bad_checkpoints_fail_with_one_line(tmp_path):
    base = _export(tmp_path, "--checkpoint", "base")
    assert base.returncode == 2 and "the base model has nothing to merge" in base.stderr
    missing = _export(tmp_path, "--checkpoint", "red", "--run_id", "nothing_here")
    assert missing.returncode == 1
    assert ("05_train_red_grpo/red/manifest.json not found: run 05_train_red_grpo.py --algorithm red (or "
            "09_driver.py) for run 'nothing_here' first") in missing.stderr
    notes = tmp_path / "notes"
    notes.mkdir()
    stray = _export(tmp_path, "--checkpoint", str(notes))
    assert stray.returncode == 1 and f"--checkpoint {notes}: not one of" in stray.stderr
    assert not (tmp_path / "out" / "nothing_here" / "export" / "red" / "model.safetensors").exists()

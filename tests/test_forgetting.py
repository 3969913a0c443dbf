"""utils/eval/forgetting.py, the study's measure of what each arm kept of the warmup's demonstrations:
the NLL of held-out gold demonstrations under each checkpoint of a run, per role, from the config 04
recorded."""
import json
import shutil
import subprocess
import sys

import pytest
import torch

from helpers import run_stage
from utils.core.config import ROOT
from utils.core.loader import load_run_config
from utils.core.stages import stage_config
from utils.eval import forgetting as fg
from utils.tinyarith.quick import short_chain_rows


def _run(tmp_path, warmup, trained: dict):
    """A run folder as the analysis reads it: 04's manifest (the config it recorded) and adapters."""
    cfg = load_run_config()
    best = tmp_path / "04_sft_warmup" / "ckpt_sft" / "best"
    shutil.copytree(warmup, best)
    (tmp_path / "04_sft_warmup" / "manifest.json").write_text(json.dumps({"config": stage_config(cfg, "04_sft_warmup")}))
    for method, adapter in trained.items():
        shutil.copytree(adapter, tmp_path / "05_train_red_grpo" / method / "final_adapter")
    (tmp_path / "06_ablate_grpo_only" / "grpo").mkdir(parents=True)  # no final adapter (still running): left out
    return tmp_path


def test_checkpoints_are_base_the_warmup_and_every_finished_method(tmp_path):
    for folder in ("04_sft_warmup/ckpt_sft/best", "05_train_red_grpo/red/final_adapter",
                   "05_train_red_grpo/chord_mu/final_adapter", "06_ablate_grpo_only/grpo"):
        (tmp_path / folder).mkdir(parents=True)
    found = fg.checkpoints(tmp_path)
    assert list(found) == ["base", "sft_warmup", "chord_mu", "red"] and found["base"] is None


def test_the_warmup_reads_its_demonstrations_far_better_than_the_base_and_an_identical_arm_forgets_nothing(
        tmp_path, protocol_adapter):
    run = _run(tmp_path, protocol_adapter, {"red": protocol_adapter})
    rows = short_chain_rows(8)
    tables = fg.forgetting(rows, run, batch=3)  # several batches: the shares must add up to one mean
    assert list(tables) == ["gold"]  # no 03 traces in this run folder: no "own" set
    table = tables["gold"]
    assert list(table) == ["base", "sft_warmup", "red"]
    assert table["red"] == table["sft_warmup"]  # the same adapter: exactly the same NLL
    for role in ("planner", "executor", "all"):
        assert table["base"][role] > 2 * table["sft_warmup"][role] > 0  # the base never saw the protocol
    whole = fg.forgetting(rows, run, batch=64)["gold"]["sft_warmup"]
    assert whole == pytest.approx(table["sft_warmup"], rel=1e-5)


def test_each_roles_nll_and_all_equal_one_pass_over_their_examples(protocol_adapter, base_dir):
    """Batched by role (4 an example batch), the NLLs equal one whole-set pass of sft_terms: per role,
    and "all" over both roles' examples at once."""
    from transformers import AutoTokenizer

    from utils.agent.rollout import Codec
    from utils.agent.traces import gold_examples
    from utils.train.policy import load_policy, sft_batch, sft_terms

    cfg = load_run_config()
    tok = AutoTokenizer.from_pretrained(base_dir)
    examples = gold_examples(short_chain_rows(5), Codec(tok, cfg.model.templates))
    assert {e.role for e in examples} == {"planner", "executor"}
    model = load_policy(base_dir, cfg.model.lora, adapter=protocol_adapter, trainable=False)
    nll = fg.nll_by_role(model, examples, tok.pad_token_id, batch=4)
    with torch.no_grad():
        for role in ("planner", "executor"):
            whole = sft_terms(model, sft_batch([e for e in examples if e.role == role], tok.pad_token_id))[0].item()
            assert nll[role] == pytest.approx(whole, rel=1e-5)
        assert nll["all"] == pytest.approx(sft_terms(model, sft_batch(examples, tok.pad_token_id))[0].item(), rel=1e-5)


def test_the_command_reads_the_runs_own_demonstrations_and_held_out_gold_ones(prepared, protocol_adapter):
    """On a real run's 01-03 outputs: `own` is 03's sft_traces.jsonl, `gold` the val split's; the last
    line gives each method's NLL minus the warmup's, per set."""
    out, args = prepared
    assert run_stage("03_generate_sft_traces", out, *args) == 0
    run = out / "t"
    _run(run, protocol_adapter, {"red": protocol_adapter})
    done = subprocess.run([sys.executable, "-m", "utils.eval.forgetting", "--run", str(run), "--batch", "16"],
                          cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    lines = done.stdout.strip().splitlines()
    assert [line.split(":")[0] for line in lines[:-1]] == ["own/base", "own/sft_warmup", "own/red",
                                                          "gold/base", "gold/sft_warmup", "gold/red"]
    assert lines[-1] == "forgetting own/red=+0.0000 gold/red=+0.0000"
    own_base = float(lines[0].split("nll_all ")[1])
    own_warm = float(lines[1].split("nll_all ")[1])
    assert own_base > 2 * own_warm  # the adapter was trained on gold traces of the same kind

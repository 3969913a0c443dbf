"""utils/eval/headroom.py (the study's headroom probe) samples a run's adapters with the run's own
rollout settings: its model, templates, engine, turn limit and token budgets come from the warmup's
manifest (utils/core/stages.py `recorded_config`, which every benchmark of a run reads), not from
flags that must be passed by hand (a probe at another budget measures another policy)."""
import json

from utils.agent.rollout import RolloutSpec
from utils.core.loader import load_run_config
from utils.core.stages import recorded_config, stage_config
from utils.eval import headroom


def test_the_probe_reads_the_runs_rollout_settings_from_its_warmup_manifest(tmp_path):
    cfg = load_run_config(overrides=["agent.max_turns=6", "agent.max_new_tokens_planner=40",
                                     "agent.max_new_tokens_executor=20", "model.engine.max_lora_rank=8"])
    (tmp_path / "04_sft_warmup").mkdir()
    (tmp_path / "04_sft_warmup" / "manifest.json").write_text(json.dumps({"config": stage_config(cfg, "04_sft_warmup")}))
    got = recorded_config(tmp_path / "04_sft_warmup")
    assert RolloutSpec.from_config(got, 0.7) == RolloutSpec.from_config(cfg, 0.7)
    assert (got.model.path, got.model.engine, got.model.templates) == (cfg.model.path, cfg.model.engine, cfg.model.templates)
    assert RolloutSpec.from_config(got, 0.7).max_new_tokens_planner == 40
    assert recorded_config(tmp_path / "04_sft_warmup", ["agent.max_turns=3"]).agent.max_turns == 3


def test_the_probe_reports_the_protocols_health_beside_mean_and_pass_at_n():
    def episode(qid, answer, fmt, status, turns):
        return {"qid": qid, "answer": answer, "format": fmt, "reward": answer, "status": status, "turns": turns,
                "subtasks": turns - 1, "independence": 1.0, "tokens_planner": 10, "tokens_executor": 5}

    scored = [episode("a", 1.0, 1.0, "answered", 4), episode("a", 0.0, 1.0, "answered", 4),  # a: one right of two
              episode("b", 0.0, 0.0, "malformed", 1), episode("b", 0.0, 0.5, "hit_max_turns", 8)]  # b: none
    assert headroom.overall(scored, 2) == \
        "all: mean@2 0.2500  pass@2 0.5000  format 0.625  answered 0.500  turns 4.25"
    scored[1]["prediction"] = "12"  # a's wrong sample answered the next-to-last result: 1 of 4 stopped early
    steps = {"a": [{"result": 7}, {"result": 12}, {"result": 10}]}
    assert headroom.overall(scored, 2, steps).endswith("turns 4.25  stopped early 0.250")

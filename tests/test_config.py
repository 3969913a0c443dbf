"""Config loading: the shipped tiers, strict keys with the nearest valid one, types, overrides."""
import dataclasses
import functools
import re
import subprocess
import sys

import pytest

from utils.core.config import CONFIG_DIR, ROOT, ConfigError, describe, read_yaml
from utils.core.schema import RunConfig
from utils.core.loader import load_run_config


def test_default_tiers_resolve_to_the_embedded_default():
    cfg = load_run_config()
    assert cfg.model.name == "tiny-arith"
    assert cfg.algorithm.method == "red"
    assert cfg.data.name == "synthetic_arith"
    assert cfg.model.engine.memory_share == 0.3


@pytest.mark.parametrize("tier,field_name", [("models", "model"), ("algorithms", "algorithm"), ("data", "data")])
def test_every_shipped_yaml_loads(tier, field_name):
    files = sorted((CONFIG_DIR / tier).glob("*.yaml"))
    assert files, f"no configs in {tier}"
    for path in files:
        kwargs = {{"models": "model", "algorithms": "algorithm", "data": "data"}[tier]: str(path)}
        cfg = load_run_config(**kwargs)
        assert getattr(cfg, field_name) is not None


def test_algorithm_tiers_encode_the_ablations():
    red, fixed, grpo, sft = (load_run_config(algorithm=a).algorithm for a in ("red", "fixed_sft", "grpo", "sft"))
    assert red.red.G == 5.0 and red.sft.enabled and red.rl.enabled
    assert fixed.red.G == 1.0 and fixed.sft.enabled and fixed.rl.enabled
    assert not grpo.sft.enabled and grpo.rl.enabled
    assert sft.sft.enabled and not sft.rl.enabled


def test_unknown_key_in_yaml_names_file_key_and_nearest(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: x\nlora:\n  rnak: 4\n")
    with pytest.raises(ConfigError) as err:
        load_run_config(model=str(bad))
    msg = str(err.value)
    assert str(bad) in msg and "'rnak'" in msg and "did you mean 'rank'" in msg


def test_unknown_override_names_the_nearest_key():
    with pytest.raises(ConfigError, match=r"unknown key 'GG' under algorithm.red; did you mean 'G'"):
        load_run_config(overrides=["algorithm.red.GG=3"])
    with pytest.raises(ConfigError, match=r"did you mean 'seed'"):
        load_run_config(overrides=["sede=3"])


def test_overrides_are_typed_and_applied_last():
    cfg = load_run_config(overrides=["algorithm.red.G=3", "model.lora.target_modules=[q_proj]", "seed=7"])
    assert cfg.algorithm.red.G == 3.0 and isinstance(cfg.algorithm.red.G, float)
    assert cfg.model.lora.target_modules == ["q_proj"]
    assert cfg.seed == 7


def test_exponent_floats_without_a_dot_are_floats(tmp_path):
    """PyYAML (YAML 1.1) reads `5e-4` as a string; a learning rate typed that way must still work."""
    cfg = load_run_config(overrides=["algorithm.rl.lr=5e-4", "warmup.lr=1E-3", "reward.numeric_rel_tol=-2e+1"])
    assert (cfg.algorithm.rl.lr, cfg.warmup.lr, cfg.reward.numeric_rel_tol) == (5e-4, 1e-3, -20.0)
    run = tmp_path / "run.yaml"
    run.write_text("algorithm:\n  rl:\n    lr: 2e-3\n")
    assert load_run_config(run=str(run)).algorithm.rl.lr == 2e-3
    with pytest.raises(ConfigError, match=r"expected float, got str '5e'"):
        load_run_config(overrides=["algorithm.rl.lr=5e"])
    with pytest.raises(ConfigError, match=r"expected int, got str '1e3'"):
        load_run_config(overrides=["model.lora.rank=1e3"])  # only floats are read this way


def test_wrong_type_names_expected_and_got():
    with pytest.raises(ConfigError, match=r"config.model.lora.rank: expected int, got str 'eight'"):
        load_run_config(overrides=["model.lora.rank=eight"])
    with pytest.raises(ConfigError, match=r"expected float, got bool"):
        load_run_config(overrides=["algorithm.red.G=true"])


def test_unknown_tier_name_lists_valid_ones():
    with pytest.raises(ConfigError, match=r"no models config named 'tiny-arth'; did you mean 'tiny-arith'"):
        load_run_config(model="tiny-arth")


def test_run_level_yaml_merges_deeply(tmp_path):
    run = tmp_path / "run.yaml"
    run.write_text("run_id: run_042\nmodel:\n  lora:\n    rank: 4\n")
    cfg = load_run_config(run=str(run))
    assert cfg.run_id == "run_042"
    assert cfg.model.lora.rank == 4
    assert cfg.model.lora.alpha == 16  # untouched sibling survives the merge


def test_describe_lists_every_leaf_with_help():
    lines = describe(RunConfig)
    assert any(line.strip().startswith("algorithm.red.G = 5.0 [>= 1.0]:") for line in lines)
    n_leaves = sum(1 for line in lines if "=" in line)
    assert n_leaves >= 60
    for f in dataclasses.fields(RunConfig):
        assert f.metadata.get("help"), f"{f.name} has no help"


@pytest.mark.parametrize("override,valid", [
    ("algorithm.rl.loss_agg=token_mean", "token-mean, token-sum-norm, seq-mean-token-mean, seq-mean-token-sum-norm"),
    ("algorithm.rl.adv_scaling=std", "group, batch, none, rloo"),
    ("algorithm.rl.policy_loss=ppo", "ppo_clip, gspo"),
    ("model.engine.name=sglang", "vllm, hf"),
    ("data.scorer=bleu", "em, f1, cem, numeric"),
    ("traces.source=silver", "gold, solution, teacher"),
    ("wandb_mode=cloud", "auto, online, offline, disabled"),
])
def test_choice_fields_fail_at_parse_time_listing_the_valid_values(override, valid):
    with pytest.raises(ConfigError) as err:
        load_run_config(overrides=[override])
    assert f"valid: {valid}" in str(err.value) and override.split("=")[0] in str(err.value)


@pytest.mark.parametrize("key, below, minimum", [
    # kv_cache_gb feeds the offline engine and utils/deploy/serve.py alike: the schema refuses it for both
    ("model.engine.kv_cache_gb", "-1.0", "0.0"),
    ("algorithm.rl.n_samples", "1", "2"),  # a group of one has no advantage
    ("algorithm.red.G", "0.5", "1.0"),
    ("warmup.batch_size", "0", "1"),
])
def test_a_field_below_its_minimum_fails_at_parse_time(key, below, minimum):
    with pytest.raises(ConfigError, match=re.escape(f"{key}: {below} is below its minimum {minimum}")):
        load_run_config(overrides=[f"{key}={below}"])
    algorithm = "fixed_sft" if key == "algorithm.red.G" else "red"  # G = 1 is the method fixed_sft
    cfg = load_run_config(algorithm=algorithm, overrides=[f"{key}={minimum}"])  # the minimum itself passes
    assert float(functools.reduce(getattr, key.split("."), cfg)) == float(minimum)


def test_a_field_above_its_maximum_fails_at_parse_time():
    key = "algorithm.srft.negative_coef"  # a wrong rollout's advantage: rewarding it would be no method
    with pytest.raises(ConfigError, match=re.escape(f"{key}: 0.5 is above its maximum 0.0")):
        load_run_config(algorithm="srft", overrides=[f"{key}=0.5"])
    assert load_run_config(algorithm="srft_clamped").algorithm.srft.negative_coef == 0.0  # the maximum passes
    assert any("negative_coef = -1.0 [<= 0.0]" in line for line in describe(RunConfig))


def test_help_config_shows_each_minimum():
    lines = describe(RunConfig)
    assert any("kv_cache_gb = 0.0 [>= 0.0]" in line for line in lines)
    assert any("n_samples = 4 [>= 2]" in line for line in lines)


@pytest.mark.parametrize("algorithm,override,implied", [
    ("red", "algorithm.sft.enabled=false", "grpo"),
    ("red", "algorithm.red.G=1", "fixed_sft"),
    ("fixed_sft", "algorithm.red.G=5", "red"),
    ("fixed_sft", "algorithm.sft.match_red=true", "matched_sft"),
    ("matched_sft", "algorithm.sft.match_red=false", "fixed_sft"),
    ("matched_sft", "algorithm.red.G=5", None),
    ("grpo", "algorithm.sft.enabled=true", None),
    ("sft", "algorithm.rl.enabled=true", None),
    ("grpo", "algorithm.rl.adv_scaling=rloo", "rloo"),
    ("rloo", "algorithm.rl.adv_scaling=none", "grpo"),
    ("red", "algorithm.rl.adv_scaling=rloo", None),
    ("grpo", "algorithm.rl.policy_loss=gspo", "gspo"),
    ("gspo", "algorithm.rl.policy_loss=ppo_clip", "grpo"),
    ("srft", "algorithm.srft.negative_coef=0", "srft_clamped"),
    ("srft_clamped", "algorithm.srft.negative_coef=-1", "srft"),
])
def test_a_method_label_that_contradicts_its_flags_is_refused(algorithm, override, implied):
    with pytest.raises(ConfigError) as err:
        load_run_config(algorithm=algorithm, overrides=[override])
    msg = str(err.value)
    assert f"algorithm.method '{algorithm}' contradicts" in msg and override.split("=")[0] in msg
    if implied:
        assert f"use --algorithm {implied}" in msg


def test_every_method_config_is_consistent_and_implies_itself():
    from utils.core.methods import METHODS, contradictions, implied_method

    for name in METHODS:
        alg = load_run_config(algorithm=name).algorithm
        assert alg.method == name and contradictions(alg) == [] and implied_method(alg) == name


def test_a_methods_flags_and_trainer_come_from_its_config_file(tmp_path, monkeypatch):
    """The registry restates no flag: it reads configs/algorithms/<name>.yaml, and the trainer
    follows from whether the method has an SFT term."""
    from utils.core import config, methods

    for m in methods.METHODS.values():
        alg = load_run_config(algorithm=m.name).algorithm
        assert m.trainer == (methods.SFT_TRAINER if alg.sft.enabled else methods.RL_TRAINER)
    fixed = load_run_config(algorithm="fixed_sft").algorithm
    algorithms = tmp_path / "algorithms"
    algorithms.mkdir()
    (algorithms / "grpo.yaml").write_text("method: grpo\nrl: {enabled: true}\nsft: {enabled: true}\nred: {G: 1.0}\n")
    monkeypatch.setattr(config, "CONFIG_DIR", tmp_path)
    methods.method_flags.cache_clear()
    try:
        assert methods.METHODS["grpo"].trainer == methods.SFT_TRAINER  # an SFT term: 05 trains it
        assert methods.contradictions_with(fixed, methods.METHODS["grpo"]) == []  # fixed_sft's flags, now grpo's
    finally:
        methods.method_flags.cache_clear()


def test_a_tier_run_section_sets_run_level_defaults_below_the_run_yaml_and_overrides(tmp_path):
    data = tmp_path / "d.yaml"
    data.write_text("name: synthetic_arith\nrun:\n  traces:\n    max_subtasks: 2\n    long_traces: 7\n"
                    "  warmup:\n    steps: 11\n")
    cfg = load_run_config(data=str(data))
    assert (cfg.traces.max_subtasks, cfg.traces.long_traces, cfg.warmup.steps) == (2, 7, 11)
    assert cfg.warmup.lr == RunConfig().warmup.lr  # siblings keep their defaults
    run = tmp_path / "run.yaml"
    run.write_text("traces:\n  long_traces: 3\n")
    cfg = load_run_config(data=str(data), run=str(run), overrides=["warmup.steps=5"])
    assert (cfg.traces.max_subtasks, cfg.traces.long_traces, cfg.warmup.steps) == (2, 3, 5)


@pytest.mark.parametrize("section,message", [("  trace:\n    max_subtasks: 2\n", r"d.yaml \(run\).*did you mean 'traces'"),
                                             ("  data:\n    n_val: 3\n", r"d.yaml: 'run' must be a mapping"),
                                             ("  - 3\n", r"d.yaml: 'run' must be a mapping")])
def test_a_bad_tier_run_section_names_the_file(tmp_path, section, message):
    data = tmp_path / "d.yaml"
    data.write_text("name: synthetic_arith\nrun:\n" + section)
    with pytest.raises(ConfigError, match=message):
        load_run_config(data=str(data))


@pytest.mark.parametrize("run_id", ["../elsewhere", "/tmp/x", "a/../../b", "a//b", ".hidden", "a b"])
def test_a_run_id_cannot_leave_the_outputs_folder(run_id):
    with pytest.raises(ConfigError, match="must name a folder inside outputs_dir"):
        load_run_config(overrides=[f"run_id={run_id}"])
    assert load_run_config(overrides=["run_id=study/seed_2"]).run_id == "study/seed_2"


def test_the_embedded_default_runs_in_its_data_tiers_regime():
    cfg = load_run_config()
    assert cfg.regime == "imperfect_teacher"
    regime = read_yaml(CONFIG_DIR / "regimes" / "imperfect_teacher.yaml")
    assert cfg.traces.flaw_rate == regime["traces"]["flaw_rate"] > 0
    assert cfg.traces.flaw_draw == regime["traces"]["flaw_draw"] == "length" != RunConfig().traces.flaw_draw
    assert (cfg.eval.primary, cfg.eval.samples) == ("mean_at_k", 4)
    assert cfg.algorithm.rl.dynamic_sampling == 2
    assert cfg.warmup.steps == 800 and cfg.traces.max_traces == 96  # the tier's run: section still applies
    d = load_run_config(overrides=["regime=regime_d"])
    assert (d.regime, d.traces.flaw_rate, d.eval.primary, d.eval.samples, d.algorithm.rl.dynamic_sampling) == \
        ("regime_d", 0.0, "greedy", 0, 0)
    assert d.warmup.steps == 800 and d.traces.max_traces == 96
    bare = load_run_config(overrides=["regime="])
    assert bare.regime == "" and bare.traces.flaw_rate == RunConfig().traces.flaw_rate
    assert load_run_config(data="gsm8k").regime == ""  # a tier that names none runs in none


def test_the_regime_sits_between_the_tiers_run_section_and_the_run_yaml(tmp_path):
    regime = tmp_path / "r.yaml"
    regime.write_text("traces:\n  flaw_rate: 0.25\nwarmup:\n  steps: 7\nalgorithm:\n  rl:\n    steps: 9\n")
    cfg = load_run_config(overrides=[f"regime={regime}"])
    assert (cfg.traces.flaw_rate, cfg.warmup.steps, cfg.algorithm.rl.steps) == (0.25, 7, 9)
    assert cfg.traces.max_traces == 96  # the data tier's run: section, not set by the regime
    run = tmp_path / "run.yaml"
    run.write_text(f"regime: {regime}\nwarmup:\n  steps: 5\n")
    cfg = load_run_config(run=str(run))  # a run YAML may name the regime, and wins over it
    assert (cfg.regime, cfg.traces.flaw_rate, cfg.warmup.steps) == (str(regime), 0.25, 5)
    cfg = load_run_config(run=str(run), overrides=["regime=regime_d", "warmup.steps=3"])
    assert (cfg.regime, cfg.traces.flaw_rate, cfg.warmup.steps) == ("regime_d", 0.0, 3)


@pytest.mark.parametrize("body,message", [
    ("model:\n  name: x\n", "a regime sets run-level sections and algorithm.rl only"),
    ("regime: regime_d\n", "a regime sets run-level sections and algorithm.rl only"),
    ("algorithm:\n  sft:\n    loss_coef: 1.0\n", "a regime sets run-level sections and algorithm.rl only"),
    ("traces:\n  flaw_rat: 0.3\n", r"r.yaml.*did you mean 'flaw_rate'"),
])
def test_a_bad_regime_is_refused_naming_its_file(tmp_path, body, message):
    regime = tmp_path / "r.yaml"
    regime.write_text(body)
    with pytest.raises(ConfigError, match=message):
        load_run_config(overrides=[f"regime={regime}"])
    with pytest.raises(ConfigError, match=r"no regimes config named 'regime_e'; did you mean 'regime_d'"):
        load_run_config(overrides=["regime=regime_e"])


def test_every_shipped_regime_loads_under_every_method():
    names = sorted(p.stem for p in (CONFIG_DIR / "regimes").glob("*.yaml"))
    assert names == ["imperfect_teacher", "real_cpu", "regime_d"]
    for name in names:
        for path in sorted((CONFIG_DIR / "algorithms").glob("*.yaml")):
            assert load_run_config(algorithm=path.stem, overrides=[f"regime={name}"]).regime == name


def test_help_config_names_the_layer_that_set_each_value(capsys):
    from utils.core.cli import parse_stage_args

    with pytest.raises(SystemExit) as exc:
        parse_stage_args("t", ["--help-config", "--set", "algorithm.rl.lr=0.001"])
    assert exc.value.code == 0
    lines = {line.split(" = ")[0].strip(): line for line in capsys.readouterr().out.splitlines()}
    assert "= 0.5 (from configs/regimes/imperfect_teacher.yaml; default 0.0)" in lines["traces.flaw_rate"]
    assert "= 'imperfect_teacher' (from configs/data/synthetic_arith.yaml (run:); default '')" in lines["regime"]
    assert "= 800 (from configs/data/synthetic_arith.yaml (run:); default 300)" in lines["warmup.steps"]
    assert "= 0.001 (from --set; default 0.0001)" in lines["algorithm.rl.lr"]
    assert "= 5.0 (from configs/algorithms/red.yaml; default" in lines["algorithm.red.G"]
    assert lines["warmup.lr"].startswith("  warmup.lr = 0.005 [>= 0.0]:")  # set by no layer: the default alone
    with pytest.raises(SystemExit):
        parse_stage_args("t", ["--help-config", "--set", "regime=regime_d"])
    out = capsys.readouterr().out
    assert "traces.flaw_rate = 0.0 (from configs/regimes/regime_d.yaml; default 0.0)" in out
    assert "algorithm.rl.lr = 0.0001 [>= 0.0]:" in out  # regime D keeps the schema's lr
    with pytest.raises(SystemExit):
        parse_stage_args("t", ["--help-config"])
    assert "algorithm.rl.lr = 0.0004 (from configs/regimes/imperfect_teacher.yaml; default 0.0001)" in capsys.readouterr().out


def test_the_agent_section_holds_the_episode_settings_and_names_where_old_keys_went(tmp_path):
    from utils.core.stages import CONFIG_KEYS, stage_config

    cfg = load_run_config(overrides=["agent.max_turns=6"])
    assert (cfg.agent.max_turns, cfg.agent.max_new_tokens_planner, cfg.agent.max_new_tokens_executor) == (6, 64, 48)
    assert load_run_config(data="synthetic_lookup").agent.tool.retriever == "bm25"  # a data tier's run: section
    for old, new in (("algorithm.rl.max_turns=3", "agent.max_turns"),
                     ("model.max_new_tokens_planner=9", "agent.max_new_tokens_planner"), ("tool.top_k=3", "agent.tool")):
        with pytest.raises(ConfigError, match=f"it moved to '{new}'"):
            load_run_config(overrides=[old])
    old_yaml = tmp_path / "old.yaml"
    old_yaml.write_text("algorithm:\n  rl:\n    max_turns: 5\n")
    with pytest.raises(ConfigError, match="old.yaml.*unknown key 'max_turns'; it moved to 'agent.max_turns'"):
        load_run_config(run=str(old_yaml))
    # each stage hashes what it reads: the loop where episodes run, the tool only where it is on
    plain, lookup = load_run_config(), load_run_config(data="synthetic_lookup")
    loop = {"max_turns": 8, "max_new_tokens_planner": 64, "max_new_tokens_executor": 48}
    for stage in ("03_generate_sft_traces", "04_sft_warmup", "05_train_red_grpo", "06_ablate_grpo_only", "07_evaluate"):
        assert stage_config(plain, stage)["agent"] == loop, stage
        assert stage_config(lookup, stage)["agent"]["tool"]["retriever"] == "bm25", stage
    assert stage_config(plain, "01_prepare_dataset")["agent"] == {"max_new_tokens_planner": 64}
    assert "agent" not in stage_config(plain, "00_check_data") and "agent" not in stage_config(plain, "02_build_rewards")
    assert stage_config(lookup, "00_check_data")["agent"]["tool"]["corpus"] == "corpus.jsonl"
    assert all("algorithm.rl.max_turns" not in keys and "tool" not in keys for keys in CONFIG_KEYS.values())


def test_a_vllm_max_lora_rank_below_the_lora_rank_is_refused_at_parse_time(tmp_path, capsys):
    """vLLM would refuse the adapter only at its first load, minutes into 05; the config is refused
    when it is parsed, naming both keys and the smallest rank vLLM serves that fits."""
    with pytest.raises(ConfigError, match=r"model.engine.max_lora_rank=8 is smaller than model.lora.rank=16: "
                                          r".*set model.engine.max_lora_rank=16"):
        load_run_config(overrides=["model.lora.rank=16"])
    with pytest.raises(ConfigError, match="max_lora_rank=12: vLLM serves only 1, 8, 16"):
        load_run_config(overrides=["model.engine.max_lora_rank=12"])
    with pytest.raises(ConfigError, match="no vLLM rank is that large"):
        load_run_config(overrides=["model.lora.rank=1024", "model.engine.max_lora_rank=512"])
    # where no engine is vLLM, or nothing is served as an adapter, the key is not read and not checked
    assert load_run_config(overrides=["model.lora.rank=16", "model.engine.name=hf"]).model.lora.rank == 16
    assert load_run_config(overrides=["model.lora.rank=16", "model.lora.full_finetune=true"]).model.lora.rank == 16
    assert load_run_config(overrides=["model.lora.rank=16", "model.engine.max_lora_rank=16"]).model.lora.rank == 16
    # a stage refuses it before it writes anything
    out = subprocess.run([sys.executable, "00_check_data.py", "--set", f"outputs_dir={tmp_path}", "--run_id", "t",
                          "--set", "model.lora.rank=16"], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert out.returncode == 2 and "config error: model.engine.max_lora_rank=8 is smaller" in out.stderr
    assert not any(tmp_path.iterdir())


def test_help_ends_with_what_the_main_command_trains_with_and_where_each_setting_comes_from(capsys):
    """A stage's and the driver's --help name the default run's settings beyond the schema's defaults,
    each with its file, so no one reads the schema's lr 1e-4 as what `09_driver.py --method red` uses."""
    import runpy

    from utils.core.cli import default_run_settings, parse_stage_args

    lines = {line.split(" = ")[0].strip(): line for line in default_run_settings()}
    assert lines["algorithm.rl.lr"].endswith("= 0.0004  (configs/regimes/imperfect_teacher.yaml)")
    assert lines["warmup.steps"].endswith("= 800  (configs/data/synthetic_arith.yaml (run:))")
    assert lines["algorithm.red.G"].endswith("(configs/algorithms/red.yaml)")
    assert not any(key.startswith(("model.", "data.")) for key in lines)
    real = {line.split(" = ")[0].strip() for line in default_run_settings("smollm2-135m-instruct", "grpo", "word_problems")}
    assert "algorithm.rl.temperature" in real and "algorithm.red.G" not in real  # another run, other files
    for run in (lambda: parse_stage_args("t", ["--help"]), lambda: runpy.run_path(str(ROOT / "09_driver.py"), run_name="__main__")):
        with pytest.raises(SystemExit):
            argv, sys.argv = sys.argv, ["09_driver.py", "--help"]
            try:
                run()
            finally:
                sys.argv = argv
        out = capsys.readouterr().out
        assert "algorithm.rl.lr = 0.0004  (configs/regimes/imperfect_teacher.yaml)" in out

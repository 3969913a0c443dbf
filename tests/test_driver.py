"""09_driver end to end with tiny settings: every numbered script in order, then skip-all on a second
run, a config change that re-runs exactly the stages downstream of it, and a driver killed mid-stage
that resumes where it stopped."""
import json
import os
import signal
import subprocess
import sys
import time

import pytest

from helpers import EVERY_QUESTION, TINY, set_args
from utils.core.config import ROOT
from utils.core.schema import DataConfig
from utils.data.synthetic import write_dataset



RUN = "red"  # a run id that is also a method and a checkpoint name: the driver must not confuse them


def _argv(out, data, method, extra, flags=()):
    sets = set_args(*TINY, f"outputs_dir={out}", f"data.path={data}", *extra)
    return [sys.executable, "09_driver.py", "--method", method, "--run_id", RUN, *sets, *flags]


SECRETS = {"OPENAI_API_KEY": "sk-planted-judge-key-5b1f", "WANDB_API_KEY": "planted-wandb-key-c07e"}


def _driver(out, data, *extra, method="red", env=None, flags=()):
    return subprocess.run(_argv(out, data, method, extra, flags), cwd=ROOT, capture_output=True, text=True, timeout=1200,
                          env={**os.environ, **(env or {})})


def _ran(stdout):
    return [line.split(": running")[0].split("] ")[1] for line in stdout.splitlines() if ": running" in line]


def _assert_no_secrets(out, proc):
    files = [p for p in out.rglob("*") if p.is_file()]
    assert len(files) > 50
    for p in files:  # no key reaches a manifest, a log, a metrics file or the report
        blob = p.read_bytes()
        assert not any(v.encode() in blob for v in SECRETS.values()), p
    assert not any(v in proc.stdout + proc.stderr for v in SECRETS.values())


def _tamper_then_rerun(out, data):
    """An output edited after the fact, and a manifest edited by hand: each stage re-runs with the
    reason printed and gives the same outputs, so nothing downstream re-runs."""
    traces = out / RUN / "03_generate_sft_traces" / "sft_traces.jsonl"
    traces.write_text(traces.read_text() + "\n")
    m02 = out / RUN / "02_build_rewards" / "manifest.json"
    m02.write_text(json.dumps({**json.loads(m02.read_text()), "warnings": ["looks fine to me"]}))
    fourth = _driver(out, data, "algorithm.rl.lr=0.001")
    assert _ran(fourth.stdout) == ["02_build_rewards", "03_generate_sft_traces"], fourth.stdout
    assert "02_build_rewards: running (manifest edited by hand (its seal does not match))" in fourth.stdout
    assert f"03_generate_sft_traces: running (output changed: {traces.resolve().as_posix()})" in fourth.stdout


@pytest.mark.slow
def test_driver_runs_the_chain_then_skips_then_reruns_downstream(tmp_path):
    data = tmp_path / "synth"
    write_dataset(DataConfig(n_train=40, n_val=6, n_test=6), data)
    out = tmp_path / "outputs"
    first = _driver(out, data, env=SECRETS)  # keys in the environment, as on a user's box
    assert first.returncode == 0, first.stdout[-3000:] + first.stderr[-3000:]
    _assert_no_secrets(out, first)
    for stage in ("00_check_data", "01_prepare_dataset", "02_build_rewards", "03_generate_sft_traces",
                  "04_sft_warmup", "05_train_red_grpo/red", "07_evaluate/base", "07_evaluate/sft_warmup", "07_evaluate/red"):
        m = json.loads((out / RUN / stage / "manifest.json").read_text())
        assert m["status"] == "completed", stage
    metrics = json.loads((out / RUN / "07_evaluate" / "red" / "metrics.json").read_text())
    assert set(metrics) >= {"accuracy", "accuracy_ci95", "format", "turns", "failures"}
    report = out / RUN / "08_compare_runs" / "report.md"
    assert f"report: {report}" in first.stdout
    assert "red − sft_warmup" in report.read_text()  # the paired test against the SFT starting point
    assert sum(metrics["failures"].values()) == metrics["n"] and "### Greedy episodes by outcome" in report.read_text()
    run_manifest = json.loads((out / RUN / "run_manifest.json").read_text())
    assert run_manifest["status"] == "completed" and len(run_manifest["stages"]) == 10
    assert run_manifest["regime"] == "regime_d"  # the regime the config named, which no stage manifest records
    assert all(s["action"] == "ran" and s["status"] == "completed" for s in run_manifest["stages"])
    assert _ran(first.stdout)[-2:] == ["07_evaluate/base,sft_warmup,red", "08_compare_runs"]  # one 07 process

    second = _driver(out, data)
    assert second.returncode == 0
    assert second.stdout.count("skipped (up to date)") == 10 and "running" not in second.stdout
    assert [s["action"] for s in json.loads((out / RUN / "run_manifest.json").read_text())["stages"]] == ["skipped"] * 10
    before = {p: p.read_bytes() for p in out.rglob("manifest.json")}
    dry = _driver(out, data, "algorithm.rl.lr=0.001", flags=["--dry_run"])  # says what the next call does, does nothing
    assert dry.returncode == 0, dry.stdout[-3000:] + dry.stderr[-3000:]
    assert "05_train_red_grpo/red: would run (config changed: algorithm.rl.lr 0.0001 → 0.001)" in dry.stdout
    assert "07_evaluate/red: would run (after 05_train_red_grpo/red re-runs)" in dry.stdout
    assert dry.stdout.count("would run") == 3 and dry.stdout.count("would skip") == 7, dry.stdout
    assert {p: p.read_bytes() for p in out.rglob("manifest.json")} == before
    third = _driver(out, data, "algorithm.rl.lr=0.001")  # read only by 05: 05, its evaluation and 08 re-run
    assert _ran(third.stdout) == ["05_train_red_grpo/red", "07_evaluate/red", "08_compare_runs"], third.stdout
    assert "05_train_red_grpo/red: running (config changed: algorithm.rl.lr 0.0001 → 0.001)" in third.stdout

    _tamper_then_rerun(out, data)

    # an interrupted driver resumes: SIGKILL it once 06 has saved its first checkpoint, then re-run
    grpo = ["algorithm.rl.steps=4", "algorithm.rl.save_freq=1"]
    proc = subprocess.Popen(_argv(out, data, "grpo", grpo), cwd=ROOT, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, start_new_session=True)
    ckpt, deadline = out / RUN / "06_ablate_grpo_only" / "grpo" / "ckpt", time.time() + 600
    while not list(ckpt.glob("step_*/state.json")) and time.time() < deadline and proc.poll() is None:
        time.sleep(0.2)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    assert list(ckpt.glob("step_*")), "06 never checkpointed before the kill"
    assert json.loads((out / RUN / "run_manifest.json").read_text())["status"] == "running"
    resumed = _driver(out, data, *grpo, method="grpo")
    assert resumed.returncode == 0, resumed.stdout[-3000:] + resumed.stderr[-3000:]
    assert _ran(resumed.stdout) == ["06_ablate_grpo_only/grpo", "07_evaluate/grpo", "08_compare_runs"]
    assert "06_ablate_grpo_only: resuming grpo from step" in resumed.stdout
    trained = [json.loads(x)["step"] for x in (ckpt.parent / "metrics.jsonl").read_text().splitlines()]
    assert trained == [1, 2, 3, 4]  # no step lost or repeated across the kill
    assert "red − grpo" in (out / RUN / "08_compare_runs" / "report.md").read_text()
    assert json.loads((out / RUN / "run_manifest.json").read_text())["status"] == "completed"


def test_plan_runs_red_before_the_arm_that_matches_its_weight():
    from utils.run.driver import plan

    trainers = [s.dir_name for s in plan(["matched_sft"]) if s.algorithm]
    assert trainers == ["05_train_red_grpo/red", "05_train_red_grpo/matched_sft"]
    trainers = [s.dir_name for s in plan(["matched_sft", "grpo", "red"]) if s.algorithm]
    assert trainers == ["05_train_red_grpo/red", "05_train_red_grpo/matched_sft", "06_ablate_grpo_only/grpo"]


def test_plan_keeps_run_ids_that_are_method_or_checkpoint_names(tmp_path):
    from utils.core.methods import CHECKPOINTS, METHODS
    from utils.run.driver import REPORT, plan, stage_path

    for run_id in CHECKPOINTS:
        common = ["--run_id", run_id, "--set", f"outputs_dir={tmp_path}"]
        for step in plan(list(METHODS)) + [REPORT]:
            assert stage_path(common, step) == tmp_path / run_id / step.dir_name


def test_evaluations_come_last_and_share_one_batch():
    from utils.run.driver import batches, plan

    steps = plan(["grpo", "red"])
    assert [s.dir_name for s in steps][5:] == ["06_ablate_grpo_only/grpo", "05_train_red_grpo/red", "07_evaluate/base",
                                               "07_evaluate/sft_warmup", "07_evaluate/grpo", "07_evaluate/red"]
    grouped = [[s.dir_name for s in b] for b in batches(steps)]
    assert grouped[:7] == [[s.dir_name] for s in steps[:7]]  # every other stage runs alone
    assert grouped[7] == [s.dir_name for s in steps[7:]] and len(grouped) == 8


def test_method_lists_are_parsed_and_unknown_names_refused(tmp_path, capsys, monkeypatch):
    import importlib

    driver = importlib.import_module("09_driver")
    seen = {}
    monkeypatch.setattr(driver, "_run", lambda args, methods, *rest: seen.setdefault("methods", methods) and 0)
    common = ["--run_id", "lists", "--set", f"outputs_dir={tmp_path}"]
    assert driver.main(["--method", "red, red_paper,grpo,red", *common]) == 0
    assert seen["methods"] == ["red", "red_paper", "grpo"]  # spaces dropped, the repeat runs once
    for bad in ("red,bogus", ","):
        with pytest.raises(SystemExit) as exc:
            driver.main(["--method", bad, *common])
        assert exc.value.code == 2
    assert "unknown method 'bogus'; valid: red, grpo" in capsys.readouterr().err


def test_one_seed_is_refused_beside_a_multi_seed_runs_seed_folders(tmp_path, capsys, monkeypatch):
    """One seed writes into the run folder itself: beside seed_1/ and seed_2/ it would mix the layouts,
    so the driver refuses and names the way in (--run_id study/seed_3), which it then accepts."""
    import importlib

    driver = importlib.import_module("09_driver")
    monkeypatch.setattr(driver, "_run", lambda *args: 0)
    common = ["--method", "red", "--set", f"outputs_dir={tmp_path}"]
    assert driver.main([*common, "--seeds", "3", "--run_id", "study"]) == 0  # no seed folders yet: fine
    for s in (1, 2):
        (tmp_path / "study" / f"seed_{s}").mkdir(parents=True)
    for seeds in (["--seeds", "3"], []):
        with pytest.raises(SystemExit) as exc:
            driver.main([*common, *seeds, "--run_id", "study"])
        assert exc.value.code == 2
    err = capsys.readouterr().err
    assert "holds a multi-seed run (seed_1, seed_2)" in err and "--seeds 3 --run_id study/seed_3" in err
    assert "--seeds N --run_id study/seed_N" in err
    assert driver.main([*common, "--seeds", "3", "--run_id", "study/seed_3"]) == 0
    assert driver.main([*common, "--seeds", "3,4", "--run_id", "study"]) == 0  # several seeds go into seed folders


def test_a_config_change_is_named_key_by_key():
    from utils.run.freshness import config_changes

    recorded = {"algorithm": {"rl": {"lr": 1e-4, "steps": 30}, "name": "red"}, "seed": 1, "old": True}
    assert config_changes(recorded, recorded) == "the config hash differs"
    now = {"algorithm": {"rl": {"lr": 4e-4, "steps": 30, "stratify": False}, "name": "red"}, "seed": 1}
    assert config_changes(recorded, now) == "algorithm.rl.lr 0.0001 → 0.0004, algorithm.rl.stratify added (= False), old removed"
    assert config_changes(recorded, {**now, "seed": 2}, shown=2) == ("algorithm.rl.lr 0.0001 → 0.0004, "
                                                                   "algorithm.rl.stratify added (= False) and 2 more")
    assert config_changes({"ops": ("+", "-")}, {"ops": ["+", "-"]}) == "the config hash differs"  # as JSON records it


def _recorded_rl_stage(tmp_path, recorded: dict):
    """The manifest of a completed red stage that recorded the config slice `recorded`."""
    from utils.core.manifest import StageRun

    with StageRun("05_train_red_grpo/red", tmp_path / "run" / "05_train_red_grpo" / "red", recorded):
        pass
    return tmp_path / "run" / "05_train_red_grpo" / "red" / "manifest.json"


def test_a_setting_added_at_its_default_keeps_a_stage_up_to_date(tmp_path):
    from utils.core.loader import load_run_config
    from utils.core.stages import stage_config
    from utils.run.driver import _verdict
    from utils.run.freshness import without_new_defaults

    # the two settings at their schema defaults (the default regime sets both otherwise)
    cfg = load_run_config(overrides=[*EVERY_QUESTION, "algorithm.rl.lr_warmup_steps=0"])
    now = stage_config(cfg, "05_train_red_grpo")
    recorded = json.loads(json.dumps(now))  # a stage run by code without two of today's settings
    del recorded["algorithm"]["rl"]["stratify"], recorded["algorithm"]["rl"]["lr_warmup_steps"]
    path = _recorded_rl_stage(tmp_path, recorded)
    assert _verdict(path, now, cfg) == (True, "up to date; settings added since, at their defaults: "
                                              "algorithm.rl.lr_warmup_steps, algorithm.rl.stratify")
    on = json.loads(json.dumps(now))
    on["algorithm"]["rl"]["stratify"] = True  # added, but not at its default: the stage is stale
    assert _verdict(path, on, cfg) == (False, "config changed: algorithm.rl.stratify added (= True)")
    on["algorithm"]["rl"].update(stratify=False, lr=0.5)  # any other change still counts
    assert _verdict(path, on, cfg) == (False, "config changed: algorithm.rl.lr 0.0004 → 0.5")
    # a section that only holds new settings at their defaults goes whole; unknown keys never do
    assert without_new_defaults({"seed": 1}, {"seed": 1, "algorithm": {"rl": {"stratify": False}}}) == (
        {"seed": 1}, "algorithm.rl.stratify")
    assert without_new_defaults({"seed": 1}, {"seed": 1, "limit": 0}) == ({"seed": 1, "limit": 0}, "")


def test_a_setting_that_changes_only_what_a_step_logs_keeps_a_stage_up_to_date(tmp_path):
    """algorithm.rl.mismatch_every decides on which steps the sampler's log-probs are asked for and the
    mismatch logged, not what trains (tests/test_trainer.py): a stage recorded without it, or at
    another value, stays up to date and the reason says so; a change beside it still counts."""
    from utils.core.loader import load_run_config
    from utils.core.stages import stage_config
    from utils.run.driver import _verdict

    cfg = load_run_config()  # the default regime asks every 5th step
    now = stage_config(cfg, "05_train_red_grpo")
    assert now["algorithm"]["rl"]["mismatch_every"] == 5
    recorded = json.loads(json.dumps(now))
    del recorded["algorithm"]["rl"]["mismatch_every"]  # a stage run before the setting existed (every step)
    path = _recorded_rl_stage(tmp_path, recorded)
    assert _verdict(path, now, cfg) == (True, "up to date; differs only in what a step logs: "
                                              "algorithm.rl.mismatch_every added (= 5)")
    other = json.loads(json.dumps(now))
    other["algorithm"]["rl"]["lr"] = 0.5
    assert _verdict(path, other, cfg) == (False, "config changed: algorithm.rl.lr 0.0004 → 0.5, "
                                                 "algorithm.rl.mismatch_every added (= 5)")


def test_an_evaluation_with_a_curve_pass_is_kept_when_a_plain_one_is_asked_for(tmp_path):
    """07's curve pass (eval.curve_samples) samples after the greedy and mean@k passes, so a curve
    evaluation holds a plain one's figures: a driver run without the setting keeps it (it used to
    re-run 07 and drop the curve); asking for a curve the evaluation lacks, or for another n, or
    changing anything beside it, still re-runs it."""
    from utils.core.loader import load_run_config
    from utils.core.manifest import StageRun
    from utils.core.stages import evaluation_settings
    from utils.run.driver import _verdict

    plain = evaluation_settings(load_run_config(), "grpo")
    curve = evaluation_settings(load_run_config(overrides=["eval.curve_samples=64"]), "grpo")
    greedy_only = ["eval.samples=0", "eval.primary=greedy"]  # the curve then brings the temperature too
    bare = evaluation_settings(load_run_config(overrides=greedy_only), "grpo")
    bare_curve = evaluation_settings(load_run_config(overrides=[*greedy_only, "eval.curve_samples=8"]), "grpo")
    assert "temperature" in json.dumps(bare_curve) and "temperature" not in json.dumps(bare)

    def recorded(config, name):
        d = tmp_path / name / "07_evaluate" / "grpo"
        with StageRun("07_evaluate", d, config):
            pass
        return d / "manifest.json"

    cfg = load_run_config()
    kept = "holds a pass@k curve (eval.curve_samples = 64) beside the figures asked for; kept"
    assert _verdict(recorded(curve, "curve"), plain, cfg) == (True, f"up to date; {kept} (07 by hand replaces it)")
    assert _verdict(recorded(bare_curve, "bare"), bare, cfg)[0] is True
    assert _verdict(recorded(plain, "plain"), curve, cfg) == (False, "config changed: eval.curve_samples added (= 64)")
    other_n = evaluation_settings(load_run_config(overrides=["eval.curve_samples=32"]), "grpo")
    assert _verdict(tmp_path / "curve" / "07_evaluate" / "grpo" / "manifest.json", other_n, cfg) == (
        False, "config changed: eval.curve_samples 64 → 32")
    hotter = evaluation_settings(load_run_config(overrides=["algorithm.rl.temperature=1.0"]), "grpo")
    assert _verdict(tmp_path / "curve" / "07_evaluate" / "grpo" / "manifest.json", hotter, cfg)[0] is False
    assert _verdict(recorded(bare_curve, "bare2"), plain, cfg)[0] is False  # the plain run asks for mean@k too

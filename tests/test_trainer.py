"""The RED-GRPO trainer: on-policy sampling through vLLM, a stale-sampler negative control,
non-finite guards, the ablation configs, and the matched-SFT arm. A SIGKILLed RL run resuming to an
uninterrupted one's numbers is checked in tests/test_kill_anywhere.py (a kill mid-rollout and one
mid-checkpoint, after the step was logged) and, with two ranks, in tests/test_data_parallel.py."""
import json

import pytest
import torch
from transformers import AutoTokenizer

from helpers import REGIME_D, make_trainer, manifest, run_rl_stage, run_stage, set_args
from utils.agent.rollout import Codec
from utils.core.loader import load_run_config

MISMATCH_TOL = 1e-4  # fp32 CPU; see tests/test_engines.py for the engine agreement itself


def _cfg(*extra):
    return load_run_config(overrides=[REGIME_D, "algorithm.rl.steps=3", "algorithm.rl.questions_per_step=4",
                                      "algorithm.rl.n_samples=4", "algorithm.rl.lr=0.003", "algorithm.rl.save_freq=100",
                                      "algorithm.rl.dump_freq=0", *extra])


def test_vllm_sampler_stays_on_policy_across_updates(any_vllm, protocol_adapter, tmp_path, base_dir):
    trainer = make_trainer(_cfg(), any_vllm, protocol_adapter, tmp_path, base_dir)
    before = {n: p.detach().clone() for n, p in trainer.model.named_parameters() if p.requires_grad}
    history = trainer.train()
    assert len(history) == 3
    for m in history:
        assert m["rollout/logprob_mismatch"] < MISMATCH_TOL, m
        assert m["train/skipped_nonfinite"] == 0
    # the policy really moved (RL and SFT terms), so matching log-probs means the sampler followed it
    after = dict(trainer.model.named_parameters())
    assert any(not torch.equal(before[n], after[n]) for n in before)


def test_trainer_and_sampler_agree_at_the_sampling_temperature(vllm_engine, protocol_adapter, tmp_path, base_dir):
    """At T=0.7 vLLM reports the log-probs of the tempered distribution it sampled from, and the
    trainer recomputes them at the same T: fp32 noise. A trainer that ignored T would be far off."""
    import torch

    from utils.train.batch import build_rl_batch
    from utils.train.policy import forward_logprobs

    trainer = make_trainer(_cfg("algorithm.rl.temperature=0.7", "algorithm.rl.steps=2"), vllm_engine, protocol_adapter,
                       tmp_path, base_dir)
    history = trainer.train()
    assert all(m["rollout/logprob_mismatch"] < MISMATCH_TOL for m in history), history
    episodes = trainer.rollout.run(trainer.rows[:4], n=4, seed=3)  # the engine serves the trained policy
    batch = build_rl_batch(episodes, torch.zeros(len(episodes)), trainer.pad_id)

    def mismatch(temperature):
        with torch.no_grad():
            lp, _ = forward_logprobs(trainer.model, batch.ids, batch.attn, temperature=temperature)
        return float(((lp - batch.sampler_lp).abs() * batch.mask).sum() / batch.mask.sum())

    assert mismatch(0.7) < MISMATCH_TOL
    assert mismatch(1.0) > 100 * MISMATCH_TOL


def test_kl_reference_is_the_frozen_sft_start(hf_engine, protocol_adapter, tmp_path, base_dir):
    """The KL term compares with the adapter RL starts from: zero before the first update, positive
    after it, while the reference stays frozen and only the trained adapter is saved."""
    import torch

    from utils.train.policy import REFERENCE, add_reference

    trainer = make_trainer(_cfg("algorithm.rl.kl_coef=0.1", "algorithm.rl.steps=2", "algorithm.rl.lr=0.01"), hf_engine,
                       protocol_adapter, tmp_path, base_dir)
    add_reference(trainer.model, protocol_adapter)
    reference = {n: p.detach().clone() for n, p in trainer.model.named_parameters() if f".{REFERENCE}." in n}
    assert reference and not any(p.requires_grad for n, p in trainer.model.named_parameters() if n in reference)
    first, second = trainer.train()
    assert first["actor/kl"] == 0.0  # the policy is the reference at step 1
    assert second["actor/kl"] > 0.0
    after = dict(trainer.model.named_parameters())
    assert all(torch.equal(reference[n], after[n]) for n in reference)  # frozen
    assert all(p.requires_grad for n, p in after.items() if ".default." in n)  # still trained
    policy = next((tmp_path / "policy").iterdir())
    assert (policy / "adapter_model.safetensors").is_file() and not (policy / REFERENCE).exists()


def test_truncated_importance_weights_are_one_when_the_sampler_is_on_policy(vllm_engine, protocol_adapter, tmp_path,
                                                                         base_dir):
    """TIS on the real trainer and vLLM: in fp32 the sampler's probabilities are the trainer's, so
    every weight is 1 to within the mismatch tolerance and none is truncated."""
    trainer = make_trainer(_cfg("algorithm.rl.steps=2", "algorithm.rl.tis_cap=1.001", "algorithm.rl.mismatch_every=0",
                            "algorithm.rl.temperature=0.7"), vllm_engine, protocol_adapter, tmp_path, base_dir)
    for m in trainer.train():  # TIS asks the sampler on every step, whatever mismatch_every says
        assert abs(m["actor/tis_weight_mean"] - 1.0) < MISMATCH_TOL, m
        assert m["actor/tis_clip_frac"] == 0.0 and m["rollout/logprob_mismatch"] < MISMATCH_TOL


def test_the_mismatch_check_on_every_nth_step_trains_bit_for_bit_alike(vllm_engine, protocol_adapter, tmp_path,
                                                                        base_dir):
    """mismatch_every=2 asks the sampler for its log-probs on steps 1 and 3 only, and logs the mismatch
    there; every other metric and the trained adapter equal those of a run that asks on every step:
    which tokens vLLM samples does not depend on it, and the update never reads them without TIS."""
    def run(out, every):
        trainer = make_trainer(_cfg("algorithm.rl.temperature=0.7", f"algorithm.rl.mismatch_every={every}"),
                               vllm_engine, protocol_adapter, out, base_dir)
        history = trainer.train()
        return history, {n: p.detach().clone() for n, p in trainer.model.named_parameters() if p.requires_grad}

    always, always_params = run(tmp_path / "always", 1)
    sparse, sparse_params = run(tmp_path / "sparse", 2)
    assert ["rollout/logprob_mismatch" in m for m in sparse] == [True, False, True]
    assert all(m["rollout/logprob_mismatch"] < MISMATCH_TOL for m in always)
    trained = lambda m: {k: v for k, v in m.items() if not k.startswith("time/") and k != "rollout/logprob_mismatch"}  # noqa: E731
    assert [trained(m) for m in sparse] == [trained(m) for m in always]
    assert any(m["actor/grad_norm"] > 0 for m in always)  # the runs trained
    assert all(torch.equal(always_params[n], sparse_params[n]) for n in always_params)


def test_a_pipelined_refill_runs_on_the_real_engine(vllm_engine, protocol_adapter, tmp_path, base_dir):
    """refill=pipelined on real vLLM: dropped groups are replaced inside the running rollout (more
    than one sampling round, the refill's time inside the rollout's), the batch holds at most
    questions_per_step groups, and the policy trains. That it draws the same questions as rounds is
    checked on a rule engine (tests/test_dynamic_sampling.py): on vLLM the two need not sample the
    same tokens (utils/train/sampler.py)."""
    cfg = _cfg("algorithm.rl.temperature=0.7", "algorithm.rl.dynamic_sampling=2", "algorithm.rl.lr=0.0003",
               "algorithm.rl.steps=1", "algorithm.rl.questions_per_step=8", "algorithm.rl.refill=pipelined")
    trainer = make_trainer(cfg, vllm_engine, protocol_adapter, tmp_path, base_dir)
    before = {n: p.detach().clone() for n, p in trainer.model.named_parameters() if p.requires_grad}
    (m,) = trainer.train()
    rows, episodes = trainer.last_rollout.rows, trainer.last_rollout.episodes
    assert m["train/sampling_rounds"] > 1 and 0 < m["time/rollout_refill"] < m["time/rollout"], m
    assert len(rows) == m["train/kept_groups"] <= 8 and len(episodes) == 4 * len(rows)
    assert m["train/dropped_groups"] > 0 and len({r["id"] for r in rows}) == len(rows)
    assert any(not torch.equal(p, before[n]) for n, p in trainer.model.named_parameters() if p.requires_grad)


def test_a_stale_sampler_is_detected(vllm_engine, protocol_adapter, tmp_path, base_dir, monkeypatch):
    trainer = make_trainer(_cfg("algorithm.rl.lr=0.02", "algorithm.rl.tis_cap=1.001"), vllm_engine, protocol_adapter,
                       tmp_path, base_dir)
    vllm_engine.set_adapter(protocol_adapter)
    monkeypatch.setattr(vllm_engine, "set_adapter", lambda path: None)  # the bug: updates never reach vLLM
    history = trainer.train()
    assert history[0]["rollout/logprob_mismatch"] < MISMATCH_TOL  # step 1 samples the initial policy
    assert max(m["rollout/logprob_mismatch"] for m in history[1:]) > 10 * MISMATCH_TOL
    assert history[0]["actor/tis_clip_frac"] == 0.0  # and TIS sees the stale sampler: ratios far from 1
    assert max(m["actor/tis_clip_frac"] for m in history[1:]) > 0.0


def test_non_finite_loss_skips_the_step(hf_engine, protocol_adapter, tmp_path, base_dir, monkeypatch):
    import utils.train.grpo_trainer as gt

    trainer = make_trainer(_cfg("algorithm.rl.steps=1"), hf_engine, protocol_adapter, tmp_path, base_dir)
    before = {n: p.detach().clone() for n, p in trainer.model.named_parameters() if p.requires_grad}
    real = gt.red_grpo_loss

    def poisoned(*a, **k):
        terms = real(*a, **k)
        terms.loss = terms.loss * float("nan")
        return terms
    monkeypatch.setattr(gt, "red_grpo_loss", poisoned)
    (m,) = trainer.train()
    assert m["train/skipped_nonfinite"] == 1
    for n, p in trainer.model.named_parameters():
        if p.requires_grad:
            assert torch.equal(p, before[n]), n


def test_non_finite_gradient_or_reward_skips_and_k_in_a_row_stop(hf_engine, protocol_adapter, tmp_path, base_dir,
                                                                   monkeypatch):
    import utils.train.grpo_trainer as gt
    import utils.train.sampler as sampler
    from utils.core.stages import StageError

    trainer = make_trainer(_cfg("algorithm.rl.steps=5", "algorithm.rl.max_skips_in_a_row=3"), hf_engine, protocol_adapter,
                       tmp_path, base_dir)
    real_score, real_loss, step = sampler.score_episodes, gt.red_grpo_loss, {"n": 0}

    def scores(episodes, spec):  # step 2: one NaN reward
        step["n"] += 1
        out = real_score(episodes, spec)
        if step["n"] == 2:
            out[0] = {**out[0], "reward": float("nan")}
        return out

    def loss(*a, **k):  # steps 3 and 4: an inf gradient through a trained weight, the loss finite
        terms = real_loss(*a, **k)  # its micro-batches' backwards have run
        if step["n"] >= 3:
            w = next(p for p in trainer.model.parameters() if p.requires_grad)
            (w * float("inf")).sum().backward()
        return terms
    monkeypatch.setattr(sampler, "score_episodes", scores)  # the step's scoring is the sampler's
    monkeypatch.setattr(gt, "red_grpo_loss", loss)
    with pytest.raises(StageError, match=r"steps 2-4: 3 optimizer steps in a row skipped"):
        trainer.train()
    logged = [json.loads(x) for x in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [m["train/skipped_nonfinite"] for m in logged] == [0, 1, 1, 1]
    assert not trainer.checkpoints()  # save_freq 100: nothing written, and nothing non-finite ever is


@pytest.mark.parametrize("method,has_sft,has_rl", [("red", True, True), ("fixed_sft", True, True),
                                                   ("grpo", False, True), ("sft", True, False),
                                                   ("rloo", False, True), ("gspo", False, True),
                                                   ("chord_mu", True, True)])
def test_methods_are_configs_of_one_trainer(method, has_sft, has_rl, hf_engine, protocol_adapter, tmp_path, base_dir):
    cfg = load_run_config(algorithm=method, overrides=[REGIME_D, "algorithm.rl.steps=1", "algorithm.rl.questions_per_step=2",
                                                       "algorithm.rl.n_samples=2", "algorithm.rl.dump_freq=0"])
    (m,) = make_trainer(cfg, hf_engine, protocol_adapter, tmp_path, base_dir).train()
    assert ("actor/sft_loss" in m) == has_sft
    assert ("critic/rewards/mean" in m) == has_rl
    if method == "fixed_sft":
        assert (m["red/entropy_weight"], m["red/accuracy_factor"], m["red/final_weight"]) == (1.0, 1.0, 1.0)
    if method == "red":
        acc = m["red/batch_accuracy"]
        assert m["red/accuracy_factor"] == pytest.approx(5.0 ** (1 - 2 * acc))
    if method == "chord_mu":  # the first step's μ is the schedule's peak; RED's weights play no part
        assert m["chord/mu"] == pytest.approx(0.9) and "red/final_weight" not in m
    if method == "gspo":  # one pass per batch: every sequence ratio is exactly 1, nothing clipped
        assert (m["actor/ratio_mean"], m["actor/clip_frac"]) == (1.0, 0.0)
    for k in ("time/weight_sync", "time/update"):
        assert k in m


def test_two_passes_take_the_first_passs_log_probs_as_the_old_ones(hf_engine, protocol_adapter, tmp_path, base_dir,
                                                                    monkeypatch):
    """ppo_epochs=2 without dropout: the old log-probs are the first pass's own, detached, and the run is
    bit for bit the one that recomputes them in eval mode first (the path a model with dropout takes);
    the second pass's ratios move off 1, so it really compares against the sampling policy."""
    import utils.train.grpo_trainer as gt

    cfg = _cfg("algorithm.rl.steps=2", "algorithm.rl.ppo_epochs=2", "algorithm.rl.temperature=0.7")

    def run(out, recompute):
        monkeypatch.setattr(gt, "dropout_active", lambda model: recompute)
        trainer = make_trainer(cfg, hf_engine, protocol_adapter, out, base_dir)
        history = trainer.train()
        return history, {n: p.detach().clone() for n, p in trainer.model.named_parameters() if p.requires_grad}

    reused, reused_params = run(tmp_path / "reused", False)
    recomputed, recomputed_params = run(tmp_path / "recomputed", True)
    assert all(m["actor/ratio_mean"] != 1.0 for m in reused)
    for key in ("actor/loss", "actor/ratio_mean", "actor/clip_frac", "actor/grad_norm", "rollout/logprob_mismatch"):
        assert [m[key] for m in reused] == [m[key] for m in recomputed], key
    assert all(torch.equal(reused_params[n], recomputed_params[n]) for n in reused_params)


def test_dropout_is_seen_in_modules_and_in_the_config(base_dir):
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    from utils.train.policy import dropout_active

    def lora(dropout, **config):
        model = AutoModelForCausalLM.from_pretrained(base_dir, **config)
        return get_peft_model(model, LoraConfig(r=2, target_modules=["q_proj"], lora_dropout=dropout))

    assert not dropout_active(lora(0.0))
    assert dropout_active(lora(0.1))
    assert dropout_active(lora(0.0, attention_dropout=0.1))


def _run_05(out, *args: str) -> int:
    return run_rl_stage("05_train_red_grpo", out, *args)


RL_SHORT = set_args(REGIME_D, "model.engine.name=hf", "algorithm.rl.steps=2", "algorithm.rl.questions_per_step=2",
                    "algorithm.rl.n_samples=2", "wandb_mode=disabled")


def _warm_start(out, args) -> list[str]:
    """Run 03 and a 20-step 04 on the prepared run; returns the SFT flags the RL runs must repeat."""
    sft = set_args(REGIME_D, "warmup.steps=20", "warmup.eval_every=0", "warmup.eval_size=2", "model.engine.name=hf")
    assert run_stage("03_generate_sft_traces", out, *args) == 0
    assert run_stage("04_sft_warmup", out, *args, *sft) == 0
    return sft


def test_matched_arm_uses_reds_mean_weight_from_the_same_run(prepared, capsys):  # noqa: F811
    out, args = prepared
    rl = [*args, *_warm_start(out, args), *RL_SHORT]
    capsys.readouterr()
    assert _run_05(out, *rl, "--algorithm", "matched_sft") == 1
    assert "05_train_red_grpo/red/manifest.json not found" in capsys.readouterr().err
    assert _run_05(out, *rl) == 0, capsys.readouterr().err
    weights = [json.loads(x)["red/final_weight"]
               for x in (out / "t" / "05_train_red_grpo" / "red" / "metrics.jsonl").read_text().splitlines()]
    mean = sum(weights) / len(weights)
    assert manifest(out, "05_train_red_grpo/red")["metrics"]["final_weight_mean"] == pytest.approx(mean, abs=1e-6)
    assert _run_05(out, *rl, "--algorithm", "matched_sft") == 0, capsys.readouterr().err
    m = manifest(out, "05_train_red_grpo/matched_sft")
    assert m["metrics"]["red_mean_final_weight"] == pytest.approx(mean, abs=1e-6)
    assert m["metrics"]["sft_loss_coef"] == pytest.approx(0.1 * mean, abs=1e-6)
    # the configured value stays the configured one; what the trainer used instead is beside it
    assert m["config"]["algorithm"]["sft"]["loss_coef"] == 0.1
    assert m["effective"] == {"algorithm.sft.loss_coef": m["metrics"]["sft_loss_coef"]}
    assert "05_train_red_grpo/red" in m["parents"]
    logged = [json.loads(x) for x in
              (out / "t" / "05_train_red_grpo" / "matched_sft" / "metrics.jsonl").read_text().splitlines()]
    assert all(x["red/final_weight"] == 1.0 for x in logged)  # constant: G = 1, no accuracy factor


def test_rl_batch_trains_the_roles_asked_for(base_dir):
    """`algorithm.rl.train_roles`: both roles' sequences carry their episode's advantage; planner or
    executor keeps only that role's sequences, with the same advantages and ids."""
    from utils.agent.traces import episode_from_trace, make_trace
    from utils.train.batch import build_rl_batch

    codec = Codec(AutoTokenizer.from_pretrained(base_dir), load_run_config().model.templates)
    episodes = [episode_from_trace(make_trace("a", "3+4-2", [("3+4", "7"), ("7-2", "5")], "5"), codec),
                episode_from_trace(make_trace("b", "8-1", [("8-1", "7")], "7"), codec)]
    adv = torch.tensor([1.5, -0.5])
    both = build_rl_batch(episodes, adv, 0)
    assert both.roles == ["planner", "executor", "executor", "planner", "executor"]
    assert both.adv.tolist() == [1.5, 1.5, 1.5, -0.5, -0.5]
    for roles, keep in (("planner", [0, 3]), ("executor", [1, 2, 4])):
        part = build_rl_batch(episodes, adv, 0, roles)
        assert part.roles == [both.roles[i] for i in keep]
        assert part.adv.tolist() == [both.adv[i].item() for i in keep]
        width = int(part.attn.sum(-1).max())
        assert torch.equal(part.ids[:, :width], both.ids[keep][:, :width])
    with pytest.raises(ValueError, match="both, planner or executor"):
        build_rl_batch(episodes, adv, 0, "critic")


@pytest.mark.parametrize("stage, method, owner", [("05_train_red_grpo", "grpo", "06_ablate_grpo_only"),
                                                  ("05_train_red_grpo", "red_paper", "06_ablate_grpo_only"),
                                                  ("06_ablate_grpo_only", "red", "05_train_red_grpo"),
                                                  ("06_ablate_grpo_only", "sft", "05_train_red_grpo")])
def test_each_rl_script_refuses_the_other_scripts_methods(tmp_path, capsys, stage, method, owner):
    """05 trains the methods with an SFT term, 06 the pure-RL ones: a method run by the other script
    would land in a folder that 07 and the driver never look in, so it stops before anything is written."""
    from utils.core.stages import run_main
    from utils.train.rl_stage import run_rl_stage

    argv = ["--set", f"outputs_dir={tmp_path}", "--run_id", "t", "--algorithm", method]
    assert run_main(stage, lambda: run_rl_stage(stage, "", argv, default_algorithm="red")) == 1
    err = capsys.readouterr().err
    assert f"{stage}: {method} is" in err and f"trained by {owner}.py" in err and f"--method {method}" in err
    assert not (tmp_path / "t").exists()


def test_rl_lr_warms_up_linearly_from_the_step_alone(base_dir, tmp_path):
    cfg = load_run_config(algorithm="grpo", overrides=["algorithm.rl.lr=4e-4", "algorithm.rl.lr_warmup_steps=4"])
    trainer = make_trainer(cfg, None, None, tmp_path, base_dir)
    seen = []
    for step in range(6):
        trainer.state.step = step  # a resumed run sets the step from its checkpoint: the same lr follows
        seen.append(trainer._set_lr())
        assert all(g["lr"] == seen[-1] for g in trainer.opt.param_groups)
    assert seen == pytest.approx([1e-4, 2e-4, 3e-4, 4e-4, 4e-4, 4e-4])
    flat = load_run_config(algorithm="grpo", overrides=["algorithm.rl.lr=4e-4", "algorithm.rl.lr_warmup_steps=0"])
    constant = make_trainer(flat, None, None, tmp_path / "constant", base_dir)
    assert constant._set_lr() == 4e-4 and constant.opt.param_groups[0]["lr"] == 4e-4

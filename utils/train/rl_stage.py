"""The RL stage behind `05_train_red_grpo.py` and `06_ablate_grpo_only.py`: one trainer, any method.

Which method runs is the `--algorithm` config (utils/core/methods.py); 05 defaults to red and 06
to grpo. Outputs go to outputs/<run_id>/<stage>/<method>/: metrics.jsonl (and wandb files,
offline unless WANDB_API_KEY is set), episodes/step_N.jsonl, ckpt/step_N (resumable),
final_adapter/ and the manifest. An interrupted run resumes from its newest checkpoint. Under
`accelerate launch --multi_gpu --num_processes N` each rank rolls out its share of every step's
questions on its own engine (utils/train/grpo_trainer.py); rank 0 alone writes, and the manifest
records world_size.
"""
from __future__ import annotations

from pathlib import Path

from utils.agent.retrieval import run_retriever
from utils.agent.rollout import Codec, Rollout, RolloutSpec
from utils.agent.traces import read_offline_samples, read_trace_examples
from utils.core.checkpoint import save_weights
from utils.core.cli import parse_stage_args
from utils.core.config import to_dict
from utils.core.io import read_jsonl
from utils.core.manifest import StageRun
from utils.core.method_files import wants
from utils.core.methods import METHODS, trained_by
from utils.core.models import load_tokenizer
from utils.core.stages import StageError, model_dir, output_path, parent, stage_config, stage_dir
from utils.core.tracking import MetricsLogger, NullLogger
from utils.reward.spec import read_spec
from utils.train.policy import add_reference, load_policy
from utils.train.preflight import check_memory
from utils.train.questions import rl_questions
from utils.train.world import SOLO, World, join_world

WANDB_PROJECT = "red-coda"


def _summary(method: str, steps: int, resumed: bool, history: list[dict]) -> dict:
    first, last = history[0], history[-1]
    weight = mean_final_weight(history)
    return {"method": method, "steps": steps, "resumed": resumed,
            "reward_first": first.get("critic/rewards/mean"), "reward_last": last.get("critic/rewards/mean"),
            "accuracy_first": first.get("train/accuracy"), "accuracy_last": last.get("train/accuracy"),
            "max_logprob_mismatch": max((m["rollout/logprob_mismatch"] for m in history
                                         if "rollout/logprob_mismatch" in m), default=None),
            **({"final_weight_mean": round(weight, 6)} if weight is not None else {})}


def mean_final_weight(history: list[dict]) -> float | None:
    """Mean of red/final_weight over a run's metrics lines (None if it logged no SFT weight)."""
    weights = [m["red/final_weight"] for m in history if "red/final_weight" in m]
    return sum(weights) / len(weights) if weights else None


def _inputs(run: StageRun, cfg) -> tuple[Path | None, Path, Path, Path]:
    """(SFT adapter, sft_traces.jsonl, train.jsonl, reward_spec.yaml), recorded as the run's inputs. The
    adapter is None where RL starts from the base (algorithm.rl.init base: 04 is not read)."""
    adapter = None
    if cfg.algorithm.rl.init == "warmup":
        sft_dir, _ = parent(run, cfg, "04_sft_warmup")
        adapter = sft_dir / "ckpt_sft" / "best"  # selected by val accuracy
    traces_dir, _ = parent(run, cfg, "03_generate_sft_traces")
    _, prepared = parent(run, cfg, "01_prepare_dataset")
    rewards_dir, _ = parent(run, cfg, "02_build_rewards")
    paths = (adapter, traces_dir / "sft_traces.jsonl", output_path(prepared, "/train.jsonl"),
             rewards_dir / "reward_spec.yaml")
    for p in paths:
        if p is not None:
            run.add_input(p)
    return paths


def _match_red(run: StageRun, cfg) -> float:
    """matched_sft: set algorithm.sft.loss_coef to alpha x the mean red/final_weight of this seed's red
    run (recorded as a parent, so a re-run of red re-runs this arm); returns that mean."""
    _, manifest = parent(run, cfg, "05_train_red_grpo/red")
    metrics = output_path(manifest, "/metrics.jsonl")
    run.add_input(metrics)
    mean = mean_final_weight(read_jsonl(metrics))
    if mean is None:
        raise StageError(f"{metrics} holds no red/final_weight values: red's run logged no SFT weight")
    cfg.algorithm.sft.loss_coef *= mean
    return mean


def build_trainer(cfg, adapter: Path | None, traces: Path, train_path: Path, spec_path: Path, out: Path, logger,
                  config_sha: str, world: World = SOLO):
    """The RL trainer of `cfg`'s method, starting from the SFT `adapter` (None: a fresh LoRA on the base,
    algorithm.rl.init base), with its sampling engine (`trainer.engine`); also what
    benchmarks/step_profile.py times."""
    import torch

    from utils.agent.engines import make_engine
    from utils.train.grpo_trainer import GrpoTrainer

    questions = rl_questions(read_jsonl(train_path), cfg, train_path)  # before the slow start-up: fail fast
    base = model_dir(cfg)
    remote = cfg.model.trust_remote_code
    tok = load_tokenizer(base, remote)
    torch.manual_seed(cfg.seed)  # LoRA init draws from torch's RNG
    model = load_policy(base, cfg.model.lora, cfg.model.dtype, adapter=adapter, trust_remote_code=remote,
                        device=cfg.model.device, checkpointing=cfg.model.memory.activation_checkpointing)
    if cfg.algorithm.rl.kl_coef > 0:
        add_reference(model, adapter)  # the KL reference is where RL starts: the SFT warmup adapter
    engine = make_engine(cfg.model.engine.name, base, cfg.model.engine, cfg.seed, remote)
    rollout = Rollout(engine, Codec(tok, cfg.model.templates), RolloutSpec.from_config(cfg, cfg.algorithm.rl.temperature),
                      run_retriever(cfg))
    alg = cfg.algorithm
    demos = alg.red_paper.offline or alg.srft.enabled or wants(alg, "demonstrations")
    offline = read_offline_samples(traces) if demos else {}
    spec = read_spec(spec_path)
    trainer = GrpoTrainer(cfg, model, engine, rollout, spec, questions, read_trace_examples(traces),
                          tok.pad_token_id, out, logger, config_sha, offline, world)
    if spec.process.source == "judge" and cfg.algorithm.rl.enabled:
        from utils.reward.process import JudgePRM

        judge = make_engine(spec.process.judge_engine, base, cfg.model.engine, cfg.seed, remote)
        judge.set_adapter(adapter)  # the judge is the SFT warmup RL starts from, fixed for the run
        trainer.prm = JudgePRM(judge, tok, spec.process.judge_template, spec.process.judge_max_tokens)
    return trainer


def run_rl_stage(stage: str, description: str, argv: list[str], default_algorithm: str) -> int:
    """Parse the stage's flags (adding --algorithm DEFAULT unless given), train, write the manifest."""
    import torch
    from tqdm import tqdm

    argv = list(argv) if "--algorithm" in argv else ["--algorithm", default_algorithm, *argv]
    trains = f"\nThe methods it trains (utils/core/methods.py): {', '.join(trained_by(stage))}."
    cfg, _ = parse_stage_args(description + trains, argv)
    method = cfg.algorithm.method
    if METHODS[method].trainer != stage:
        kind = "a method with an SFT term" if METHODS[method].flags["sft"] else "a pure-RL method"
        raise StageError(f"{stage}: {method} is {kind}, trained by {METHODS[method].trainer}.py (05 trains the "
                         "methods with an SFT term, 06 the pure-RL ones); run that script, or 09_driver.py "
                         f"--method {method}")
    out = stage_dir(cfg, f"{stage}/{method}")
    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    world = join_world(cfg.model.device)
    if world.size > cfg.algorithm.rl.questions_per_step and cfg.algorithm.rl.enabled:
        raise StageError(f"algorithm.rl.questions_per_step={cfg.algorithm.rl.questions_per_step} is fewer than the "
                         f"{world.size} processes: each rank rolls out whole questions")
    estimate = check_memory(f"{stage}/{method}", cfg, model_dir(cfg), engine=True)  # before anything is written
    with StageRun(f"{stage}/{method}", out, stage_config(cfg, stage), cfg.seed, writer=world.main) as run:
        run.data["world_size"] = world.size
        run.data["memory_estimate_gib"] = estimate
        run.add_model(model_dir(cfg))
        adapter, traces, train_path, spec_path = _inputs(run, cfg)
        logged = to_dict(cfg)  # the config as the manifest hashed it, for wandb too
        if cfg.algorithm.sft.match_red:
            run.metrics["red_mean_final_weight"] = round(_match_red(run, cfg), 6)
            run.metrics["sft_loss_coef"] = round(cfg.algorithm.sft.loss_coef, 6)
            # what the trainer uses in place of the configured value, in the manifest and wandb alike
            run.data["effective"] = logged["effective"] = {"algorithm.sft.loss_coef": run.metrics["sft_loss_coef"]}
            if world.main:
                print(f"{stage}: {method} uses red's mean SFT weight {run.metrics['red_mean_final_weight']}: "
                      f"loss_coef {run.metrics['sft_loss_coef']}")
        logger = MetricsLogger.create(out / "metrics.jsonl", cfg.wandb_mode, WANDB_PROJECT, f"{cfg.run_id}-{method}",
                                      logged) if world.main else NullLogger()
        trainer = build_trainer(cfg, adapter, traces, train_path, spec_path, out, logger, run.data["config_sha256"],
                                world)
        resumed = trainer.try_resume()
        if resumed and world.main:
            print(f"{stage}: resuming {method} from step {trainer.state.step}")
        with tqdm(total=cfg.algorithm.rl.steps, initial=trainer.state.step, desc=method, unit="step",
                  disable=not world.main) as bar:
            trainer.train(bar)
        logger.finish()
        trainer.close()
        if not world.main:
            return 0
        save_weights(trainer.model, out / "final_adapter")
        run.add_output(out / "final_adapter")
        run.add_output(out / "metrics.jsonl")
        run.metrics.update(_summary(method, trainer.state.step, resumed, read_jsonl(out / "metrics.jsonl")))
    print(f"{stage}: {method} {trainer.state.step} steps; reward {run.metrics['reward_first']} -> "
          f"{run.metrics['reward_last']} -> {out / 'final_adapter'}")
    return 0

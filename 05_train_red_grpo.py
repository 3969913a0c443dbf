"""05_train_red_grpo: RED-GRPO from the SFT checkpoint (method red by default; fixed_sft, grpo and
sft are the same trainer with another --algorithm config).

Each step rolls out questions x n samples on the engine serving the current LoRA adapter,
scores them with the reward spec, and takes one optimizer step on
L_GRPO − β·H + w_entropy·w_acc·α·L_SFT (utils/grpo.py); the new adapter then goes to the engine.
Writes outputs/<run_id>/<stage>/<method>/: metrics.jsonl (and wandb files, offline unless
WANDB_API_KEY is set), episodes/step_N.jsonl every rl.dump_freq steps, ckpt/step_N (resumable,
last rl.keep_last kept), final_adapter/ and the manifest. An interrupted run resumes.
"""
import json
import sys

from tqdm import tqdm

from utils.cli import parse_stage_args
from utils.manifest import StageRun
from utils.reward_spec import read_spec
from utils.rollout import Codec, Rollout, RolloutSpec
from utils.run_config import to_dict
from utils.sft import load_policy
from utils.sft_trainer import save_weights
from utils.stages import config_slice, model_dir, output_path, parent, run_main, stage_dir
from utils.traces import read_trace_examples
from utils.tracking import MetricsLogger

STAGE = "05_train_red_grpo"
CONFIG_KEYS = ("model", "algorithm", "seed", "threads")


def train(stage: str, argv=None, default_algorithm: str = "red") -> int:
    parser_argv = list(argv if argv is not None else sys.argv[1:])
    if "--algorithm" not in parser_argv:
        parser_argv = ["--algorithm", default_algorithm] + parser_argv
    cfg, _ = parse_stage_args(__doc__, parser_argv)
    method = cfg.algorithm.method
    out = stage_dir(cfg, f"{stage}/{method}")
    import torch
    from transformers import AutoTokenizer

    from utils.engines import make_engine
    from utils.grpo_trainer import GrpoTrainer

    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    with StageRun(f"{stage}/{method}", out, config_slice(cfg, CONFIG_KEYS), cfg.seed) as run:
        sft_dir, _ = parent(run, cfg, "04_sft_warmup")
        traces_dir, _ = parent(run, cfg, "03_generate_sft_traces")
        _, prepared = parent(run, cfg, "01_prepare_dataset")
        rewards_dir, _ = parent(run, cfg, "02_build_rewards")
        base, adapter = model_dir(cfg), sft_dir / "ckpt_sft" / "best"  # selected by val accuracy
        train_path = output_path(prepared, "/train.jsonl")
        for p in (adapter, traces_dir / "sft_traces.jsonl", train_path, rewards_dir / "reward_spec.yaml"):
            run.add_input(p)
        tok = AutoTokenizer.from_pretrained(base)
        rows = [json.loads(x) for x in train_path.read_text().splitlines() if x.strip()]
        torch.manual_seed(cfg.seed)  # LoRA init draws from torch's RNG
        model = load_policy(base, cfg.model.lora, cfg.model.dtype, adapter=adapter)
        engine = make_engine(cfg.model.engine.name, base, cfg.model.engine, cfg.seed)
        rl = cfg.algorithm.rl
        rollout = Rollout(engine, Codec(tok, cfg.model.templates),
                          RolloutSpec(rl.max_turns, cfg.model.max_new_tokens_planner, cfg.model.max_new_tokens_executor,
                                      rl.temperature, max_model_len=cfg.model.engine.max_model_len))
        logger = MetricsLogger.create(out / "metrics.jsonl", cfg.wandb_mode, "red-coda", f"{cfg.run_id}-{method}",
                                      to_dict(cfg))
        trainer = GrpoTrainer(cfg, model, engine, rollout, read_spec(rewards_dir / "reward_spec.yaml"), rows,
                              read_trace_examples(traces_dir / "sft_traces.jsonl"), tok.pad_token_id, out, logger,
                              run.data["config_sha256"])
        resumed = trainer.try_resume()
        if resumed:
            print(f"{stage}: resuming {method} from step {trainer.state.step}")
        with tqdm(total=rl.steps, initial=trainer.state.step, desc=f"{method}", unit="step") as bar:
            trainer.train(bar)
        logger.finish()
        save_weights(model, out / "final_adapter")
        engine.close()
        run.add_output(out / "final_adapter")
        run.add_output(out / "metrics.jsonl")
        from utils.tracking import read_metrics
        full = read_metrics(out / "metrics.jsonl")
        first, last = full[0], full[-1]
        run.metrics.update(method=method, steps=trainer.state.step, resumed=resumed,
                           reward_first=first.get("critic/rewards/mean"), reward_last=last.get("critic/rewards/mean"),
                           accuracy_first=first.get("answer_f1/mean"), accuracy_last=last.get("answer_f1/mean"),
                           max_logprob_mismatch=max(m.get("rollout/logprob_mismatch", 0.0) for m in full))
    print(f"{stage}: {method} {trainer.state.step} steps; reward {run.metrics['reward_first']} -> "
          f"{run.metrics['reward_last']} -> {out / 'final_adapter'}")
    return 0


if __name__ == "__main__":
    sys.exit(run_main(STAGE, lambda: train(STAGE)))

"""04_sft_warmup: LoRA SFT on the traces, validated with greedy agent rollouts on val.

Rank, alpha and target modules come from the model config (model.lora; full_finetune trains all
weights). The loss is masked to each role's generated tokens. Every `warmup.eval_every` steps the
current adapter is served by the rollout engine (model.engine.name) for greedy planner/executor
rollouts on the val split, scored with the reward spec; results go to valid_samples/step_N.json.
Writes logs/train.jsonl, ckpt_sft/{best,final} (peft adapter directories that vLLM loads as a
LoRARequest) and the manifest. With `warmup.patience` P it stops after P validations in a row below
the best (the manifest's `stopped_early`; `final` is then the stop step's adapter). An interrupted
run resumes from ckpt_sft/last. Under
`accelerate launch --multi_gpu --num_processes N` the global batch is split over N ranks
(utils/train/world.py); rank 0 alone validates and writes, and the manifest records world_size.
"""
import sys

from tqdm import tqdm

from utils.agent.retrieval import run_retriever
from utils.agent.rollout import Codec
from utils.agent.traces import read_trace_examples
from utils.core.cli import parse_stage_args
from utils.core.io import read_jsonl
from utils.core.manifest import StageRun
from utils.core.models import load_tokenizer
from utils.core.stages import StageError, model_dir, output_path, parent, run_main, stage_config, stage_dir
from utils.eval.evaluation import Validator
from utils.reward.spec import read_spec
from utils.train.policy import load_policy
from utils.train.preflight import check_memory
from utils.train.sft_trainer import SftLoop
from utils.train.world import join_world

STAGE = "04_sft_warmup"


def main(argv=None) -> int:
    cfg, _ = parse_stage_args(__doc__, argv)
    out = stage_dir(cfg, STAGE)
    import torch

    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    world = join_world(cfg.model.device)
    estimate = check_memory(STAGE, cfg, model_dir(cfg), engine=world.main)  # before anything is written
    with StageRun(STAGE, out, stage_config(cfg, STAGE), cfg.seed, writer=world.main) as run:
        run.data["world_size"] = world.size
        run.data["memory_estimate_gib"] = estimate
        traces_dir, _ = parent(run, cfg, "03_generate_sft_traces")
        _, prepared = parent(run, cfg, "01_prepare_dataset")
        rewards_dir, _ = parent(run, cfg, "02_build_rewards")
        base = model_dir(cfg)
        run.add_model(base)
        tok = load_tokenizer(base, cfg.model.trust_remote_code)
        examples = read_trace_examples(traces_dir / "sft_traces.jsonl")
        if not examples:
            raise StageError(f"{traces_dir / 'sft_traces.jsonl'} holds no training examples")
        val_path = output_path(prepared, "/val.jsonl")
        rows = read_jsonl(val_path)
        rows = rows[:cfg.warmup.eval_size] if cfg.warmup.eval_size else rows
        for p in (traces_dir / "sft_traces.jsonl", val_path, rewards_dir / "reward_spec.yaml"):
            run.add_input(p)
        validator = Validator(cfg, base, rows, read_spec(rewards_dir / "reward_spec.yaml"),
                              Codec(tok, cfg.model.templates), out, run_retriever(cfg, run)) if world.main else None
        torch.manual_seed(cfg.seed)  # LoRA init draws from torch's RNG
        model = load_policy(base, cfg.model.lora, cfg.model.dtype, trust_remote_code=cfg.model.trust_remote_code,
                            device=cfg.model.device, checkpointing=cfg.model.memory.activation_checkpointing)
        loop = SftLoop(model, examples, cfg.warmup, cfg.seed, tok.pad_token_id, out,
                       validator and (lambda d, s: validator(model, d, s)), run.data["config_sha256"], world,
                       cfg.model.memory)
        resumed = loop.try_resume()
        if resumed and world.main:
            print(f"{STAGE}: resuming from step {loop.state.step}")
        with tqdm(total=cfg.warmup.steps, initial=loop.state.step, desc="sft", unit="step",
                  disable=not world.main) as bar:
            state = loop.run(bar)
        for name in ("ckpt_sft/best", "ckpt_sft/final", "logs/train.jsonl"):
            run.add_output(out / name)
        last = state.history[-1] if state.history else {}
        run.metrics.update(steps=state.step, stopped_early=state.step < cfg.warmup.steps, resumed=resumed,
                           best_step=state.best_step, trained_tokens=state.tokens,
                           best_val_accuracy=state.best_metric, final_val_accuracy=last.get("accuracy"),
                           final_val_format=last.get("format"), examples=len(examples),
                           trainable_parameters=sum(p.numel() for p in model.parameters() if p.requires_grad))
    if world.main:
        print(f"{STAGE}: best val accuracy {state.best_metric} at step {state.best_step} -> {out / 'ckpt_sft'}")
    return 0


if __name__ == "__main__":
    sys.exit(run_main(STAGE, main))

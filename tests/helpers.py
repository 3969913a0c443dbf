"""Everything two or more test modules share, so that no test module imports another: config
overrides and the tiny-run settings, running a stage in this process and reading its manifest,
the small datasets and rows tests train and roll out on, an RL trainer built by hand, 08 as a
subprocess, free ports, a process killed once it has logged, waiting for a condition. Fixtures are in conftest.py; quick
protocol-following adapters are in utils/tinyarith/quick.py."""
from __future__ import annotations

import importlib
import json
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import torch

from utils.core.config import ROOT
from utils.core.schema import DataConfig
from utils.data.synthetic import generate_rows
from utils.tinyarith.quick import SHORT_CHAINS

FIXTURES = Path(__file__).parent / "fixtures"

# Tests of the pipeline's mechanics run in regime D (configs/regimes/regime_d.yaml): their runs are
# too short to learn anything, and the default regime's dynamic sampling rightly stops a run whose
# every group scores alike. The default regime's own pieces have their own tests
# (test_dynamic_sampling, test_primary_metric, test_sft_stages' imperfect teacher, test_config).
REGIME_D = "regime=regime_d"
# every train row in the plain shuffled stream: the schema's RL questions, where the default regime
# narrows them to chains of 2-4 subtasks in a stratified stream
EVERY_QUESTION = ("algorithm.rl.min_subtasks=0", "algorithm.rl.max_subtasks=0", "algorithm.rl.stratify=false")

# One tiny run for tests that go through whole stages: too short to learn anything, long enough
# for every stage to do its work (the driver's tests, the Ray executor's, the launcher's).
TINY = [REGIME_D, "data.n_train=40", "data.n_val=6", "data.n_test=6", "warmup.steps=6", "warmup.eval_every=0",
        "warmup.eval_size=3", "warmup.batch_size=8", "algorithm.rl.steps=2", "algorithm.rl.questions_per_step=2",
        "algorithm.rl.n_samples=2", "model.engine.name=hf", "wandb_mode=disabled"]
# the small synthetic dataset of the `prepared` fixture (conftest.py)
SMALL = ["--set", "data.n_train=60", "--set", "data.n_val=8", "--set", "data.n_test=8", "--set", REGIME_D]
MASK = torch.tensor([[1., 1., 1., 0.], [1., 1., 0., 0.]])  # two sequences' loss masks, for the loss maths


def set_args(*settings: str) -> list[str]:
    """Config overrides as command-line flags: ("a=1", "b=2") -> ["--set", "a=1", "--set", "b=2"]."""
    return [x for s in settings for x in ("--set", s)]


def free_port() -> int:
    """A TCP port free on this machine now (the kernel's pick): tests that run at once (pytest-xdist)
    must not share a launcher's rendezvous port or a server's."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_for(predicate, timeout: float, what: str, detail=lambda: ""):
    """`predicate()`'s first truthy value, polled every 0.2 s; an AssertionError naming `what` (and
    `detail()`) once `timeout` seconds have passed without one."""
    deadline = time.time() + timeout
    while time.time() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.2)
    raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what}{detail()}")


def kill_once_logged(cmd: list[str], cwd: Path, log: Path, lines: int, timeout: float) -> int:
    """Start `cmd`, SIGKILL it as soon as `log` has `lines` lines; returns its exit code
    (-SIGKILL when the kill landed, something else if it finished first)."""
    proc = subprocess.Popen(cmd, cwd=cwd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.time() + timeout
    while time.time() < deadline and proc.poll() is None:
        if log.is_file() and len(log.read_text().splitlines()) >= lines:
            proc.send_signal(signal.SIGKILL)
            break
        time.sleep(0.05)
    return proc.wait(timeout=60)


def run_stage(stage: str, outputs: Path, *args: str) -> int:
    """A numbered stage's main() in this process, on run id "t" under `outputs`; its exit code."""
    from utils.core.stages import run_main

    mod = importlib.import_module(stage)
    argv = ["--set", f"outputs_dir={outputs}", "--run_id", "t", *args]
    return run_main(stage, lambda: mod.main(argv))


def run_rl_stage(stage: str, outputs: Path, *args: str, default: str = "red") -> int:
    """05 or 06 in this process on run id "t" under `outputs`, as `run_stage` runs the others (their
    scripts are only a call of utils/train/rl_stage.py run_rl_stage); its exit code."""
    from utils.core.stages import run_main
    from utils.train.rl_stage import run_rl_stage as run

    argv = ["--set", f"outputs_dir={outputs}", "--run_id", "t", *args]
    return run_main(stage, lambda: run(stage, "", argv, default_algorithm=default))


def manifest(outputs: Path, stage: str) -> dict:
    return json.loads((outputs / "t" / stage / "manifest.json").read_text())


def sft_args(extra=()) -> list[str]:
    """A 12-step SFT warmup on the HF engine, saving every 3 steps, no validation."""
    return ["--set", "warmup.steps=12", "--set", "warmup.batch_size=8", "--set", "warmup.save_every=3",
            "--set", "warmup.eval_every=0", "--set", "warmup.eval_size=4", "--set", "model.engine.name=hf",
            "--set", "warmup.warmup_steps=2", *extra]


def run_compare(tmp_path, *args) -> subprocess.CompletedProcess:
    """08_compare_runs.py as a subprocess over `tmp_path`/outputs."""
    return subprocess.run([sys.executable, "08_compare_runs.py", "--set", f"outputs_dir={tmp_path / 'outputs'}",
                           "--set", "wandb_mode=disabled", *args], cwd=ROOT, capture_output=True, text=True, timeout=300)


def arith_rows(n=12) -> list[dict]:
    """n short-chain test questions (seed 77) as rollout rows."""
    rows = generate_rows(DataConfig(n_train=0, n_val=0, n_test=n, seed=77, **SHORT_CHAINS))["test"]
    return [{"id": r["id"], "question": r["question"], "answers": [str(r["answer"])]} for r in rows]


def random_examples(n: int, seed: int = 0) -> list:
    """n planner SFT examples of 12-40 random token ids (3-90), the first 5 masked out."""
    import random

    from utils.agent.episode import Example

    rng = random.Random(seed)
    out = []
    for i in range(n):
        length = rng.randint(12, 40)
        ids = [rng.randint(3, 90) for _ in range(length)]
        out.append(Example(f"q{i}", "planner", ids, [0] * 5 + [1] * (length - 5)))
    return out


def random_lora(base_dir, dropout: float = 0.0):
    """The tiny base with a rank-8 LoRA (load_policy's) whose A and B are all drawn at std 0.05
    (torch seed 0): a fresh adapter's B is zero, which would hide a wrong B product or merge."""
    from utils.core.schema import LoraConfig
    from utils.train.policy import load_policy

    torch.manual_seed(0)
    model = load_policy(base_dir, LoraConfig(rank=8, alpha=16, dropout=dropout))
    for p in model.parameters():
        if p.requires_grad:
            torch.nn.init.normal_(p, std=0.05)
    return model


def greedy_episodes(engine, tok, rows):
    """One greedy episode per row, four planner turns at most, default templates."""
    from utils.agent.rollout import Codec, Rollout, RolloutSpec
    from utils.core.schema import TemplatesConfig

    ro = Rollout(engine, Codec(tok, TemplatesConfig()), RolloutSpec(max_turns=4, temperature=0.0))
    return ro.run(rows, n=1, seed=0)


def peft_logprobs(base_dir, adapter, ids, start) -> list[float]:
    """transformers + peft's log-prob of each token of `ids` from position `start` on (the reference)."""
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(base_dir, dtype=torch.float32)
    if adapter is not None:
        model = PeftModel.from_pretrained(model, str(adapter))
    model.eval()
    with torch.no_grad():
        logp = torch.log_softmax(model(input_ids=torch.tensor([ids])).logits[0].float(), -1)
    return [logp[k - 1, ids[k]].item() for k in range(start, len(ids))]


def make_trainer(cfg, engine, adapter, tmp_path, base_dir):
    """A GrpoTrainer on 40 short-chain questions with their gold traces, logging to `tmp_path`."""
    from transformers import AutoTokenizer

    from utils.agent.rollout import Codec, Rollout, RolloutSpec
    from utils.core.tracking import MetricsLogger
    from utils.reward.spec import RewardSpec
    from utils.agent.traces import gold_examples
    from utils.tinyarith.quick import short_chain_rows
    from utils.train.grpo_trainer import GrpoTrainer
    from utils.train.policy import load_policy

    tok = AutoTokenizer.from_pretrained(base_dir)
    codec = Codec(tok, cfg.model.templates)
    rows = short_chain_rows(40)
    model = load_policy(base_dir, cfg.model.lora, adapter=adapter)
    ro = Rollout(engine, codec, RolloutSpec.from_config(cfg, cfg.algorithm.rl.temperature))
    return GrpoTrainer(cfg, model, engine, ro, RewardSpec(), rows, gold_examples(rows, codec), tok.pad_token_id,
                       tmp_path, MetricsLogger(tmp_path / "metrics.jsonl"), "sha")


def demo_trainer(method: str, engine, adapter, tmp_path, base_dir):
    """(a trainer of `method` for 2 steps of 4 questions × 3 samples without dynamic sampling, every
    question with its gold trace as its demonstration; its trainable parameters before training)."""
    from utils.core.loader import load_run_config

    cfg = load_run_config(algorithm=method, overrides=[
        "algorithm.rl.steps=2", "algorithm.rl.questions_per_step=4", "algorithm.rl.n_samples=3",
        "algorithm.rl.dump_freq=0", "algorithm.rl.save_freq=100", "algorithm.rl.dynamic_sampling=0"])
    trainer = make_trainer(cfg, engine, adapter, tmp_path, base_dir)
    give_gold_demos(trainer, trainer.rows)
    return trainer, {n: p.detach().clone() for n, p in trainer.model.named_parameters() if p.requires_grad}


def give_gold_demos(trainer, rows) -> None:
    """Give the trainer each of `rows`' gold trace as its offline demonstration, as 05 does for the
    traced questions (trainer.offline: question id → OfflineSample)."""
    from utils.agent.traces import OfflineSample, examples_from_trace, trace_from_row

    for row in rows:
        trace, _ = trace_from_row(row, "gold")
        trainer.offline[row["id"]] = OfflineSample(examples_from_trace(trace, trainer.rollout.codec), trace.answer,
                                                   [t for t, _ in trace.executor_calls])


def evaluation_dir(run_dir, checkpoint, seed, scores, lr=5e-4):
    """A completed 07 evaluation of `checkpoint` with these 0/1 `scores` under `run_dir` (and, for red and
    grpo, a trainer folder with four logged steps); returns its metrics."""
    d = run_dir / "07_evaluate" / checkpoint
    (d / "samples").mkdir(parents=True)
    n = len(scores)
    acc = sum(scores) / n
    metrics = {"checkpoint": checkpoint, "n": n, "accuracy": acc, "accuracy_ci95": [max(acc - 0.1234, 0.0), acc + 0.0567],
               "format": 0.9123, "answered": 0.8765, "reward": 6 * acc - 3, "turns": 2.5, "subtasks": 1.75,
               "tokens_planner": 40.25, "tokens_executor": 18.5, "accuracy_by_gold_subtasks": {"2": acc, "10": 0.125}}
    (d / "metrics.json").write_text(json.dumps(metrics))
    (d / "samples" / "predictions.jsonl").write_text(
        "".join(json.dumps({"qid": f"test-{i:03d}", "answer": s}) + "\n" for i, s in enumerate(scores)))
    (d / "manifest.json").write_text(json.dumps({"stage": f"07_evaluate/{checkpoint}", "status": "completed",
                                                 "seed": seed, "config": {"checkpoint": checkpoint}}))
    if checkpoint in ("red", "grpo"):
        trainer = "05_train_red_grpo" if checkpoint == "red" else "06_ablate_grpo_only"
        t = run_dir / trainer / checkpoint
        t.mkdir(parents=True)
        rows = [{"step": k + 1, "critic/rewards/mean": -3 + k, "answer_f1/mean": k / 4, "time/rollout": 1.5,
                 "time/update": 0.5, "red/final_weight": 2.0, "actor/rl_entropy": 0.3} for k in range(4)]
        (t / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
        (t / "manifest.json").write_text(json.dumps({"stage": f"{trainer}/{checkpoint}", "status": "completed",
                                                     "seed": seed, "wall_seconds": 12.5,
                                                     "config": {"algorithm": {"method": checkpoint, "rl": {"lr": lr}}}}))
    return metrics


def seeded(wins: dict[int, int], items: int = 200) -> tuple[dict, dict]:
    """Scores on `items` items per seed where a wins (+) or loses (−) on |wins[seed]| items."""
    a = {(s, i): float(0 <= i < g) for s, g in wins.items() for i in range(items)}
    b = {(s, i): float(0 <= i < -g) for s, g in wins.items() for i in range(items)}
    return a, b


def ragged_rl_batch(offline: bool = False, seed: int = 0):
    """Nine sequences of five episodes (0 and 3 hold three and two rows: planner and executor calls),
    ragged, with sampler log-probs, per-row advantages and, for red_paper, two expert rows."""
    from utils.train.batch import RlBatch

    g = torch.Generator().manual_seed(seed)
    lengths = [38, 12, 9, 30, 14, 26, 11, 33, 20]
    episode = [0, 0, 0, 1, 2, 3, 3, 4, 5]
    ids = torch.zeros(len(lengths), max(lengths), dtype=torch.long)
    attn = torch.zeros_like(ids)
    for i, n in enumerate(lengths):
        ids[i, :n] = torch.randint(3, 90, (n,), generator=g)
        attn[i, :n] = 1
    mask = attn[:, 1:].float()
    mask[:, :3] = 0
    mask[2] = 0  # a sequence with no trained token
    sampler = (-torch.rand(mask.shape, generator=g) * 3 - 0.5) * mask
    off = torch.tensor([False] * 7 + [True, True]) if offline else torch.zeros(9, dtype=torch.bool)
    return RlBatch(ids, attn, mask, sampler, torch.randn(9, generator=g), ["planner", "executor", "executor"] * 3,
                   offline=off, accuracy=torch.rand(9, generator=g), episode=torch.tensor(episode))


def random_sft_batch(rows: int, seed: int, max_len: int):
    """(ids, attn, mask) of `rows` right-padded random sequences of 8 to max_len − 1 tokens, their first
    four target positions masked as a prompt: an SFT batch for the loss maths."""
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(8, max_len, (rows,), generator=g).tolist()
    ids = torch.zeros(rows, max(lengths), dtype=torch.long)
    attn = torch.zeros_like(ids)
    for i, n in enumerate(lengths):
        ids[i, :n] = torch.randint(3, 90, (n,), generator=g)
        attn[i, :n] = 1
    mask = attn[:, 1:].float()
    mask[:, :4] = 0  # a prompt
    return ids, attn, mask


def assert_close(a: torch.Tensor, b: torch.Tensor, rel: float = 1e-5) -> None:
    """Equal within fp32 summation noise: the largest difference at most `rel` of b's largest entry."""
    assert (a - b).abs().max().item() <= rel * b.abs().max().item(), ((a - b).abs().max().item(), b.abs().max().item())

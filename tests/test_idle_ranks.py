"""Data-parallel ranks that hold part of a step, or none of it (utils/train/grpo_trainer.py `_update`,
utils/train/update.py `red_grpo_loss` and `Tally`): three optimizer steps of the
trainer on two gloo ranks give, on both ranks, the one-process run's logged metrics, RED state,
red_paper state and weights, for red and red_paper, when

- `idle`: rank 1 has no RL rows of the step but one SFT row (it still trains it);
- `no_sft`: rank 1 has RL rows but no SFT row (the SFT batch has one example);
- `empty`: rank 1 has neither.

Before this was tested, an idle rank skipped its SFT rows (the others normalised by the rest), and a
rank without an SFT row logged no `red/*` weights, left its RED state unfolded and its red_paper
state stale, so the ranks' entropy weights parted on the next step."""
import json
import os
import subprocess
import sys

import pytest
import torch

from helpers import free_port, ragged_rl_batch, random_lora
from utils.core.config import ROOT

REL = 1e-4  # fp32: the same sums in another order, over three steps of AdamW
MOVED = 1e-3  # the weights' largest difference, as a share of their largest move over the steps
STEPS = 3
SCENARIOS = {  # (rank 0's RL rows, rank 1's) of helpers.ragged_rl_batch's nine rows, and the SFT batch size
    "idle": ((0, 1, 2, 3, 4, 5, 6, 7, 8), (), 2),
    "no_sft": ((0, 1, 2), (3, 4, 5, 6, 7, 8), 1),
    "empty": ((0, 1, 2, 3, 4, 5, 6, 7, 8), (), 1),
}
CASES = ("red", "red_paper")


def _sft_examples():
    from utils.agent.episode import Example

    g = torch.Generator().manual_seed(7)
    out = []
    for i, n in enumerate((31, 17, 24, 12)):
        ids = torch.randint(3, 90, (n,), generator=g).tolist()
        out.append(Example(f"s{i}", "planner", ids, [0] * 4 + [1] * (n - 4)))
    return out


def run_steps(world, case: str, scenario: str, base_dir, out_dir) -> dict:
    """STEPS trainer updates of this rank's share of the step (the whole step in one process), with
    red_paper's state fold after each: the metrics, states and how far each LoRA weight moved."""
    from utils.core.loader import load_run_config
    from utils.core.tracking import NullLogger
    from utils.train.batch import take_rows
    from utils.train.grpo_trainer import GrpoTrainer
    from utils.train.red_paper import ExpertTraces

    rows0, rows1, n_sft = SCENARIOS[scenario]
    overrides = ["algorithm.rl.stratify=false", "algorithm.rl.dynamic_sampling=0", f"algorithm.sft.batch_size={n_sft}", "algorithm.rl.ppo_epochs=1",
                 "algorithm.rl.ppo_minibatches=1", "algorithm.rl.lr=0.01", "algorithm.red.G=4"]
    if case == "red_paper":
        overrides.append("algorithm.rl.loss_agg=seq-mean-token-mean")
    cfg = load_run_config(algorithm="red", overrides=overrides)
    model = random_lora(base_dir)
    trainer = GrpoTrainer(cfg, model, None, None, None, [], _sft_examples(), 0, out_dir, NullLogger(), "t",
                          world=world)
    batch = ragged_rl_batch(offline=case == "red_paper")
    rows = list(rows0) + list(rows1) if world.size == 1 else (rows0, rows1)[world.rank]
    part = take_rows(batch, torch.tensor(rows))[0] if rows else None
    start = {n: p.detach().clone() for n, p in model.named_parameters() if p.requires_grad}
    history = []
    for _ in range(STEPS):
        stats, skipped = trainer._update(part, None, 0.4)
        if case == "red_paper":
            ExpertTraces({}, None, 2).after_update(stats, skipped, trainer.state)
        history.append(stats)
    weights = {n: (p.detach() - start[n]).tolist() for n, p in model.named_parameters() if p.requires_grad}
    return {"stats": history, "red": trainer.state.red, "red_paper": trainer.state.piece_state, "weights": weights}


RANK_SCRIPT = r"""
import json, sys, tempfile
from datetime import timedelta
import torch.distributed as dist
from pathlib import Path
sys.path[:0] = [sys.argv[2], sys.argv[2] + "/tests"]
from test_idle_ranks import CASES, SCENARIOS, run_steps
from utils.train.world import World

rank, out, base, port = int(sys.argv[1]), sys.argv[3], sys.argv[4], int(sys.argv[5])
store = dist.TCPStore("127.0.0.1", port, 2, rank == 0, timedelta(seconds=120))
world = World(rank, 2, dist.ProcessGroupGloo(store, rank, 2, timedelta(seconds=120)))
results = {f"{c}/{s}": run_steps(world, c, s, base, Path(tempfile.mkdtemp())) for c in CASES for s in SCENARIOS}
json.dump(results, open(out, "w"))
"""


@pytest.fixture(scope="module")
def ranks(base_dir, tmp_path_factory):
    """Both ranks' results for every case and scenario, from one pair of gloo processes."""
    tmp = tmp_path_factory.mktemp("idle_ranks")
    script = tmp / "rank.py"
    script.write_text(RANK_SCRIPT)
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    port = str(free_port())
    procs = [subprocess.Popen([sys.executable, str(script), str(r), str(ROOT), str(tmp / f"r{r}.json"),
                               str(base_dir), port], cwd=ROOT, env=env, stderr=subprocess.PIPE, text=True)
             for r in (0, 1)]
    for p in procs:
        _, err = p.communicate(timeout=600)
        assert p.returncode == 0, err[-3000:]
    return [json.loads((tmp / f"r{r}.json").read_text()) for r in (0, 1)]


def _same(a, b, what: str) -> None:
    if isinstance(b, dict):
        assert a.keys() == b.keys(), f"{what}: keys {sorted(a.keys() ^ b.keys())}"
        for k in b:
            _same(a[k], b[k], f"{what}.{k}")
    elif isinstance(b, list) and b and isinstance(b[0], dict):
        assert len(a) == len(b), f"{what}: {len(a)} steps vs {len(b)}"
        for i, (x, y) in enumerate(zip(a, b)):
            _same(x, y, f"{what}[{i}]")
    elif isinstance(b, list):
        ta, tb = torch.tensor(a, dtype=torch.float64), torch.tensor(b, dtype=torch.float64)
        assert (ta - tb).abs().max().item() <= REL * max(tb.abs().max().item(), 1e-12), what
    elif isinstance(b, float):
        assert a == pytest.approx(b, rel=REL, abs=1e-7), f"{what}: {a} vs {b}"
    else:
        assert a == b, f"{what}: {a} vs {b}"


@pytest.mark.parametrize("scenario", list(SCENARIOS))
@pytest.mark.parametrize("case", CASES)
def test_a_rank_without_rl_or_sft_rows_takes_the_one_process_steps(case, scenario, ranks, base_dir, tmp_path):
    one = run_steps(__import__("utils.train.world", fromlist=["SOLO"]).SOLO, case, scenario, base_dir, tmp_path)
    assert one["red"]["steps"] == STEPS and "red/entropy_weight" in one["stats"][-1]
    assert one["stats"][-1]["red/entropy_weight"] > 1  # the EMAs moved: a stale state would show
    if case == "red_paper":
        assert one["red_paper"] and any(s["red_paper/entropy_weight"] != 1.0 for s in one["stats"])
    moved = {k: torch.tensor(v) for k, v in one.pop("weights").items()}
    largest = max(v.abs().max().item() for v in moved.values())
    assert largest > 1e-3
    for rank, r in enumerate(ranks):
        mine = r[f"{case}/{scenario}"]
        for name, v in mine.pop("weights").items():
            assert (torch.tensor(v) - moved[name]).abs().max().item() <= MOVED * largest, f"rank {rank}: {name}"
        _same(mine, one, f"rank {rank}")

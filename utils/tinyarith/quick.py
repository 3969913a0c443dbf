"""Protocol-following LoRA adapters for the embedded base, made in a minute by plain SFT on gold
traces: for tests and benchmarks that need a policy that follows the protocol (it does not do the
arithmetic) without running 03 and 04."""
from __future__ import annotations

from pathlib import Path

from utils.agent.episode import Example
from utils.core.stream import Cursor, take

# The chains the quick adapters are trained and exercised on: 2-3 subtasks, which 150 SFT steps
# learn (the default's 1-6-step chains need a few hundred steps and still fail on 5 and 6).
SHORT_CHAINS = {"min_steps": 2, "max_steps": 3}


def short_chain_rows(n: int) -> list[dict]:
    """n training questions of 2-3 subtasks (SHORT_CHAINS, the data config's default seed) as rows
    with their gold decompositions, the shape 01 prepares."""
    from utils.core.schema import DataConfig
    from utils.data.synthetic import generate_rows

    return [{"id": r["id"], "question": r["question"], "answers": [str(r["answer"])], "meta": {"steps": r["steps"]}}
            for r in generate_rows(DataConfig(n_train=n, n_val=0, n_test=0, **SHORT_CHAINS))["train"]]


def quick_sft(model, examples: list[Example], steps: int, lr: float, batch_size: int, seed: int, pad_id: int) -> list[float]:
    """A plain SFT loop (no checkpoints, no clipping) over the library's loss and data stream."""
    import torch

    from utils.train.policy import sft_loss

    torch.manual_seed(seed)
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=lr)
    losses, cursor = [], Cursor()
    model.train()
    for _ in range(steps):
        loss = sft_loss(model, take(examples, batch_size, str(seed), cursor, within_epoch=True), pad_id)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    model.eval()
    return losses


def train_gold_adapter(base_path: Path, out_dir: Path, n_rows: int = 400, steps: int = 150, batch_size: int = 16,
                       seed: int = 0) -> Path:
    """A quickly SFT-trained protocol-following LoRA adapter on synthetic gold traces. Batches of 16
    (59 s alone on the AVX2 box) follow the protocol as well as 32 did (95 s): greedy on 40 test
    rows of 2-3 subtasks, 38 answered with both, 3.1 against 3.3 turns per episode. It follows the
    protocol but does not do the arithmetic: on the Intel AVX-512 box, greedy on 60 rows of 2-3
    subtasks 59 answered and 1 was right (0 of 60 on 1-subtask rows), so no test may need its
    answers to be right (tests/test_sft_stages.py's teacher tests)."""
    import torch
    from transformers import AutoTokenizer

    from utils.agent.rollout import Codec
    from utils.agent.traces import gold_examples
    from utils.core.schema import LoraConfig, TemplatesConfig
    from utils.train.policy import load_policy

    tok = AutoTokenizer.from_pretrained(base_path)
    rows = short_chain_rows(n_rows)
    torch.manual_seed(seed)  # the LoRA init draws from torch's RNG: seed it, or the adapter depends on test order
    model = load_policy(base_path, LoraConfig(rank=8, alpha=16))
    quick_sft(model, gold_examples(rows, Codec(tok, TemplatesConfig())), steps=steps, lr=3e-3, batch_size=batch_size,
              seed=seed, pad_id=tok.pad_token_id)
    model.save_pretrained(out_dir)
    return out_dir


def train_lookup_adapter(base_path: Path, rows: list[dict], search, out_dir: Path, steps: int = 100,
                         batch_size: int = 16, seed: int = 0) -> Path:
    """A quickly SFT-trained LoRA adapter on synthetic_lookup gold traces: its executor searches.
    On the AVX2 box, greedy on 8 test rows: 100 steps of 16 (56 s) searched 15 times, 150 steps
    (73-76 s) 16 times, as did 150 steps of 32 (135 s)."""
    import torch
    from transformers import AutoTokenizer

    from utils.agent.rollout import Codec
    from utils.agent.traces import gold_examples
    from utils.core.schema import LoraConfig, TemplatesConfig
    from utils.train.policy import load_policy

    tok = AutoTokenizer.from_pretrained(base_path)
    torch.manual_seed(seed)
    model = load_policy(base_path, LoraConfig(rank=8, alpha=16))
    quick_sft(model, gold_examples(rows, Codec(tok, TemplatesConfig()), search), steps=steps, lr=3e-3,
              batch_size=batch_size, seed=seed, pad_id=tok.pad_token_id)
    model.save_pretrained(out_dir)
    return out_dir

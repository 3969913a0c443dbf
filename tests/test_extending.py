"""A policy loss is its registry file and its test (docs/EXTENDING.md, "An advantage estimator, a
policy loss or a loss aggregation"): the checklist's example, CISPO, is added to a copy of the
library exactly as EXTENDING shows it, one file touched, and everything that reads policy losses
takes it there; the repository itself never registers it."""
import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
EXTENDING = ROOT / "docs" / "EXTENDING.md"
REGISTRY_LINE = '    "gspo": (gspo_loss, "sequence"),\n'
FUNCTIONS_END = "# name -> (loss function, the level its importance weights act at)\n"

# Run inside the copy: what the config, the process-reward check, the loss and the update make of it.
PROBE = r'''
import dataclasses, json, sys
import torch
from utils.core.choices import POLICY_LOSS_LEVELS
from utils.core.config import ConfigError
from utils.core.loader import check_process, load_run_config
from utils.core.schema import LoraConfig, MemoryConfig
from utils.core.tensors import pad
from utils.train.batch import RlBatch
from utils.train.losses import policy_loss
from utils.train.policy import forward_logprobs, load_policy
from utils.train.red import RedState
from utils.train.update import red_grpo_loss

out = {"level": POLICY_LOSS_LEVELS.get("cispo")}
try:
    load_run_config(algorithm="grpo", overrides=["algorithm.rl.policy_loss=cispo"])
except ConfigError as e:
    out["label_error"] = str(e)
cfg = load_run_config(algorithm="grpo", overrides=["algorithm.rl.temperature=0.7"])
alg = dataclasses.replace(cfg.algorithm, rl=dataclasses.replace(cfg.algorithm.rl, policy_loss="cispo"))
process = dataclasses.replace(cfg.reward.process, source="verifier")
check_process(dataclasses.replace(cfg, algorithm=alg, reward=dataclasses.replace(cfg.reward, process=process)))
out["process_ok"] = True

logp = torch.tensor([[-1.0, -2.0, -0.5]], requires_grad=True)
loss, stats = policy_loss("cispo", logp, torch.tensor([[-1.5, -1.0, -0.5]]), torch.tensor([2.0]),
                          torch.tensor([[1.0, 1.0, 0.0]]), 0.2, 0.28, "token-mean")
loss.backward()
out["hand"] = {"loss": loss.item(), "grad": logp.grad.tolist()[0], **stats}

torch.manual_seed(0)
model = load_policy(sys.argv[1], LoraConfig(rank=8, alpha=16))
for p in model.parameters():
    if p.requires_grad:
        torch.nn.init.normal_(p, std=0.05)
ids, attn = pad([[3 + (7 * i + 5 * n) % 90 for i in range(n)] for n in [40, 12, 30, 9]], 0, torch.long)
mask = attn[:, 1:].float()
mask[:, :3] = 0
batch = RlBatch(ids, attn, mask, torch.full(mask.shape, -2.0) * mask, torch.tensor([1.0, -0.5, 0.3, -0.8]),
                ["planner", "executor", "planner", "executor"], episode=torch.tensor([0, 0, 1, 1]))
with torch.no_grad():
    old, _ = forward_logprobs(model, ids, attn, temperature=0.7)
old = old + 0.3 * torch.sin(torch.arange(old.numel(), dtype=old.dtype)).reshape(old.shape)  # an older policy

def grads(a, old_lp, budget):
    model.zero_grad()
    terms = red_grpo_loss(model, batch, old_lp, None, a, RedState(), 0.5, memory=MemoryConfig(micro_batch_tokens=budget))
    return terms.stats, [p.grad.clone() for p in model.parameters() if p.requires_grad]

ppo = dataclasses.replace(alg, rl=dataclasses.replace(alg.rl, policy_loss="ppo_clip"))
whole, g_whole = grads(alg, old, 0)
cut, g_cut = grads(alg, old, 40)
on_cispo, g_on_cispo = grads(alg, None, 0)
on_ppo, g_on_ppo = grads(ppo, None, 0)
out["update"] = {
    "clip_frac": whole["actor/clip_frac"], "grad_norm": sum(float(g.norm()) for g in g_whole),
    "cut_vs_whole": max(float((a - b).abs().max()) for a, b in zip(g_cut, g_whole)),
    "on_policy_vs_ppo": max(float((a - b).abs().max()) for a, b in zip(g_on_cispo, g_on_ppo)),
    "largest": max(float(g.abs().max()) for g in g_whole),
    "losses": [on_cispo["actor/pg_loss"], on_ppo["actor/pg_loss"]]}
print(json.dumps(out))
'''


def example_blocks() -> tuple[str, str]:
    """EXTENDING's CISPO example: the function, then its registry line."""
    text = EXTENDING.read_text()
    after = text[text.index("A real example, CISPO"):]
    function, entry = re.findall(r"^```python\n(.*?)^```", after, flags=re.S | re.M)[:2]
    return function, entry


def library_with_example(dest: Path) -> Path:
    """A copy of utils/ and configs/ with EXTENDING's two blocks added to utils/train/losses.py alone."""
    ignore = shutil.ignore_patterns("__pycache__")
    for name in ("utils", "configs"):
        shutil.copytree(ROOT / name, dest / name, ignore=ignore)
    losses = dest / "utils" / "train" / "losses.py"
    text = losses.read_text()
    function, entry = example_blocks()
    assert text.count(FUNCTIONS_END) == 1 and text.count(REGISTRY_LINE) == 1, "losses.py's registry moved"
    text = text.replace(FUNCTIONS_END, function + "\n\n" + FUNCTIONS_END)
    losses.write_text(text.replace(REGISTRY_LINE, REGISTRY_LINE + entry))
    return dest


def test_the_extending_example_is_not_registered_here():
    from utils.core.config import ConfigError
    from utils.core.loader import load_run_config
    from utils.train.losses import POLICY_LOSSES

    assert "cispo" not in POLICY_LOSSES.names
    with pytest.raises(ConfigError, match=r"'cispo'.*ppo_clip, gspo"):
        load_run_config(algorithm="grpo", overrides=["algorithm.rl.policy_loss=cispo"])


def test_a_policy_loss_added_in_its_registry_file_alone_trains(tmp_path, base_dir):
    copy = library_with_example(tmp_path / "repo")
    changed = [p.relative_to(copy).as_posix() for p in sorted((copy / "utils").rglob("*.py"))
               if p.read_bytes() != (ROOT / p.relative_to(copy)).read_bytes()]
    assert changed == ["utils/train/losses.py"]
    done = subprocess.run([sys.executable, "-c", PROBE, str(base_dir)], cwd=copy, capture_output=True, text=True,
                          env={"PYTHONPATH": str(copy), "PATH": "/usr/bin:/bin"}, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    out = json.loads(done.stdout.strip().splitlines()[-1])
    assert out["level"] == "token" and out["process_ok"]
    # the schema takes the name; the method label still guards what a run is filed as
    assert "contradicts algorithm.rl.policy_loss=cispo" in out["label_error"]
    # by hand: r = e^0.5 -> clipped to 1.28, r = e^-1 -> 0.8; per token -w·A·logp = 2.56, 3.2; mean 2.88;
    # d/dlogp = -w·A / 2 = -1.28, -0.8, and 0 on the masked token
    hand = out["hand"]
    assert hand["loss"] == pytest.approx(2.88) and hand["grad"] == pytest.approx([-1.28, -0.8, 0.0])
    assert hand["clip_frac"] == 1.0 and hand["ratio_mean"] == pytest.approx((2.718281828 ** 0.5 + 2.718281828 ** -1) / 2)
    update = out["update"]
    assert 0 < update["clip_frac"] < 1 and update["grad_norm"] > 0
    assert update["cut_vs_whole"] <= 1e-5 * update["largest"]  # micro-batched as the registry's level says
    # on-policy (r = 1) CISPO's gradient is PPO-clip's, -A·∇logp, while its value is not
    assert update["on_policy_vs_ppo"] <= 1e-5 * update["largest"]
    assert abs(update["losses"][0] - update["losses"][1]) > 1e-3

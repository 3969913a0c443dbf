"""LUFFY (utils/train/methods/luffy.py), the method that lives in one file: its policy loss by hand,
the micro-batched update against it, the method as its file and config declare it (and nothing else
naming it), the method files' declarations checked, and two steps of the real trainer."""
import math
import re

import pytest
import torch

from helpers import assert_close, demo_trainer, ragged_rl_batch, random_lora
from utils.core.config import ROOT, ConfigError
from utils.core.errors import StageError
from utils.core.loader import load_run_config
from utils.core.method_files import method_files
from utils.core.methods import METHODS, RL_TRAINER
from utils.core.schema import MemoryConfig
from utils.reward.spec import RewardSpec
from utils.train.batch import RlBatch
from utils.train.losses import Agg
from utils.train.method_variants import active_variants, piece_loss
from utils.train.methods.luffy import Guidance, LuffyPiece, luffy_loss
from utils.train.policy import forward_logprobs
from utils.train.red import RedState
from utils.train.update import red_grpo_loss


def _alg(*overrides):
    return load_run_config(algorithm="luffy", overrides=list(overrides)).algorithm


def _tiny_part() -> RlBatch:
    """Three rows of two tokens: two rollouts (the second with one trained token), a demonstration."""
    mask = torch.tensor([[1.0, 1.0], [1.0, 0.0], [1.0, 1.0]])
    ids = torch.zeros(3, 3, dtype=torch.long)
    return RlBatch(ids, torch.ones_like(ids), mask, None, torch.tensor([0.5, -0.2, 0.6]), ["executor"] * 3,
                   offline=torch.tensor([False, False, True]), accuracy=torch.tensor([0.0, 0.0, 0.5]))


def test_the_policy_loss_by_hand():
    alg = _alg()
    p = torch.tensor([[0.5, 0.25], [0.8, 0.3], [0.9, 0.1]])
    logp = torch.log(p).requires_grad_()
    old = torch.log(torch.tensor([[0.25, 0.25], [0.4, 0.3], [0.5, 0.5]]))  # rollout ratios 2, 1 and 2
    loss, stats, weights = luffy_loss(_tiny_part(), logp, old, Agg("token-mean"), alg.luffy, alg.rl)
    # rollouts, unclipped: −A·r = −0.5·2, −0.5·1; −(−0.2)·2. The demonstration: −0.6·p/(p + 0.1) = −0.54, −0.3
    assert loss.item() == pytest.approx((-1.0 - 0.5 + 0.4 - 0.54 - 0.3) / 5, abs=1e-6)
    loss.backward()
    # d/dlog p: −A·r on rollouts; −A·γp/(p + γ)² on the demonstration (0.09 and 0.25); each over 5 tokens
    want = torch.tensor([[-1.0, -0.5], [0.4, 0.0], [-0.6 * 0.09, -0.6 * 0.25]]) / 5
    assert torch.allclose(logp.grad, want, atol=1e-6)
    assert stats["ratio_mean"] == pytest.approx(5 / 3) and stats["clip_frac"] == 0.0
    assert stats["luffy/shaped_ratio_mean"] == pytest.approx(0.7)
    assert [weights[k].item() for k in ("ratio_mean", "luffy/shaped_ratio_mean")] == [3.0, 2.0]


def test_clip_rollouts_clips_the_rollouts_and_never_the_demonstration():
    alg = _alg("algorithm.luffy.clip_rollouts=true")
    logp = torch.log(torch.tensor([[0.5, 0.25], [0.8, 0.3], [0.9, 0.1]])).requires_grad_()
    old = torch.log(torch.tensor([[0.25, 0.25], [0.4, 0.3], [0.5, 0.5]]))
    loss, stats, _ = luffy_loss(_tiny_part(), logp, old, Agg("token-mean"), alg.luffy, alg.rl)
    loss.backward()
    hi = 1 + alg.rl.clip_high
    # row 0's first token (A > 0, r 2 > 1 + clip_high) and row 1's (A < 0, r 2: the unclipped −A·r is larger, kept)
    assert loss.item() == pytest.approx((-0.5 * hi - 0.5 + 0.4 - 0.54 - 0.3) / 5, abs=1e-6)
    want = torch.tensor([[0.0, -0.5], [0.4, 0.0], [-0.6 * 0.09, -0.6 * 0.25]]) / 5
    assert torch.allclose(logp.grad, want, atol=1e-6)
    assert stats["clip_frac"] == pytest.approx(1 / 3)


@pytest.mark.parametrize("clip", ["false", "true"])
def test_the_update_is_luffys_loss_whole_or_cut(base_dir, clip):
    model = random_lora(base_dir)
    alg = _alg(f"algorithm.luffy.clip_rollouts={clip}")
    batch = ragged_rl_batch(offline=True)
    old = batch.sampler_lp  # ratios well away from 1, so that the clip matters

    def update(budget: int = 0):
        terms = red_grpo_loss(model, batch, old, None, alg, RedState(), 0.4, step=0,
                              memory=MemoryConfig(micro_batch_tokens=budget, logits_chunk_mib=0.004))
        grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
        model.zero_grad(set_to_none=True)
        return terms, grads

    terms, g = update()
    logp, ent = forward_logprobs(model, batch.ids, batch.attn, with_entropy=True, temperature=alg.rl.temperature,
                                 need=batch.mask > 0, entropy_grad=True)  # LUFFY's entropy bonus 0.001
    pg, stats, _ = luffy_loss(batch, logp, old, Agg("token-mean"), alg.luffy, alg.rl)
    h_rl = (ent * batch.mask * (~batch.offline)[:, None]).sum() / (batch.mask * (~batch.offline)[:, None]).sum()
    (pg - alg.rl.entropy_coef * h_rl).backward()
    want = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    model.zero_grad(set_to_none=True)
    for n in g:
        assert_close(g[n], want[n])
    assert terms.stats["actor/pg_loss"] == pytest.approx(pg.item(), rel=1e-5)
    assert terms.stats["luffy/shaped_ratio_mean"] == pytest.approx(stats["luffy/shaped_ratio_mean"], rel=1e-5)
    assert (terms.stats["actor/clip_frac"] > 0) == (clip == "true")
    cut, g_cut = update(budget=60)  # episode 0 split across pieces
    for n in g:
        assert_close(g_cut[n], g[n])
    assert cut.stats["actor/pg_loss"] == pytest.approx(terms.stats["actor/pg_loss"], rel=1e-5)


def test_luffy_is_a_method_from_its_file_and_config_alone():
    alg = _alg()
    assert METHODS["luffy"].trainer == RL_TRAINER and not METHODS["luffy"].in_study
    assert alg.luffy.enabled and alg.luffy.shape == 0.1 and alg.rl.adv_scaling == "none" and not alg.red_paper.offline
    assert [type(v) for v in active_variants(alg, RewardSpec(), {"q1": object()})] == [Guidance]
    assert isinstance(piece_loss(alg, experts=False), LuffyPiece)
    with pytest.raises(StageError, match="traces hold none"):  # at its first step: the trainer fills them later
        active_variants(alg, RewardSpec(), {})[0].regroup(None)
    assert not load_run_config(algorithm="grpo").algorithm.luffy.enabled
    with pytest.raises(ConfigError, match="luffy.enabled=true"):
        load_run_config(algorithm="grpo", overrides=["algorithm.luffy.enabled=true"])
    with pytest.raises(ConfigError, match="tis_cap"):
        _alg("algorithm.rl.tis_cap=2")
    with pytest.raises(ConfigError, match="per-token advantages"):
        load_run_config(algorithm="luffy", overrides=["reward.process.source=verifier"])
    with pytest.raises(ConfigError, match="below its minimum"):
        _alg("algorithm.luffy.shape=0")


def test_the_loop_and_the_update_name_no_method():
    """The loop and the update reach every method through method_variants.py: none of the registry's
    names is in them (red, grpo and sft name the terms of L itself, which every method has)."""
    for path in ("utils/train/grpo_trainer.py", "utils/train/update.py"):
        text = (ROOT / path).read_text()
        named = [m for m in METHODS if m not in ("red", "grpo", "sft") and re.search(rf"\b{m}\b", text)]
        assert not named, f"{path} names {named}"


@pytest.mark.parametrize("mf", method_files(), ids=lambda mf: mf.name)
def test_a_method_file_is_the_only_code_that_names_its_method(mf):
    """A method in one file is its file, its config and its test: no other module of the config and
    training layers, nor a numbered script, names it (08's side reads its logged metrics by their
    names, e.g. utils/eval/compute.py)."""
    code = [*(ROOT / "utils" / "core").rglob("*.py"), *(ROOT / "utils" / "train").rglob("*.py"), *ROOT.glob("[0-9]*.py")]
    naming = {str(p.relative_to(ROOT)) for p in code if re.search(rf"\b{mf.name}\b", p.read_text())}
    assert naming == {mf.path}
    assert {f.name for f in method_files()} >= {"hpt", "luffy", "relift"}


def _write(root, text: str):
    folder = root / "utils" / "train" / "methods"
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "toy.py").write_text(text)
    method_files.cache_clear()
    try:
        return method_files(root)
    finally:
        method_files.cache_clear()


@pytest.mark.parametrize("text,error", [
    ("METHOD = {'summary': 's'}\n", "declares SETTINGS"),
    ("SETTINGS = {'enabled': (False, 'h')}\n", "declares METHOD"),
    ("SETTINGS = {'enabled': (True, 'h')}\nMETHOD = {'summary': 's'}\n", "toy.py:1: SETTINGS must be"),
    ("SETTINGS = {'enabled': (False, 'h'), 'x': ([1], 'h')}\nMETHOD = {'summary': 's'}\n", r"SETTINGS\['x'\]"),
    ("SETTINGS = {'enabled': (False, 'h'), 'x': (1, 'h', {'lowest': 0})}\nMETHOD = {'summary': 's'}\n",
     r"SETTINGS\['x'\]"),
    ("SETTINGS = {'enabled': (False, 'h')}\nMETHOD = {'summary': 's', 'trainer': '05'}\n", "toy.py:2: METHOD must"),
    ("X = 1\nSETTINGS = {'enabled': (False, str(X))}\nMETHOD = {'summary': 's'}\n", "toy.py:2: SETTINGS must be a literal"),
    ("SETTINGS = {'enabled': (False, 'h')}\nMETHOD = {'summary': 's', 'needs': 'red'}\n", "toy.py:2: METHOD's in_study"),
    ("SETTINGS = {'enabled': (False, 'h')}\nMETHOD = {'summary': 's', 'in_study': 1}\n", "toy.py:2: METHOD's in_study"),
])
def test_a_method_files_declarations_are_checked_naming_the_file_and_line(tmp_path, text, error):
    with pytest.raises(ValueError, match=error):
        _write(tmp_path, text)


def test_a_method_file_named_like_a_built_in_is_refused(tmp_path):
    """A file named like a built-in method or section would shadow it: the registry and the schema
    refuse it at import, naming the file (checked in a copy of the library, as a new file would be)."""
    import shutil
    import subprocess
    import sys

    for part in ("utils", "configs"):
        shutil.copytree(ROOT / part, tmp_path / part, ignore=shutil.ignore_patterns("__pycache__"))
    methods = tmp_path / "utils" / "train" / "methods"
    for clash, module, error in (("grpo", "utils.core.methods", "method 'grpo' is already registered"),
                                 ("rl", "utils.core.algorithm_schema", "cannot be named like the built-in")):
        (methods / f"{clash}.py").write_text("SETTINGS = {'enabled': (False, 'h')}\nMETHOD = {'summary': 's'}\n")
        run = subprocess.run([sys.executable, "-c", f"import {module}"], cwd=tmp_path, capture_output=True, text=True)
        (methods / f"{clash}.py").unlink()
        assert run.returncode != 0 and error in run.stderr and f"utils/train/methods/{clash}.py" in run.stderr, run.stderr


def test_a_method_files_settings_become_its_typed_section(tmp_path):
    (mf,) = _write(tmp_path, "SETTINGS = {'enabled': (False, 'on'), 'k': (3, 'k', {'minimum': 1}), "
                             "'mode': ('a', 'm', {'choices': ('a', 'b')})}\nMETHOD = {'summary': 's', 'needs': ('red',)}\n")
    assert mf.name == "toy" and mf.method["needs"] == ("red",) and mf.method["demonstrations"] is False
    assert mf.settings["k"] == (3, "k", {"minimum": 1})


def test_the_trainer_trains_demonstrations_in_their_groups(hf_engine, protocol_adapter, tmp_path, base_dir):
    """Every question has its gold trace: it takes its group's last place; there is no SFT term."""
    trainer, before = demo_trainer("luffy", hf_engine, protocol_adapter, tmp_path, base_dir)
    steps = trainer.train()
    for m in steps:
        assert m["luffy/demo_groups"] == 4  # a demonstration in each of the step's four groups
        assert 0 < m["luffy/shaped_ratio_mean"] < 1 and "actor/sft_loss" not in m
        assert math.isfinite(m["actor/loss"]) and m["train/skipped_nonfinite"] == 0
    after = dict(trainer.model.named_parameters())
    assert any(not torch.equal(before[n], after[n]) for n in before)

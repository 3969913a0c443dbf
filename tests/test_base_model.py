"""The committed tiny-arith base: intact, reproducible, loadable by transformers, peft and vLLM, and
a real base model (it knows held-out arithmetic that a random init does not)."""
import pytest
import torch

from utils.tinyarith.build import DEFAULT_RECIPE, build
from utils.core.config import from_dict, read_yaml
from utils.tinyarith.build import verify_base
from utils.core.manifest import read_manifest
from utils.tinyarith.model import (BOS_ID, PretrainConfig, chain_prompts, char_vocab, greedy_accuracy, heldout_prompts,
                              llama_config)


def _recipe() -> PretrainConfig:
    return from_dict(PretrainConfig, read_yaml(DEFAULT_RECIPE), str(DEFAULT_RECIPE))


# recipe fields added after the committed base was built; at these values the corpus is the one it
# was built on (test_default_corpus_is_the_committed_bases)
ADDED_SINCE_BUILD = {"reduction_max_ops": 3}


def test_committed_files_match_their_manifest(base_dir):
    assert verify_base(base_dir) == []
    m = read_manifest(base_dir)
    assert {**ADDED_SINCE_BUILD, **m["recipe"]} == from_dict(PretrainConfig, read_yaml(DEFAULT_RECIPE), "recipe").__dict__


def test_default_corpus_is_the_committed_bases():
    """The first packed batch and a stretch of corpus text, pinned before the recipe gained fields:
    a new field at its default must not change what pretraining reads."""
    import hashlib
    import random

    from utils.data.arith import pretrain_text
    from utils.tinyarith.model import pack_batch

    cfg = _recipe()
    ids, _ = pack_batch(random.Random(0), cfg, char_vocab())
    assert hashlib.sha256(ids.numpy().astype("<i8").tobytes()).hexdigest() == \
        "4525d852e27387b144ae557e1ba93632102b7dad3961d2257af9b2df9a7801ee"
    text = pretrain_text(0, 2000, tuple(cfg.ops), cfg.bounds)
    assert hashlib.sha256(text.encode()).hexdigest() == "9675b439fd2ae1a65e3e783e8d8ee101680675a8c0117b9a6ddebe9cd9fe25db"


def test_batches_drawn_ahead_are_the_recipes_stream():
    from utils.tinyarith.model import batches

    cfg = from_dict(PretrainConfig, {**read_yaml(DEFAULT_RECIPE), "steps": 4, "batch_size": 4}, "recipe")
    inline, ahead = list(batches(cfg)), list(batches(cfg, ahead=True))  # ahead: the GPU build's path
    assert len(inline) == len(ahead) == 4
    for (ids, labels), (ids2, labels2) in zip(inline, ahead):
        assert torch.equal(ids, ids2) and torch.equal(labels, labels2)


def test_longer_reductions_reach_their_bound():
    from utils.data.arith import pretrain_text

    cfg = _recipe()
    worked = lambda text: [line.count(": ") for line in text.splitlines() if ": " in line and line[0].isdigit()]  # noqa: E731
    short = worked(pretrain_text(0, 3000, tuple(cfg.ops), cfg.bounds))
    long = worked(pretrain_text(0, 3000, tuple(cfg.ops), cfg.bounds, max_ops=6))
    assert max(short) == 3 and max(long) == 6  # one "expr: op=value" clause per operation


def test_base_knows_heldout_arithmetic_and_random_init_does_not(base_dir, hf_base):
    from transformers import LlamaForCausalLM

    cfg = _recipe()
    items = heldout_prompts(cfg, cfg.eval_size, seed=cfg.seed + 2)  # the manifest's evaluation set
    acc = greedy_accuracy(hf_base, items)
    # the recorded figure reproduces, to one item: the weights are checked bit for bit above, but a
    # greedy near-tie may fall the other way under another CPU's kernels (it was recorded on one box)
    assert acc == pytest.approx(read_manifest(base_dir)["metrics"]["heldout_acc"], abs=1.01 / cfg.eval_size)
    assert acc >= 0.5, f"base completes only {acc:.0%} of held-out facts"
    torch.manual_seed(123)
    random_acc = greedy_accuracy(LlamaForCausalLM(llama_config(cfg)), items)
    assert random_acc < 0.05 and acc > random_acc + 0.45
    sample = greedy_accuracy(hf_base, [("12+7=", "19")])
    assert sample in (0.0, 1.0)


def test_base_reduces_unseen_task_chains_as_recorded(base_dir, hf_base):
    cfg = _recipe()
    items = chain_prompts(cfg, cfg.eval_size, seed=cfg.seed + 2)  # task-side chains: never in pretraining
    acc = greedy_accuracy(hf_base, items)
    assert acc == pytest.approx(read_manifest(base_dir)["metrics"]["task_chain_reduction_acc"],
                                abs=1.01 / cfg.eval_size)  # one item either way, as above
    assert acc >= 0.9, f"base reduces only {acc:.0%} of unseen chains"


def test_base_does_not_know_the_agent_protocol(hf_base):
    vocab = char_vocab()
    inv = {i: c for c, i in vocab.items()}
    ids = torch.tensor([[BOS_ID] + [vocab[c] for c in "plan: 12+7-3\n"]])
    out = hf_base.generate(input_ids=ids, max_new_tokens=12, do_sample=False, pad_token_id=0)
    text = "".join(inv[int(t)] for t in out[0, ids.shape[1]:])
    assert "<task>" not in text and "<answer>" not in text


def test_recipe_is_reproducible(tmp_path):
    overrides = {"steps": 6, "eval_size": 8, "batch_size": 8}
    a = build(DEFAULT_RECIPE, tmp_path / "a", overrides)
    b = build(DEFAULT_RECIPE, tmp_path / "b", overrides)
    assert a["files"]["model.safetensors"] == b["files"]["model.safetensors"]
    assert a["recipe_sha256"] == b["recipe_sha256"]
    assert not (tmp_path / "a.partial").exists()


def test_build_cli_records_its_overrides_and_device(tmp_path):
    from utils.tinyarith.build import main

    out = tmp_path / "variant"
    assert main(["--out", str(out), "--steps", "2", "--set", "seq_len=200", "--set", "reduction_max_ops=6",
                 "--set", "eval_size=4", "--device", "cpu"]) == 0
    m = read_manifest(out)
    assert (m["recipe"]["seq_len"], m["recipe"]["reduction_max_ops"], m["recipe"]["steps"]) == (200, 6, 2)
    assert m["device"] == "cpu" and verify_base(out) == []
    with pytest.raises(SystemExit, match="override 'seq_len': expected key=value"):
        main(["--out", str(tmp_path / "bad"), "--set", "seq_len"])
    with pytest.raises(SystemExit, match="unknown key 'seq_length'"):
        main(["--out", str(tmp_path / "bad"), "--steps", "1", "--set", "seq_length=200"])
    assert not (tmp_path / "bad").exists()


def test_peft_wraps_the_base(hf_base):
    import copy

    from peft import LoraConfig, get_peft_model

    model = get_peft_model(copy.deepcopy(hf_base), LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"]))
    trainable = [n for n, p in model.named_parameters() if p.requires_grad]
    assert trainable and all("lora_" in n for n in trainable)
    ids = torch.tensor([[BOS_ID, 22, 23, 16, 28, 34]])
    with torch.no_grad():  # LoRA B starts at zero, so the wrapped model equals the base
        torch.testing.assert_close(model(input_ids=ids).logits, hf_base(input_ids=ids).logits)


def test_candidate_r6_base_is_intact_and_knows_arithmetic():
    """artifacts/tiny-arith-r6 (built on a GPU by configs/pretrain/tiny-arith-r6.yaml): not the default,
    but committed so a study can use it (--set model.path=artifacts/tiny-arith-r6); checked like the default."""
    from transformers import LlamaForCausalLM

    from utils.core.config import ROOT

    base, recipe = ROOT / "artifacts" / "tiny-arith-r6", ROOT / "configs" / "pretrain" / "tiny-arith-r6.yaml"
    assert verify_base(base) == []
    m = read_manifest(base)
    cfg = from_dict(PretrainConfig, read_yaml(recipe), str(recipe))
    assert m["recipe"] == cfg.__dict__ and (cfg.seq_len, cfg.reduction_max_ops) == (384, 6)
    model = LlamaForCausalLM.from_pretrained(base)
    facts = greedy_accuracy(model, heldout_prompts(cfg, 100, seed=cfg.seed + 2))
    chains = greedy_accuracy(model, chain_prompts(cfg, 100, seed=cfg.seed + 2))
    assert facts >= 0.9 and chains >= 0.9, (facts, chains)  # the manifest: 0.997 and 1.000 on 300 items

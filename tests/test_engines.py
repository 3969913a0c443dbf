"""vLLM (CPU build) and transformers engines: identical greedy rollouts, matching log-probs, and
policy updates that really reach the vLLM sampler."""
import pytest
import torch
from transformers import AutoTokenizer

from utils.agent.rollout import Codec, Rollout, RolloutSpec
from utils.core.schema import TemplatesConfig
from helpers import arith_rows, greedy_episodes, peft_logprobs

LOGPROB_TOL = 1e-4  # fp32 on CPU (measured agreement: docs/ARCHITECTURE.md "Engines")


@pytest.mark.parametrize("which", ["base", "random_adapter", "protocol_adapter"])
def test_greedy_rollouts_identical_across_engines(which, any_vllm, hf_engine, adapters, protocol_adapter, base_dir):
    """Also checks that a policy change reaches prompts vLLM has cached: the same rows run under
    each adapter in turn, so a stale prefix cache (merged serving) would diverge from HF."""
    vllm_engine = any_vllm
    path = {"base": None, "random_adapter": adapters[0], "protocol_adapter": protocol_adapter}[which]
    tok = AutoTokenizer.from_pretrained(base_dir)
    vllm_engine.set_adapter(path)
    hf_engine.set_adapter(path)
    rows = arith_rows()
    v_eps, h_eps = greedy_episodes(vllm_engine, tok, rows), greedy_episodes(hf_engine, tok, rows)
    worst = 0.0
    for v, h in zip(v_eps, h_eps):
        assert (v.status, v.final_answer) == (h.status, h.final_answer)
        assert len(v.segments) == len(h.segments)
        for sv, sh in zip(v.segments, h.segments):
            assert (sv.role, sv.context_ids, sv.gen_ids, sv.text) == (sh.role, sh.context_ids, sh.gen_ids, sh.text)
            worst = max([worst] + [abs(a - b) for a, b in zip(sv.logprobs, sh.logprobs)])
    print(f"[{which}] worst |logprob(vllm) - logprob(hf)| = {worst:.2e}")
    assert worst < LOGPROB_TOL
    if which == "protocol_adapter":  # the SFT'd adapter runs real multi-turn episodes
        assert max(e.n_turns for e in v_eps) >= 2
        assert sum(e.status == "answered" for e in v_eps) >= len(rows) // 2


def test_greedy_without_logprobs_decodes_the_same_tokens(any_vllm, protocol_adapter, base_dir):
    """Evaluation asks for no sampler log-probs (greedy_eval): the episodes are the same token for
    token, their segments carry None, and their training sequences are the same ids and masks with
    no sampler log-probs (a step between two mismatch checks, algorithm.rl.mismatch_every)."""
    from utils.agent.episode import episode_sequences

    tok = AutoTokenizer.from_pretrained(base_dir)
    any_vllm.set_adapter(protocol_adapter)
    rows = arith_rows()
    with_lp = greedy_episodes(any_vllm, tok, rows)
    spec = RolloutSpec(max_turns=4, temperature=0.0, logprobs=False)
    without = Rollout(any_vllm, Codec(tok, TemplatesConfig()), spec).run(rows, n=1, seed=0)
    view = lambda eps: [(e.status, e.final_answer, [(s.role, s.context_ids, s.gen_ids, s.text, s.finish_reason)  # noqa: E731
                                                    for s in e.segments]) for e in eps]
    assert view(without) == view(with_lp)
    assert all(len(s.logprobs) == len(s.gen_ids) for e in with_lp for s in e.segments)
    assert all(s.logprobs is None for e in without for s in e.segments)
    for a, b in zip(with_lp, without):  # the same training sequences, without the sampler's log-probs
        for x, y in zip(episode_sequences(a), episode_sequences(b)):
            assert (x.ids, x.mask) == (y.ids, y.mask) and len(x.logprobs) == len(x.ids) and y.logprobs is None


def test_rollout_logprobs_skip_their_token_text(vllm_merged, protocol_adapter, base_dir):
    """The agent rollout's requests keep their log-probs but vLLM no longer decodes each entry to text
    (`vllm_compat.skip_logprob_token_text`, an internal of the pinned vLLM: this fails if an upgrade moves it),
    and the sampled tokens and log-probs are those of the decoding path."""
    from vllm.inputs import TokensPrompt
    from vllm.sampling_params import RequestOutputKind

    from utils.agent.vllm_compat import skip_logprob_token_text
    from utils.agent.sampling import SamplingSpec

    tok = AutoTokenizer.from_pretrained(base_dir)
    vllm_merged.set_adapter(protocol_adapter)
    engine = vllm_merged.llm.llm_engine
    params = vllm_merged._params(SamplingSpec(max_tokens=6), seed=3)
    params.output_kind = RequestOutputKind.FINAL_ONLY
    internal = engine.add_request("probe-skip", TokensPrompt(prompt_token_ids=tok.encode("plan: 1+2\n")), params)
    assert skip_logprob_token_text(engine, internal)
    outs = []
    while engine.has_unfinished_requests():
        outs += [o for o in engine.step() if o.finished]
    (out,) = outs
    lps = out.outputs[0].logprobs
    assert len(lps.logprobs) == len(out.outputs[0].token_ids) > 0
    assert set(lps.decoded_tokens) == {None}

    rows = arith_rows(8)
    spec = RolloutSpec(max_turns=4, temperature=1.0)
    runs = {}
    for fast in (False, True):
        vllm_merged.fast_logprobs = fast
        vllm_merged.set_adapter(protocol_adapter)  # a fresh prefix cache for each run
        eps = Rollout(vllm_merged, Codec(tok, TemplatesConfig()), spec).run(rows, n=2, seed=5, step=1)
        runs[fast] = [(s.gen_ids, s.logprobs) for e in eps for s in e.segments]
    vllm_merged.fast_logprobs = True
    assert [g for g, _ in runs[True]] == [g for g, _ in runs[False]]
    assert runs[True] == runs[False]


def test_adapter_update_reaches_the_vllm_sampler(vllm_engine, adapters, base_dir):
    """After set_adapter, vLLM scores a fixed continuation exactly as transformers+peft does with the
    new adapter, and differently from the old one; the old adapter is released."""
    tok = AutoTokenizer.from_pretrained(base_dir)
    ids = tok.encode("plan: 12+7-3\n<think>12+7-3</think><task>12+7</task>")
    start = len(tok.encode("plan: 12+7-3\n"))
    a, b = adapters
    vllm_engine.set_adapter(a)
    lp_a = vllm_engine.prompt_logprobs(ids, start)
    id_a = vllm_engine.lora.lora_int_id
    vllm_engine.set_adapter(b)
    lp_b = vllm_engine.prompt_logprobs(ids, start)
    ref_a, ref_b = peft_logprobs(base_dir, a, ids, start), peft_logprobs(base_dir, b, ids, start)
    assert max(abs(x - y) for x, y in zip(lp_a, ref_a)) < LOGPROB_TOL
    assert max(abs(x - y) for x, y in zip(lp_b, ref_b)) < LOGPROB_TOL
    assert max(abs(x - y) for x, y in zip(lp_a, lp_b)) > 1e-2  # a stale sampler would fail here
    assert id_a not in vllm_engine.loaded_adapters()
    vllm_engine.set_adapter(None)
    lp_base = vllm_engine.prompt_logprobs(ids, start)
    assert max(abs(x - y) for x, y in zip(lp_base, peft_logprobs(base_dir, None, ids, start))) < LOGPROB_TOL


def test_merged_serving_follows_each_adapter_and_restores_the_base(vllm_merged, adapters, base_dir):
    """Merged serving: vLLM scores a continuation as transformers+peft does with each adapter in turn,
    and after set_adapter(None) exactly as it did on the base before any adapter."""
    tok = AutoTokenizer.from_pretrained(base_dir)
    ids = tok.encode("plan: 31-4+9\n<think>31-4+9</think><task>31-4</task>")
    start = len(tok.encode("plan: 31-4+9\n"))
    vllm_merged.set_adapter(None)
    lp_base = vllm_merged.prompt_logprobs(ids, start)
    a, b = adapters
    for adapter in (a, b, a):
        vllm_merged.set_adapter(adapter)
        lp = vllm_merged.prompt_logprobs(ids, start)
        assert max(abs(x - y) for x, y in zip(lp, peft_logprobs(base_dir, adapter, ids, start))) < LOGPROB_TOL
        assert max(abs(x - y) for x, y in zip(lp, lp_base)) > 1e-2  # the adapter really changed the weights
    vllm_merged.set_adapter(None)
    assert vllm_merged.prompt_logprobs(ids, start) == lp_base


def test_merged_serving_refuses_what_it_cannot_merge(vllm_merged, adapters, tmp_path):
    import json
    import shutil

    bad = tmp_path / "dora"
    shutil.copytree(adapters[0], bad)
    cfg = json.loads((bad / "adapter_config.json").read_text())
    (bad / "adapter_config.json").write_text(json.dumps({**cfg, "use_dora": True}))
    with pytest.raises(ValueError, match="use_dora cannot be served merged"):
        vllm_merged.set_adapter(bad)
    with pytest.raises(ValueError, match="no adapter_config.json"):
        vllm_merged.set_adapter(tmp_path)


def test_sampling_is_seeded_per_request(vllm_engine, base_dir):
    from utils.agent.sampling import SamplingSpec

    tok = AutoTokenizer.from_pretrained(base_dir)
    vllm_engine.set_adapter(None)
    prompt = tok.encode("12+7=")
    spec = SamplingSpec(max_tokens=12, temperature=1.0, n=3)
    one = vllm_engine.generate([prompt, prompt], spec, [5, 6])
    two = vllm_engine.generate([prompt], spec, [5])
    assert [s.token_ids for s in one[0]] == [s.token_ids for s in two[0]]  # same seed, same samples
    assert [s.token_ids for s in one[0]] != [s.token_ids for s in one[1]]  # another seed differs


def test_a_large_seeded_batch_samples_on_cpu(vllm_engine, base_dir):
    """More prompt tokens than vLLM's default per-step budget: without a budget that fits every
    sequence whole, vLLM chunks a seeded prefill and its CPU sampler crashes ("CPU Generator does
    not use offset"); this is the shape of a 100-question x 8-sample validation probe."""
    from utils.agent.sampling import SamplingSpec

    tok = AutoTokenizer.from_pretrained(base_dir)
    vllm_engine.set_adapter(None)
    prompts = [tok.encode(f"compute: {a}+{a % 50}-{a % 7}+{a % 11}-{a % 13}+{a % 17}\n" * 2) for a in range(400)]
    assert sum(map(len, prompts)) * 2 > 16384  # well past vLLM's default budget on CPU
    out = vllm_engine.generate(prompts, SamplingSpec(max_tokens=4, temperature=1.0, n=2), list(range(400)))
    assert len(out) == 400 and all(len(o) == 2 and 1 <= len(o[0].token_ids) <= 4 for o in out)


def test_unknown_engine_name_lists_valid_ones(base_dir):
    from utils.agent.engines import make_engine
    from utils.core.schema import EngineConfig

    with pytest.raises(KeyError, match="valid: hf, openai, vllm"):
        make_engine("tgi", base_dir, EngineConfig())


def test_hf_engine_switches_between_adapters_and_the_base(hf_engine, adapters, base_dir):
    from utils.agent.sampling import SamplingSpec

    prompt = AutoTokenizer.from_pretrained(base_dir).encode("plan: 12+7-3\n")
    spec = SamplingSpec(max_tokens=8, temperature=0.0)

    def greedy(path):
        hf_engine.set_adapter(path)
        s = hf_engine.generate([prompt], spec, [0])[0][0]
        return s.token_ids, s.logprobs

    base, a, base_again, b, a_again = (greedy(p) for p in (None, adapters[0], None, adapters[1], adapters[0]))
    assert base_again == base and a_again == a
    assert a[1] != base[1] and b[1] != a[1]


HF_MEMORY = """
import json, resource, shutil, sys
from pathlib import Path
import torch
from transformers import AutoConfig, AutoModelForCausalLM
from utils.agent.engines import HFEngine
from utils.agent.sampling import SamplingSpec
from utils.core.schema import EngineConfig
V, B, T, where = 250_000, 8, 64, Path(sys.argv[1])
torch.manual_seed(0)
cfg = AutoConfig.for_model("llama", hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2,
                           num_key_value_heads=1, vocab_size=V, max_position_embeddings=256, bos_token_id=1,
                           eos_token_id=2, pad_token_id=0, tie_word_embeddings=True)
AutoModelForCausalLM.from_config(cfg).save_pretrained(where)
for f in Path("artifacts/tiny-arith").glob("*token*"):
    shutil.copy(f, where / f.name)
engine = HFEngine(where, EngineConfig(name="hf", dtype="float32", hf_batch_size=B))
prompts = [[5, 6, 7, 8]] * B
engine.generate(prompts, SamplingSpec(2, temperature=0.7), [0])  # caches and workspaces, before the baseline
before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
out = engine.generate(prompts, SamplingSpec(T, temperature=0.7), [1])
grew = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) * 1024
s = out[0][0]
ids = torch.tensor([prompts[0] + s.token_ids])
with torch.no_grad():
    logits = engine.base(input_ids=ids).logits[0, len(prompts[0]) - 1:-1].float() / 0.7
want = torch.log_softmax(logits, -1).gather(1, ids[0, len(prompts[0]):, None])[:, 0]
print(json.dumps({"grew": grew, "kept": B * T * V * 4, "n": len(s.token_ids),
                  "diff": (torch.tensor(s.logprobs) - want).abs().max().item()}))
"""


def test_the_hf_engine_keeps_no_vocabulary_sized_logits_per_step(tmp_path):
    """Sampling 8 x 64 tokens over 250,000 entries: the process's peak grows by far less than every
    step's fp32 logits (488 MiB, which `output_logits` kept; 481 MiB measured before the fix), and
    each sampled token's log-prob is the tempered one a teacher-forced forward gives."""
    import json
    import os
    import subprocess
    import sys

    from utils.core.config import ROOT

    proc = subprocess.run([sys.executable, "-c", HF_MEMORY, str(tmp_path / "m")], cwd=ROOT, capture_output=True,
                          text=True, timeout=300, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert proc.returncode == 0, proc.stderr[-3000:]
    r = json.loads(proc.stdout.strip().splitlines()[-1])
    assert r["n"] == 64 and r["diff"] < LOGPROB_TOL, r
    assert r["grew"] < r["kept"] / 8, r


NUMBA_FIRST = """
import sys
import bm25s  # the search tool's retriever; it imports numba, and numba llvmlite
from utils.agent.engines import VLLMEngine
from utils.agent.sampling import SamplingSpec
from utils.core.schema import EngineConfig
ffi = sys.modules["llvmlite.binding.ffi"]
engine = VLLMEngine(sys.argv[1], EngineConfig(in_process=True, kv_cache_gb=0.25, max_num_seqs=4), seed=0)
ids = engine.tokenizer("12+3=", add_special_tokens=False)["input_ids"]
out = engine.generate([ids], SamplingSpec(max_tokens=4, temperature=0.0, stop=[]), seeds=[0])
print("generated", len(out[0][0].token_ids), sys.modules["llvmlite.binding.ffi"] is ffi)
"""


def test_an_in_process_engine_starts_after_numba_is_imported(base_dir):
    """vLLM's CPU worker scans every imported module's objects as it starts; llvmlite's library wrapper
    (numba's, so bm25s's) broke that scan, and with it an in-process engine in any process that had
    loaded the search tool's retriever first. The engine hides such modules while it starts."""
    import subprocess
    import sys

    from utils.core.config import ROOT

    proc = subprocess.run([sys.executable, "-c", NUMBA_FIRST, str(base_dir)], cwd=ROOT, capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.split()[-3:] == ["generated", "4", "True"], proc.stdout[-2000:]


_KEEP: list = []  # in-process engines live until the session ends


def test_an_in_process_engine_leaves_its_process_as_it_was(vllm_engine, base_dir):
    """model.engine.in_process: vLLM's engine core and worker run in the caller's process. Its CPU
    worker reseeds the global generators, replaces torch.set_num_threads with a no-op and freezes
    vLLM's environment; the engine must put all of that back, and sample what the spawned engine
    core samples, token for token, at temperature 1 with the same seeds."""
    import os
    import random

    import numpy as np

    from utils.agent.engines import VLLMEngine
    from utils.agent.vllm_compat import MULTIPROCESSING_ENV
    from utils.agent.sampling import SamplingSpec
    from utils.core.schema import EngineConfig

    torch.manual_seed(11)
    np.random.seed(11)
    random.seed(11)
    expected = (torch.rand(3), np.random.rand(3), random.random())
    torch.manual_seed(11)
    np.random.seed(11)
    random.seed(11)
    threads, set_threads, env = torch.get_num_threads(), torch.set_num_threads, os.environ.get(MULTIPROCESSING_ENV)
    engine = VLLMEngine(base_dir, EngineConfig(in_process=True, kv_cache_gb=0.25, max_num_seqs=16), seed=0)
    _KEEP.append(engine)  # never closed mid-session: closing tears down vLLM's process-wide parallel groups
    assert torch.equal(torch.rand(3), expected[0]) and np.array_equal(np.random.rand(3), expected[1])
    assert random.random() == expected[2]
    assert torch.get_num_threads() == threads and torch.set_num_threads is set_threads
    assert os.environ.get(MULTIPROCESSING_ENV) == env
    assert type(engine.llm.llm_engine.engine_core).__name__ == "InprocClient"
    assert type(vllm_engine.llm.llm_engine.engine_core).__name__ != "InprocClient"
    tok = AutoTokenizer.from_pretrained(base_dir)
    vllm_engine.set_adapter(None)
    prompts = [tok.encode(f"{a}+{a % 9}=") for a in range(10, 30)]
    spec = SamplingSpec(max_tokens=10, temperature=1.0, n=2)
    seeds = list(range(20))
    here, spawned = engine.generate(prompts, spec, seeds), vllm_engine.generate(prompts, spec, seeds)
    assert [[s.token_ids for s in o] for o in here] == [[s.token_ids for s in o] for o in spawned]
    worst = max(abs(a - b) for o, p in zip(here, spawned) for s, t in zip(o, p)
                for a, b in zip(s.logprobs, t.logprobs))
    assert worst < 1e-4


def test_a_negative_kv_cache_size_is_refused(base_dir):
    from utils.agent.engines import VLLMEngine
    from utils.core.schema import EngineConfig

    with pytest.raises(ValueError, match="kv_cache_gb: -1.0 is negative"):
        VLLMEngine(base_dir, EngineConfig(kv_cache_gb=-1.0))

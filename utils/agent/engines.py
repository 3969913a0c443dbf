"""Sampling engines: one interface (utils/agent/sampling.py), three registered implementations
(docs/ARCHITECTURE.md, "Engines"); the third, `openai`, runs against a served endpoint
(utils/agent/served.py).

- `vllm`: offline `vllm.LLM`; the policy's LoRA adapter is served through `LoRARequest` (each
  `set_adapter` registers the new directory under a fresh integer id and releases the old one), or
  with `lora_serving: merged` folded into the base weights, which are reloaded in place.
- `hf`: transformers `generate` with KV cache and left padding; the reference and the fallback.

Both take prompts as token ids (the rollout owns the exact contexts) and return, per prompt and
sample, a `Sample`: generated ids, text, the sampler's per-token log-probs of the distribution it
sampled from (after temperature: vLLM's `processed_logprobs`; greedy decoding reports the
untempered distribution), and the finish reason ("stop" on a stop string or EOS,
"length" on the token budget). Generation stops right after the first stop string; the stop
string is part of the output.

Seeding: vLLM takes a seed per request, so each sample's randomness derives from
(seed, step, index) alone. HF generate samples a whole batch from torch's global generator,
seeded once per call: repeatable for the same batch, but not per-request like vLLM. Greedy
decoding is identical in both (tests/test_engines.py).
"""
from __future__ import annotations

import logging
import os
from pathlib import Path

from utils.agent.merge import MergedWeights, head_conflict, tied_head, weight_files
from utils.agent.sampling import BatchedCalls, Engine, Sample, SamplingSpec, truncate_at_stop
from utils.agent.served import OpenAIEngine
from utils.agent.vllm_compat import in_process, skip_logprob_token_text
from utils.core.heap import release_freed_memory
from utils.core.models import check_remote_code, load_causal_lm, load_tokenizer
from utils.core.schema import EngineConfig
from utils.core.tensors import pad
from utils.core.registry import Registry


class _SampledLogprobs:
    """A logits processor for `generate` that keeps the log-probs of the sampled tokens, and nothing
    vocabulary-sized beyond the step at hand: at each step it holds log_softmax(scores / `scale`)
    [B, V] of that step, and at the next it takes the value at the token just sampled (the last of
    `input_ids`); `finish` takes the last step's. `generate` runs processors given to it before its
    temperature and top-p warpers, so `scores` are the logits the sampler then divides by T.

    (`output_logits=True` would keep every step's fp32 logits instead: B x T x V x 4 bytes, 25 GB for
    64 Gemma-2 calls of 384 tokens, for the one value a step the sampler needs.)"""

    def __init__(self, scale: float):
        self.scale, self.last, self.taken = scale, None, []

    def __call__(self, input_ids, scores):
        import torch

        self._take(input_ids[:, -1])
        self.last = torch.log_softmax(scores.float() if self.scale == 1.0 else scores.float() / self.scale, dim=-1)
        return scores

    def _take(self, tokens) -> None:
        if self.last is not None:
            self.taken.append(self.last.gather(1, tokens[:, None])[:, 0])
            self.last = None

    def finish(self, sequences):
        """[B, T] log-probs of the T generated tokens ending `sequences`."""
        import torch

        self._take(sequences[:, -1])
        return torch.stack(self.taken, dim=1) if self.taken else sequences.new_zeros((len(sequences), 0), dtype=torch.float)


class HFEngine(BatchedCalls):
    """transformers generate, batched with left padding, optionally with a peft adapter; on the GPU
    where torch sees one (as vLLM picks its own device), else on the CPU."""

    name = "hf"

    def __init__(self, model_path: Path, cfg: EngineConfig, seed: int = 0,  # noqa: ARG002 - seeded per call
                 trust_remote_code: bool = False):
        import torch

        self.torch = torch
        self.tokenizer = load_tokenizer(model_path, trust_remote_code)
        self.device = "cuda" if torch.cuda.is_available() else "cpu"
        self.base = load_causal_lm(model_path, cfg.dtype, trust_remote_code).to(self.device).eval()
        self.peft = None  # a PeftModel once the first adapter is set; later adapters are swapped in
        self._adapter: str | None = None  # the adapter generate uses (None: the bare base)
        self._loaded: str | None = None  # the adapter peft holds
        self._next_id = 1
        self.pad_id = self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else 0
        self.eos_id = self.tokenizer.eos_token_id
        self.batch_size = cfg.hf_batch_size
        self._queue: list[tuple] = []

    def set_adapter(self, path: Path | None) -> None:
        from peft import PeftModel

        if path is None:  # the loaded adapter stays (peft needs one to disable) until the next is set
            self._adapter = None
            return
        old = self._loaded
        name = f"policy-{self._next_id}"
        self._next_id += 1
        if self.peft is None:
            self.peft = PeftModel.from_pretrained(self.base, str(path), adapter_name=name).eval()
        else:
            self.peft.load_adapter(str(path), adapter_name=name)
        self.peft.set_adapter(name)
        self._adapter = self._loaded = name
        if old is not None:
            self.peft.delete_adapter(old)

    def _generate(self, **kwargs):
        if self.peft is None:
            return self.base.generate(**kwargs)
        if self._adapter is None:
            with self.peft.disable_adapter():
                return self.peft.generate(**kwargs)
        return self.peft.generate(**kwargs)

    def _batch(self, prompts: list[list[int]], spec: SamplingSpec) -> list[Sample]:
        torch = self.torch
        ids, mask = (t.to(self.device) for t in pad(prompts, self.pad_id, torch.long, left=True))
        width = ids.shape[1]
        greedy = spec.temperature == 0
        from transformers import LogitsProcessorList

        # the sampled distribution: logits / T (greedy: untempered; top_p is 1 here)
        kept = _SampledLogprobs(1.0 if greedy else spec.temperature)
        with torch.no_grad():
            sequences = self._generate(
                input_ids=ids, attention_mask=mask, max_new_tokens=spec.max_tokens, do_sample=not greedy,
                temperature=None if greedy else spec.temperature, top_p=None if greedy else spec.top_p,
                top_k=None, pad_token_id=self.pad_id, eos_token_id=self.eos_id,
                logits_processor=LogitsProcessorList([kept]), stop_strings=spec.stop or None,
                tokenizer=self.tokenizer)
        gen = sequences[:, width:]
        logps = kept.finish(sequences)  # [B, T]
        assert logps.shape == gen.shape, (logps.shape, gen.shape)
        samples = []
        for i in range(len(prompts)):
            row = gen[i].tolist()
            keep, text, reason = truncate_at_stop(self.tokenizer, row, spec.stop, self.eos_id)
            lp = logps[i, :keep].tolist()
            samples.append(Sample(row[:keep], text, lp, reason))
        return samples

    def generate(self, prompts: list[list[int]], spec: SamplingSpec, seeds: list[int]) -> list[list[Sample]]:
        flat = [p for p in prompts for _ in range(spec.n)]
        self.torch.manual_seed(seeds[0] if seeds else 0)
        results: list[Sample] = []
        for start in range(0, len(flat), self.batch_size):
            results += self._batch(flat[start:start + self.batch_size], spec)
        return [results[i * spec.n:(i + 1) * spec.n] for i in range(len(prompts))]

    def close(self) -> None:
        pass


class _TiedHeadNotice(logging.Filter):
    """Drops vLLM's `ParallelLMHead: Failed to load weights` on a model whose head is tied to its
    embeddings (utils/agent/merge.py `tied_head`): the reload wrote the embeddings the head shares, and
    a LoRA that would make the head's copy stale is refused before (`head_conflict`). On an untied
    model the warning would mean a missing weight, and still reaches the console."""

    def filter(self, record: logging.LogRecord) -> bool:
        return record.getMessage() != "ParallelLMHead: Failed to load weights"


def _reload_in_worker(weights, tied: bool, worker) -> None:
    """Runs in vLLM's worker process (a pickled callable: plain collective_rpc arguments lose their
    tensor types on the way)."""
    if tied:
        log = logging.getLogger("vllm.model_executor.model_loader.reload.layerwise")
        if not any(isinstance(f, _TiedHeadNotice) for f in log.filters):
            log.addFilter(_TiedHeadNotice())
    worker.reload_weights(weights_iterator=iter(weights))


class VLLMEngine:
    """Offline vLLM; the policy's LoRA served as an adapter (a fresh LoRARequest id per
    `set_adapter`) or, with `lora_serving: merged`, folded into the base weights."""

    name = "vllm"

    def __init__(self, model_path: Path, cfg: EngineConfig, seed: int = 0, enable_lora: bool = True,
                 trust_remote_code: bool = False):
        os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")
        from vllm import LLM

        check_remote_code(model_path, trust_remote_code)

        kwargs = dict(model=str(model_path), dtype=cfg.dtype, max_model_len=cfg.max_model_len,
                      gpu_memory_utilization=cfg.memory_share, enforce_eager=cfg.enforce_eager, seed=seed,
                      max_num_seqs=cfg.max_num_seqs, logprobs_mode="processed_logprobs",
                      trust_remote_code=trust_remote_code)
        if not cuda_available():
            # vLLM's CPU sampler cannot rewind a seeded request's generator after a chunked prefill
            # ("CPU Generator does not use offset", a crash once a batch's prompts exceed the token
            # budget, e.g. 100 questions x 8 samples). A budget that fits every scheduled sequence
            # whole means no prefill is ever chunked.
            kwargs["max_num_batched_tokens"] = cfg.max_num_seqs * cfg.max_model_len
        self.merged = enable_lora and cfg.lora_serving == "merged"
        if self.merged:
            # set_adapter hands the new weights to vLLM's engine-core process (collective_rpc),
            # which vLLM pickles only when allowed: local IPC between this process and the
            # engine it started.
            os.environ.setdefault("VLLM_ALLOW_INSECURE_SERIALIZATION", "1")
        if enable_lora and not self.merged:
            kwargs.update(enable_lora=True, max_lora_rank=cfg.max_lora_rank, max_loras=cfg.max_loras)
        if cfg.enable_sleep_mode:
            kwargs["enable_sleep_mode"] = True  # GPU only; untested here
        if cfg.kv_cache_gb < 0:
            raise ValueError(f"model.engine.kv_cache_gb: {cfg.kv_cache_gb} is negative (0 lets vLLM size the cache)")
        if cfg.kv_cache_gb:
            kwargs["kv_cache_memory_bytes"] = int(cfg.kv_cache_gb * 2**30)
        with in_process(cfg.in_process):
            self.llm = LLM(**kwargs)
        release_freed_memory()  # what the start-up's profiling pass freed (utils/core/heap.py)
        self.tokenizer = self.llm.get_tokenizer()
        self.max_model_len = cfg.max_model_len
        self._next_id = 1
        self.lora = None
        self._pending: dict[str, object] = {}  # vLLM request id -> the caller's key
        self._next_request = 0
        self.model_path = model_path
        self.tied = self.merged and tied_head(model_path)  # read once: merged reloads check and quiet it
        self.fast_logprobs = True  # submit: no text for log-prob entries (vllm_compat.skip_logprob_token_text)

    def set_adapter(self, path: Path | None) -> None:
        if self.merged:
            self._set_merged(path)
            return
        from vllm.lora.request import LoRARequest

        old = self.lora
        if path is None:
            self.lora = None
        else:
            self.lora = LoRARequest(f"policy-{self._next_id}", self._next_id, str(path))
            self._next_id += 1
        if old is not None:
            self.llm.llm_engine.remove_lora(old.lora_int_id)

    def _set_merged(self, path: Path | None) -> None:
        """Reload every weight of vLLM's model in place (its `reload_weights`, which re-runs the
        kernel preparation a plain load would skip), the LoRA targets as W + scale·B·A, then drop
        the prefix cache: its KV blocks belong to the old weights."""
        import functools

        release_freed_memory()  # the trainer's freed activations, before the reload allocates (utils/core/heap.py)
        weights = MergedWeights(weight_files(self.model_path), path)
        conflict = head_conflict(weights.factors, self.tied)
        if conflict:
            raise ValueError(f"{path}: adapter targets {conflict}, but {self.model_path} ties its LM head to its "
                             f"embeddings, whose merged reload would leave the head's old copy in vLLM; set "
                             f"model.engine.lora_serving=adapter or leave it out of model.lora.target_modules")
        unknown = sorted(set(weights.factors) - weights.names())
        if unknown:
            raise ValueError(f"{path}: adapter targets {unknown[0]}, which {self.model_path} does not have")
        self.llm.collective_rpc(functools.partial(_reload_in_worker, weights, self.tied))
        self.llm.reset_prefix_cache()
        release_freed_memory()

    def loaded_adapters(self) -> set[int]:
        return set(self.llm.llm_engine.list_loras())

    def _params(self, spec: SamplingSpec, seed: int):
        from vllm import SamplingParams

        return SamplingParams(n=spec.n, temperature=spec.temperature, top_p=spec.top_p if spec.temperature else 1.0,
                              max_tokens=spec.max_tokens, stop=spec.stop or None, include_stop_str_in_output=True,
                              logprobs=0 if spec.logprobs else None, flat_logprobs=True, seed=seed,
                              skip_special_tokens=True)

    def generate(self, prompts: list[list[int]], spec: SamplingSpec, seeds: list[int]) -> list[list[Sample]]:
        from vllm.inputs import TokensPrompt

        if not prompts:
            return []
        params = [self._params(spec, s) for s in seeds]
        outs = self.llm.generate([TokensPrompt(prompt_token_ids=p) for p in prompts], params,
                                 lora_request=self.lora, use_tqdm=False)
        return [[_vllm_sample(c) for c in sorted(out.outputs, key=lambda c: c.index)] for out in outs]

    def submit(self, key, prompt: list[int], spec: SamplingSpec, seed: int) -> None:
        from vllm.inputs import TokensPrompt
        from vllm.sampling_params import RequestOutputKind

        if spec.n != 1:
            raise ValueError("submit takes one sample per request (spec.n = 1)")
        params = self._params(spec, seed)
        params.output_kind = RequestOutputKind.FINAL_ONLY  # as LLM.generate asks: the finished output only
        rid = f"agent-{self._next_request}"  # outputs carry this id (add_request's return value is internal)
        self._next_request += 1
        internal = self.llm.llm_engine.add_request(rid, TokensPrompt(prompt_token_ids=prompt), params,
                                                   lora_request=self.lora)
        if self.fast_logprobs:
            skip_logprob_token_text(self.llm.llm_engine, internal)
        self._pending[rid] = key

    def poll(self) -> list[tuple[object, Sample]]:
        """Engine steps until a request finishes: one continuously batched stream, so a request
        submitted while others decode joins the next step instead of waiting for them."""
        done = []
        while self._pending and not done:
            if not self.llm.llm_engine.has_unfinished_requests():
                raise RuntimeError(f"vLLM dropped {len(self._pending)} queued request(s) without output")
            for out in self.llm.llm_engine.step():
                if out.finished and out.request_id in self._pending:
                    done.append((self._pending.pop(out.request_id), _vllm_sample(out.outputs[0])))
        return done

    def prompt_logprobs(self, ids: list[int], start: int) -> list[float]:
        """Log-probs of ids[start:] given their prefixes, under the current policy (for checks)."""
        from vllm import SamplingParams
        from vllm.inputs import TokensPrompt

        out = self.llm.generate([TokensPrompt(prompt_token_ids=ids)],
                                SamplingParams(max_tokens=1, prompt_logprobs=0, temperature=0.0),
                                lora_request=self.lora, use_tqdm=False)[0]
        return [out.prompt_logprobs[k][ids[k]].logprob for k in range(start, len(ids))]

    def close(self) -> None:
        del self.llm


def _vllm_sample(c) -> Sample:
    """A finished vLLM completion as a Sample. Its log-probs come flat (`flat_logprobs`: plain lists,
    not a dict per token); with `logprobs=0` each position holds just the sampled token's."""
    ids = list(c.token_ids)
    lps = None
    if c.logprobs is not None:
        lps = list(c.logprobs.logprobs)
        if list(c.logprobs.token_ids) != ids:
            raise RuntimeError(f"vLLM returned log-probs of {len(lps)} tokens that are not the {len(ids)} sampled")
    return Sample(ids, c.text, lps, "stop" if c.finish_reason == "stop" else "length")


def cuda_available() -> bool:
    import torch

    return torch.cuda.is_available()


ENGINES = Registry("engine", {"vllm": VLLMEngine, "hf": HFEngine, "openai": OpenAIEngine})


def empty_prefix_cache(engine) -> None:
    """Drop a vLLM engine's prefix cache (an engine without one has nothing to drop), so that a
    benchmark's replay starts as a training step's rollout does after its weight sync, and does
    not find an earlier replay's prompts cached."""
    if isinstance(engine, VLLMEngine):
        engine.llm.reset_prefix_cache()


def make_engine(name: str, model_path: Path, cfg: EngineConfig, seed: int = 0,
                trust_remote_code: bool = False) -> Engine:
    return ENGINES.get(name)(model_path, cfg, seed=seed, trust_remote_code=trust_remote_code)

"""Workarounds for the pinned vLLM (0.32.0, requirements-cpu.txt) on CPU, in one place.

Each one patches around an assumption or an internal of that version and says why in its
docstring. tests/test_engines.py checks `in_process`, `unscannable_modules` and
`skip_logprob_token_text` against the pinned version; `keep_freed_memory` (utils/core/heap.py, with
the rest of what this project asks of glibc's heap) is a speed setting whose figures are in
docs/PERFORMANCE.md.

- `in_process`: an engine built in the stage's own process (`model.engine.in_process`) must not
  change that process: vLLM's CPU worker reseeds the global generators, replaces
  `torch.set_num_threads` and freezes vLLM's environment variables, as if the process were its own.
- `unscannable_modules`: vLLM's start-up walks every imported module for Triton kernels and fails
  on llvmlite's library wrapper (imported with numba); such modules are hidden for the start.
- `keep_freed_memory`: glibc malloc settings that stop a loop of matrix products page-faulting at
  half speed once an in-process engine holds its memory.
- `skip_logprob_token_text`: no text decoded for each sampled token's log-prob entry, which
  nothing reads and which vLLM has no switch for.
"""
from __future__ import annotations

import contextlib
import os
import sys

from utils.core.heap import keep_freed_memory


@contextlib.contextmanager
def in_process(on: bool):
    """Build a vLLM engine in this process (`model.engine.in_process`) without letting it change the
    process: vLLM's CPU worker reseeds torch's, numpy's and Python's global generators, and replaces
    `torch.set_num_threads` with a function that ignores its argument (it expects a process of its
    own, bound to its cores), and its engine core freezes vLLM's environment variables (so a later
    engine in this process would stay in-process whatever its config said). Those are put back
    after; the thread count is left as it was."""
    if not on:
        yield
        return
    import random

    import numpy as np
    import torch

    saved = (torch.get_rng_state(), np.random.get_state(), random.getstate(), torch.set_num_threads,
             torch.get_num_threads(), os.environ.get(MULTIPROCESSING_ENV))
    keep_freed_memory()
    os.environ[MULTIPROCESSING_ENV] = "0"
    hidden = unscannable_modules()
    for name in hidden:
        del sys.modules[name]
    try:
        yield
    finally:
        sys.modules.update(hidden)
        import vllm.envs

        vllm.envs.disable_envs_cache()
        torch.set_rng_state(saved[0])
        np.random.set_state(saved[1])
        random.setstate(saved[2])
        torch.set_num_threads = saved[3]
        torch.set_num_threads(saved[4])
        if saved[5] is None:
            os.environ.pop(MULTIPROCESSING_ENV, None)
        else:
            os.environ[MULTIPROCESSING_ENV] = saved[5]


def unscannable_modules() -> dict:
    """The imported modules that vLLM's CPU worker cannot scan when it starts in this process, by name.
    It walks every object of every module in `sys.modules` and reads `vars(obj).get("kernel")` of each
    that has a `__dict__` (`vllm.triton_utils.dispatcher._rebind_kernels`, vLLM 0.32.0); llvmlite's
    library wrapper answers `__dict__` with a C function, so once numba is imported (bm25s, the search
    tool's retriever, imports it) the engine start failed with "'_lib_fn_wrapper' object has no
    attribute 'get'". Those modules hold no Triton kernel: `in_process` takes them out of
    `sys.modules` for the start and puts them back."""
    import warnings

    found = {}
    with warnings.catch_warnings():  # reading every attribute wakes deprecation warnings (torch.distributed)
        warnings.simplefilter("ignore")
        for name, module in list(sys.modules.items()):
            for value in list((getattr(module, "__dict__", None) or {}).values()):
                try:
                    odd = hasattr(value, "__dict__") and not hasattr(vars(value), "get")
                except Exception:  # noqa: BLE001 - whatever fails here would fail vLLM's scan too
                    odd = True
                if odd:
                    found[name] = module
                    break
    return found


MULTIPROCESSING_ENV = "VLLM_ENABLE_V1_MULTIPROCESSING"  # "0": vLLM's engine core runs in the calling process


def skip_logprob_token_text(llm_engine, request_id: str) -> bool:
    """Stop vLLM decoding each sampled token's log-prob entry to text (`Logprob.decoded_token`, which
    nothing here reads): most of what the log-probs cost a rollout (docs/PERFORMANCE.md).
    vLLM has no switch for it short of `detokenize=False`, which would also drop stop strings, so this
    clears the tokenizer of the request's log-prob processor, an internal of the vLLM version pinned in
    requirements (tests/test_engines.py checks that it still takes). Returns whether it took."""
    state = getattr(llm_engine.output_processor, "request_states", {}).get(request_id)
    processor = getattr(state, "logprobs_processor", None)
    if processor is None or not hasattr(processor, "tokenizer"):
        return False
    processor.tokenizer = None
    return True

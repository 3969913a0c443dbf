"""Shared fixtures. The vLLM engine is expensive to start (~30-60 s on 2 cores), so one serves the session."""
import os

import pytest

from utils.config import ROOT

BASE = ROOT / "artifacts" / "tiny-arith"


@pytest.fixture(scope="session")
def base_dir():
    return BASE


@pytest.fixture(scope="session")
def hf_base():
    import torch
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_pretrained(BASE, dtype=torch.float32)
    model.eval()
    return model


@pytest.fixture(scope="session")
def vllm_engine():
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")
    from vllm import LLM

    llm = LLM(model=str(BASE), dtype="float32", max_model_len=512, gpu_memory_utilization=0.3,
              enforce_eager=True, seed=0, enable_lora=True, max_lora_rank=8, max_loras=2)
    yield llm
    del llm

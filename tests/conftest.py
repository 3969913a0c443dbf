"""Shared fixtures. The vLLM engine is expensive to start (~30-60 s on 2 cores), so one serves the
whole session; tests that use it set the adapter they need first.

The suite runs on two pytest-xdist workers (pytest.ini), each starting trainings and engines with
torch's two threads on a 2-core box. OpenMP threads that spin while they wait for work (libgomp's
default) would take the cores from the other worker's, so before anything imports torch, every
worker and every process it starts is told to sleep instead: a setting of speed, never of numbers."""
import os
import re
from pathlib import Path

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import pytest  # noqa: E402
from xdist.scheduler import LoadFileScheduling  # noqa: E402

from utils.core.config import ROOT
from utils.core.schema import EngineConfig

BASE = ROOT / "artifacts" / "tiny-arith"
HERE = Path(__file__).parent
ENGINE_CFG = EngineConfig(max_lora_rank=8, max_loras=2, memory_share=0.1)  # the tiny model's KV cache is small
# spawned engine cores: closing an in-process engine tears down vLLM's process-wide parallel groups,
# which another in-process engine of the same process still needs (tests/test_engines.py keeps its own)
MERGED_CFG = EngineConfig(max_lora_rank=8, memory_share=0.1, lora_serving="merged")


@pytest.fixture(scope="session")
def base_dir():
    return BASE


@pytest.fixture(scope="session")
def hf_base():
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(BASE, dtype=torch.float32)
    model.eval()
    return model


@pytest.fixture(scope="session")
def vllm_engine():
    from utils.agent.engines import VLLMEngine

    engine = VLLMEngine(BASE, ENGINE_CFG, seed=0)
    yield engine
    engine.close()


@pytest.fixture(scope="session")
def vllm_merged():
    """vLLM serving each adapter merged into the base weights (tiny-arith's default)."""
    from utils.agent.engines import VLLMEngine

    engine = VLLMEngine(BASE, MERGED_CFG, seed=0)
    yield engine
    engine.close()


@pytest.fixture(params=["adapter", "merged"])
def any_vllm(request):
    """Each vLLM LoRA serving mode in turn."""
    return request.getfixturevalue("vllm_engine" if request.param == "adapter" else "vllm_merged")


@pytest.fixture(scope="session")
def hf_engine():
    from utils.agent.engines import HFEngine

    return HFEngine(BASE, ENGINE_CFG)


def make_random_adapter(out_dir, seed: int, scale: float = 0.5):
    """A LoRA adapter with non-zero random weights, saved as a peft directory vLLM can load."""
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_pretrained(BASE, dtype=torch.float32)
    cfg = LoraConfig(r=8, lora_alpha=16, target_modules=["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj",
                                                         "up_proj", "down_proj"], init_lora_weights=False)
    peft_model = get_peft_model(model, cfg)
    with torch.no_grad():
        for name, p in peft_model.named_parameters():
            if "lora_" in name:
                p.mul_(scale)
    peft_model.save_pretrained(out_dir)
    return out_dir


@pytest.fixture(scope="session")
def adapters(tmp_path_factory):
    root = tmp_path_factory.mktemp("adapters")
    return make_random_adapter(root / "a", seed=1), make_random_adapter(root / "b", seed=2)


@pytest.fixture(scope="session")
def protocol_adapter(tmp_path_factory, worker_id):
    """A LoRA adapter briefly SFT-trained on gold traces, so rollouts run several real turns.

    Trained once per test run (about a minute alone on the AVX2 box): under pytest-xdist the first
    worker to ask trains it into the folder the run's workers share, while another that asks waits
    on a file lock. It is seeded, so which worker trains it does not change it."""
    from filelock import FileLock

    from utils.tinyarith.quick import train_gold_adapter

    shared = tmp_path_factory.getbasetemp()
    if worker_id != "master":  # each worker's basetemp is a subfolder of the run's
        shared = shared.parent
    out = shared / "protocol" / "adapter"  # tests/test_export.py expects the folder name "adapter"
    out.parent.mkdir(exist_ok=True)
    with FileLock(f"{out}.lock"):
        if not out.is_dir():
            tmp = out.with_name(f"adapter.{worker_id}.tmp")
            train_gold_adapter(BASE, tmp)
            tmp.rename(out)  # complete or absent
    return out


# a function (test or fixture) that asks for one of this session's vLLM engines
VLLM_SESSION = re.compile(r"def \w+\([^)]*\b(?:vllm_engine|vllm_merged|any_vllm)\b")


def vllm_session_files() -> set[str]:
    """The test files (as 'tests/<name>') with a function that asks for a session vLLM engine."""
    return {f"{HERE.name}/{p.name}" for p in HERE.glob("test_*.py") if VLLM_SESSION.search(p.read_text())}


class VllmGroupScheduling(LoadFileScheduling):
    """pytest-xdist's `loadfile` (a worker takes one whole file at a time), except that the files
    using the session's vLLM engines form one unit, so the engines start on one worker only (each
    start is an engine and its memory on a box of 2 cores). xdist's `loadgroup` would do this with
    marks, but with pytest 9.2 it ignores them (it renames items through an attribute pytest no
    longer reads). The one hook is `_split_scope` (a test id -> its unit), private to xdist 3.8, which
    requirements.txt pins: tests/test_suite_schedule.py fails if an upgrade renames it."""

    def __init__(self, config, log=None):
        super().__init__(config, log)
        self.vllm_files = vllm_session_files()

    def _split_scope(self, nodeid: str) -> str:
        scope = super()._split_scope(nodeid)
        return "vllm-session" if scope in self.vllm_files else scope


def pytest_xdist_make_scheduler(config, log):
    return VllmGroupScheduling(config, log) if config.getvalue("dist") == "loadfile" else None


def pytest_addoption(parser):
    parser.addoption("--full", action="store_true",
                     help="the full suite, as CI runs it: the fast tier and the minutes-long tests marked slow "
                          "(without it, and without -m, plain pytest runs the fast tier)")


# a test that asks for one of these is in the full tier: each starts a vLLM engine or trains an adapter
FULL_TIER_FIXTURES = {"vllm_engine", "vllm_merged", "any_vllm", "protocol_adapter"}


def full_tier_only(item) -> bool:
    """Whether a test runs only in the full tier: marked `slow` (minutes-long), or asking for a
    session vLLM engine or the trained protocol adapter."""
    return item.get_closest_marker("slow") is not None or bool(FULL_TIER_FIXTURES & set(item.fixturenames))


def pytest_collection_modifyitems(config, items):
    """The fast tier unless --full or -m says otherwise: the full tier's own tests are deselected.
    Then the run's order (below)."""
    if not config.getoption("--full") and not config.getoption("markexpr"):
        full = [item for item in items if full_tier_only(item)]
        if full:
            config.hook.pytest_deselected(items=full)
            items[:] = [item for item in items if not full_tier_only(item)]
    suite_order(items)


def suite_order(items):
    """The order in which the units above are handed out (pytest.ini turns xdist's own, by number
    of tests, off): the vLLM unit first (it took one worker for 23–27 minutes on the AVX2 box),
    then the files made mostly of minutes-long (`slow`) tests, then the others, more tests first.
    xdist gives a worker its next unit when two or fewer of its tests are left, so the long files
    start early on the other worker and the short ones fill the end (by number of slow tests
    instead, the one-test kill-anywhere file came last, and the other worker had run out of short
    files more than 2 minutes before it ended)."""
    from collections import Counter

    vllm = {ROOT / name for name in vllm_session_files()}
    slow = Counter(item.path for item in items if item.get_closest_marker("slow"))
    count = Counter(item.path for item in items)
    items.sort(key=lambda item: (item.path not in vllm, -slow[item.path] / count[item.path], -count[item.path],
                                 str(item.path)))


@pytest.fixture
def prepared(tmp_path):
    """outputs/t/{00,01,02} on a small synthetic dataset; (outputs dir, the flags that made it)."""
    from helpers import SMALL, run_stage
    from utils.core.schema import DataConfig
    from utils.data.synthetic import write_dataset

    root = tmp_path / "synth"
    write_dataset(DataConfig(n_train=60, n_val=8, n_test=8), root)
    out = tmp_path / "outputs"
    args = ["--set", f"data.path={root}", *SMALL]
    for stage in ("00_check_data", "01_prepare_dataset", "02_build_rewards"):
        assert run_stage(stage, out, *args) == 0
    return out, args

"""Security default: a model directory's own Python code (auto_map) never runs unless
model.trust_remote_code turns it on, for every loader the stages use (tokenizer, trainer policy, HF
and vLLM engines), and a stage given such a model stops with one line naming the file and the
switch."""
import json
import shutil
import subprocess
import sys

import pytest

from utils.core.config import ROOT, ConfigError
from utils.core.models import load_causal_lm, load_tokenizer
from utils.core.schema import EngineConfig, LoraConfig

EVIL = '''import os, pathlib
pathlib.Path(os.environ["REMOTE_CODE_MARKER"]).write_text("ran")
from transformers import LlamaConfig, LlamaForCausalLM


class EvilConfig(LlamaConfig):
    model_type = "llama"


class EvilForCausalLM(LlamaForCausalLM):
    config_class = EvilConfig
'''


@pytest.fixture
def code_model(tmp_path, base_dir, monkeypatch):
    """tiny-arith with an auto_map naming a module that leaves a marker file when it is imported."""
    model = tmp_path / "code-model"
    shutil.copytree(base_dir, model)
    cfg = json.loads((model / "config.json").read_text())
    cfg["auto_map"] = {"AutoConfig": "evil.EvilConfig", "AutoModelForCausalLM": "evil.EvilForCausalLM"}
    (model / "config.json").write_text(json.dumps(cfg))
    (model / "evil.py").write_text(EVIL)
    marker = tmp_path / "marker"
    monkeypatch.setenv("REMOTE_CODE_MARKER", str(marker))
    return model, marker


def test_no_loader_runs_a_models_code_unless_trusted(code_model):
    from utils.agent.engines import HFEngine, VLLMEngine
    from utils.train.policy import load_policy

    model, marker = code_model
    loaders = [lambda: load_tokenizer(model), lambda: load_causal_lm(model),
               lambda: load_policy(model, LoraConfig()), lambda: HFEngine(model, EngineConfig()),
               lambda: VLLMEngine(model, EngineConfig(memory_share=0.1))]
    for load in loaders:
        with pytest.raises(ConfigError, match=r"config.json: the model ships its own Python code \(auto_map: "
                                              r"AutoConfig, AutoModelForCausalLM\).*model.trust_remote_code=true"):
            load()
    assert not marker.exists()
    trusted = load_causal_lm(model, trust_remote_code=True)  # the switch is what gates it
    assert marker.read_text() == "ran" and type(trusted).__name__ == "EvilForCausalLM"


def test_a_stage_refuses_such_a_model_naming_the_file(code_model, tmp_path):
    from utils.core.schema import DataConfig
    from utils.data.synthetic import write_dataset

    model, marker = code_model
    write_dataset(DataConfig(n_train=20, n_val=5, n_test=5), tmp_path / "data")  # a clean clone has no data/
    flags = ["--set", f"outputs_dir={tmp_path / 'out'}", "--set", f"model.path={model}",
             "--set", f"data.path={tmp_path / 'data'}", "--set", "data.n_train=20", "--set", "data.n_val=5",
             "--set", "data.n_test=5"]
    subprocess.run([sys.executable, "00_check_data.py", *flags], cwd=ROOT, check=True, capture_output=True,
                   timeout=300)
    out = subprocess.run([sys.executable, "01_prepare_dataset.py", *flags], cwd=ROOT, capture_output=True, text=True,
                         timeout=300)
    assert out.returncode == 1, out.stderr
    last = out.stderr.strip().splitlines()[-1]
    assert last.startswith("01_prepare_dataset: error: ") and f"{model}/config.json" in last, out.stderr
    assert "model.trust_remote_code=true" in last and not marker.exists()

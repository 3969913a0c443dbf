"""The suite's own scheduling (tests/conftest.py): the files that use the session's vLLM engines
are one xdist unit, every other file its own, and the vLLM unit is collected first."""
import os
import subprocess
import sys

from conftest import VllmGroupScheduling, vllm_session_files
from utils.core.config import ROOT


def test_files_using_the_session_engines_form_one_unit():
    files = vllm_session_files()
    assert {"tests/test_engines.py", "tests/test_trainer.py", "tests/test_serve.py"} <= files
    assert "tests/test_losses.py" not in files and "tests/conftest.py" not in files
    scheduling = object.__new__(VllmGroupScheduling)  # its split needs no worker nodes
    scheduling.vllm_files = files
    split = scheduling._split_scope
    assert split("tests/test_engines.py::test_x[adapter]") == split("tests/test_trainer.py::test_y") == "vllm-session"
    assert split("tests/test_losses.py::test_z") == "tests/test_losses.py"


def test_the_whole_suite_is_collected_vllm_unit_first_and_file_by_file():
    env = {k: v for k, v in os.environ.items() if k != "PYTEST_ADDOPTS"}  # -v would print a tree instead
    proc = subprocess.run([sys.executable, "-m", "pytest", "-n", "0", "-p", "no:cacheprovider", "--collect-only", "-q"],
                          cwd=ROOT, capture_output=True, text=True, timeout=300, env=env)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    order = [line.split("::")[0] for line in proc.stdout.splitlines() if "::" in line]
    files = vllm_session_files()
    assert set(order[:sum(f in files for f in order)]) == files  # every vLLM-unit test before any other
    runs = [f for i, f in enumerate(order) if i == 0 or order[i - 1] != f]
    assert len(runs) == len(set(order)) > 30  # each file's tests together

"""The suite's own tiers and scheduling (tests/conftest.py): plain pytest runs the fast tier; the files that use the session's vLLM engines
are one xdist unit, every other file its own; the vLLM unit is handed out first, then the files
made mostly of slow tests, then the others, more tests first, each file's tests together."""
from types import SimpleNamespace

import pytest

from conftest import HERE, VllmGroupScheduling, full_tier_only, suite_order, vllm_session_files


def test_files_using_the_session_engines_form_one_unit():
    files = vllm_session_files()
    assert {"tests/test_engines.py", "tests/test_trainer.py", "tests/test_serve.py"} <= files
    assert "tests/test_losses.py" not in files and "tests/conftest.py" not in files
    scheduling = object.__new__(VllmGroupScheduling)  # its split needs no worker nodes
    scheduling.vllm_files = files
    split = scheduling._split_scope
    assert split("tests/test_engines.py::test_x[adapter]") == split("tests/test_trainer.py::test_y") == "vllm-session"
    assert split("tests/test_losses.py::test_z") == "tests/test_losses.py"


def _item(name: str, slow: bool = False, fixtures=()):
    mark = pytest.mark.slow.mark if slow else None
    return SimpleNamespace(path=HERE / name, name=name, get_closest_marker=lambda _: mark, fixturenames=list(fixtures))


def test_the_vllm_unit_first_then_mostly_slow_files_then_larger_files():
    items = [_item("test_losses.py"), _item("test_launch.py"), _item("test_launch.py", slow=True),
             _item("test_launch.py"), _item("test_config.py"), _item("test_kill_anywhere.py", slow=True),
             _item("test_engines.py"), _item("test_config.py"), _item("test_ray_executor.py"),
             _item("test_ray_executor.py", slow=True), _item("test_engines.py", slow=True)]
    suite_order(items)
    assert [i.name for i in items] == [
        "test_engines.py", "test_engines.py",  # the vLLM unit (one of them, here)
        "test_kill_anywhere.py", "test_ray_executor.py", "test_ray_executor.py",  # 1/1 slow, 1/2 slow
        "test_launch.py", "test_launch.py", "test_launch.py",  # 1/3 slow
        "test_config.py", "test_config.py", "test_losses.py"]  # none slow: two tests, then one


def test_the_fast_tier_leaves_out_slow_tests_and_those_that_start_engines_or_train_adapters():
    assert not full_tier_only(_item("test_losses.py", fixtures=["tmp_path", "hf_base"]))
    assert full_tier_only(_item("test_kill_anywhere.py", slow=True))
    assert full_tier_only(_item("test_engines.py", fixtures=["any_vllm"]))
    assert full_tier_only(_item("test_trainer.py", fixtures=["tmp_path", "protocol_adapter"]))

"""The generated word problems (utils/data/word_problems.py) are GSM8K-native: the gsm8k adapter reads
every row with a gold decomposition whose calculations are right and whose last result is the answer;
no (template, numbers) instance repeats across splits; the same config writes the same files."""
import json
import re

import pytest

from utils.core.config import ROOT, from_dict, read_yaml
from utils.core.schema import DataConfig
from utils.data.adapters import load_split
from utils.data.word_problems import TEMPLATES, generate, write_word_problems


def _config(**knobs) -> DataConfig:
    tree = read_yaml(ROOT / "configs" / "data" / "word_problems.yaml")
    tree.pop("run", None)
    tree.update(knobs)
    return from_dict(DataConfig, tree, "word_problems.yaml")


def test_the_gsm8k_adapter_reads_every_row_with_a_right_gold_decomposition(tmp_path):
    cfg = _config(n_train=300, n_val=30, n_test=60)
    out = write_word_problems(cfg, tmp_path / "wp")
    calc = re.compile(r"<<([^=]+)=([^>]+)>>")
    for split, n in (("train", 300), ("val", 30), ("test", 60)):
        _, rows = load_split("gsm8k", out, split)
        assert len(rows) == n
        for _, row in rows:
            steps = row.meta["steps"]
            assert 2 <= len(steps) <= 3 and "trace_error" not in row.meta
            assert steps[-1]["result"] == row.answers[0]
            for step in steps:  # each calculation is right and whole: what the executor is asked
                assert eval(step["task"], {"__builtins__": {}}) == int(step["result"])  # noqa: S307
                assert int(step["result"]) >= 0
    raw = json.loads((out / "test.jsonl").read_text().splitlines()[0])
    assert raw["answer"].splitlines()[-1].startswith("#### ") and calc.search(raw["answer"])


def test_no_instance_is_shared_between_splits_and_the_files_are_reproducible(tmp_path):
    cfg = _config(n_train=500, n_val=50, n_test=100)
    splits = generate(cfg)
    instances = {s: {(r["template"], tuple(r["numbers"])) for r in rows} for s, rows in splits.items()}
    assert all(len(instances[s]) == len(rows) for s, rows in splits.items())  # none twice within a split
    assert not instances["train"] & instances["val"] and not instances["train"] & instances["test"]
    assert not instances["val"] & instances["test"]
    assert {r["template"] for r in splits["train"]} == set(TEMPLATES)
    a = write_word_problems(cfg, tmp_path / "a")
    b = write_word_problems(cfg, tmp_path / "b")
    for name in ("train.jsonl", "val.jsonl", "test.jsonl"):
        assert (a / name).read_bytes() == (b / name).read_bytes()
    before = (a / "manifest.json").stat().st_mtime_ns
    write_word_problems(cfg, a)  # the same config: nothing is rewritten
    assert (a / "manifest.json").stat().st_mtime_ns == before
    assert generate(_config(n_train=500, n_val=50, n_test=100, seed=cfg.seed + 1)) != splits


def test_impossible_knobs_are_refused_with_the_setting_named():
    with pytest.raises(ValueError, match="data.min_steps=4, data.max_steps=6: .* no template fits"):
        generate(_config(min_steps=4, max_steps=6))
    with pytest.raises(ValueError, match="cannot draw 4150 distinct word problems with operand_max=2"):
        generate(_config(operand_max=2, n_train=4000))
    with pytest.raises(ValueError, match="data.n_val=0.5: .* a count"):
        generate(_config(n_val=0.5))


def test_a_word_problems_gold_trace_delegates_each_calculation(tmp_path):
    """The gold trace of a question that is not an arithmetic chain thinks "step k" before each
    subtask; it used to copy the whole question into the first think (steps without a search read as
    lookups), which the SFT warmup then trained on."""
    from utils.agent.traces import trace_from_row

    out = write_word_problems(_config(n_train=20, n_val=2, n_test=2), tmp_path / "wp")
    for _, row in load_split("gsm8k", out, "train")[1]:
        trace, why = trace_from_row(row.to_json(), "gold")
        assert why is None
        steps = row.meta["steps"]
        assert trace.planner_turns == [f"<think>step {k + 1}</think><task>{s['task']}</task>" for k, s in enumerate(steps)] \
            + [f"<think>{row.answers[0]}</think><answer>{row.answers[0]}</answer>"]

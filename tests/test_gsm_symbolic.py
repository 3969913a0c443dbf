"""GSM-Symbolic through reasoning-gym (utils/data/gsm_symbolic.py): the calculations read from its worked
prose (utils/data/worked_lines.py) by hand, the splits disjoint by instance and reproducible, the
gsm8k adapter reading each decomposed row with a gold trace whose calculations are right, the choice
of templates and steps, and the files refused once a generator setting differs from them."""
import json
import re
from fractions import Fraction

import pytest

from utils.core.config import ROOT, from_dict, read_yaml
from utils.core.errors import StageError
from utils.core.schema import DataConfig
from utils.data.adapters import get_adapter, load_split
from utils.data.gsm_symbolic import annotate, generate, write_gsm_symbolic
from utils.data.worked_lines import evaluate, line_calculations, worked_calculations


def _config(**knobs) -> DataConfig:
    tree = read_yaml(ROOT / "configs" / "data" / "gsm_symbolic.yaml")
    tree.pop("run", None)
    tree.update(knobs)
    return from_dict(DataConfig, tree, "gsm_symbolic.yaml")


@pytest.mark.parametrize("line, want", [
    # (a line of a worked solution, [(expression, stated value)]): units dropped, `x` a times sign
    ("Sophia processes 49 orders/day * 4 = 196 orders/day.", [("49 * 4", "196")]),
    ("First find the time: 30 onion / 6 onion/minute = 5 minutes", [("30 / 6", "5")]),
    ("The total charge for the danishes was 8 x $14 = $112.", [("8 * 14", "112")]),
    ("he earns £60/day * 14 days/month = £840/month", [("60 * 14", "840")]),
    ("collect 125 - 64 signatures. 125 - 64 = 61 signatures", [("125 - 64", "61")]),   # the sentence before stops it
    ("   - 72 plants × $8 per plant = $576", [("72 * 8", "576")]),                      # a bullet is no minus
    ("it takes her 10÷1/2=20 minutes.", [("10 / (1/2)", "20")]),                       # a tight fraction is one number
    ("13 blocks per 52 minutes, or 13/52 = 1/4 blocks per minute.", [("13 / 52", "1/4")]),
    ("The questions are 100% - 25% = 75% of the quiz.", [("100/100 - 25/100", "75%")]),
    ("The room is 19 yards * (3 feet / 1 yards) = 57 feet.", [("19 * (3 / 1)", "57")]),
    ("Thus, T = 241 - 144 = 97 bouncy balls.", [("241 - 144", "97")]),               # T = ... restates, no calculation
    ("Cold water kilometer = 21 minutes", []),                                       # a statement, no calculation
])
def test_calculations_are_read_from_worked_prose(line, want):
    found, wrong, unread = line_calculations(line)
    assert [(e, s) for e, s, _, _ in found] == want and not wrong and not unread


def test_arithmetic_that_is_not_read_or_does_not_add_up_is_reported_not_passed_off():
    assert line_calculations("So he writes 1188/60=19 hours a week")[1] == ["1188 / 60 = 19 (evaluates to 19.8)"]
    for line in ("Mia has 75 + 38 + 32 + T = 145 + T = 210 toys", "we get 2x+90=252",
                 "beetles is half * 154 bees = 77 beetles", "The perimeter is 2(73+57) = 260"):
        found, wrong, unread = line_calculations(line)
        assert unread and not wrong, line
    assert evaluate("10 / (1/2)") == 20 and evaluate("2 * (3 + 4) - 1") == 13
    assert evaluate("1 / 0") is None and evaluate("2 +") is None and evaluate("__import__('os')") is None
    calcs, wrong, unread = worked_calculations("a 2 + 3 = 5 b\nc 5 * 4 = 20 d\n#### 20")
    assert [(e, s, v) for e, s, v, _ in calcs] == [("2 + 3", "5", Fraction(5)), ("5 * 4", "20", Fraction(20))]


def test_annotate_writes_gsm8k_annotations_or_says_why_not():
    text, n, outcome = annotate("She had 3 + 4 = 7 pens.\nThen 7 * 2 = 14 pens.\n#### 14")
    assert outcome == "decomposed" and n == 2
    assert text == "She had 3 + 4 =<<3 + 4=7>> 7 pens.\nThen 7 * 2 =<<7 * 2=14>> 14 pens.\n#### 14"
    assert annotate("Let x be it.\nSo 2x+1 = 7 and x = 3.\n#### 3")[2] == "no_decomposition"
    assert annotate("He has 3 + 4 = 7.\n#### 8")[2] == "no_decomposition"  # the last result is not the answer
    assert annotate("He writes 1188/60 = 19 hours\n#### 19") == (None, 0, "dropped")


def test_the_splits_are_disjoint_reproducible_and_read_by_the_gsm8k_adapter(tmp_path):
    cfg = _config(n_train=120, n_val=20, n_test=30)
    out = write_gsm_symbolic(cfg, tmp_path / "gs")
    m = json.loads((out / "manifest.json").read_text())
    assert m["package"] == {"name": "reasoning-gym", "version": "0.1.25", "task": "gsm_symbolic", "difficulty": 1.0}
    assert m["counts"] == {"train": 120, "val": 20, "test": 30} and m["knobs"]["seed"] == cfg.seed
    calc = re.compile(r"<<([^=<>]+)=([^<>]+)>>")
    seen, decomposed = {}, 0
    for split in ("train", "val", "test"):
        raw = [json.loads(line) for line in (out / f"{split}.jsonl").read_text().splitlines()]
        keys = {(r["template"], json.dumps(r["variables"], sort_keys=True)) for r in raw}
        assert len(keys) == len(raw) and not keys & set(seen), split  # no instance twice, none in two splits
        seen.update(dict.fromkeys(keys, split))
        _, rows = load_split("gsm8k", out, split)
        for (_, row), r in zip(rows, raw, strict=True):
            assert 2 <= r["n_steps"] <= 4 and row.answers == [r["answer"].rsplit("####", 1)[1].strip()]
            if r["outcome"] != "decomposed":
                assert "trace_error" in row.meta and not calc.search(r["answer"])
                continue
            decomposed += 1
            steps = row.meta["steps"]
            for step in steps:  # every subtask an Executor gets is a right calculation
                value = evaluate(step["task"])
                target = Fraction(step["result"].rstrip("%")) / (100 if step["result"].endswith("%") else 1)
                assert value is not None and abs(float(value - target)) <= 1e-4 * max(1, abs(float(target)))
            assert float(Fraction(steps[-1]["result"].rstrip("%"))) == pytest.approx(float(row.answers[0]))
    assert decomposed >= 0.8 * 170  # about 90% of the 2-4-line items decompose (manifest.json counts them)
    again = write_gsm_symbolic(cfg, tmp_path / "again")
    for name in ("train.jsonl", "val.jsonl", "test.jsonl"):
        assert (out / name).read_bytes() == (again / name).read_bytes()
    before = (out / "manifest.json").stat().st_mtime_ns
    write_gsm_symbolic(cfg, out)  # the same config: a no-op
    assert (out / "manifest.json").stat().st_mtime_ns == before


def test_templates_and_steps_choose_what_each_item_is_drawn_from():
    splits, _ = generate(_config(templates=[0, 17], min_steps=4, max_steps=5, n_train=20, n_val=3, n_test=3))
    rows = [r for rs in splits.values() for r in rs]
    assert {r["template"] for r in rows} <= {0, 17} and all(4 <= r["n_steps"] <= 5 for r in rows)
    with pytest.raises(ValueError, match=r"data.templates: \[32\] not among reasoning-gym's working"):
        generate(_config(templates=[0, 32]))
    with pytest.raises(ValueError, match="cannot draw 45 distinct GSM-Symbolic items from templates"):
        generate(_config(templates=[0], min_steps=9, max_steps=9, n_train=40, n_val=2, n_test=3))
    with pytest.raises(ValueError, match="data.n_val=0.5: .* a count"):
        generate(_config(n_val=0.5))


def test_a_generator_setting_the_files_were_not_written_with_is_refused(tmp_path):
    cfg = _config(n_train=30, n_val=5, n_test=5)
    out = write_gsm_symbolic(cfg, tmp_path / "gs")
    check = get_adapter("gsm8k").check_files
    assert check(cfg, out) == []
    assert check(_config(n_train=10, n_val=5, n_test=5), out) == []  # fewer rows: 01 keeps a seeded subsample
    for knob, value in (("seed", cfg.seed + 1), ("max_steps", 3), ("templates", [1]), ("n_train", 60)):
        with pytest.raises(StageError, match=rf"data.{knob} is {re.escape(repr(value))}, the files have .*"
                                             r"bash download.sh --dataset gsm_symbolic"):
            check(_config(**{"n_train": 30, "n_val": 5, "n_test": 5, knob: value}), out)
    assert check(cfg, tmp_path) == []  # a folder no generator wrote (GSM8K's own files) is not checked


def test_03_warns_of_a_generation_budget_below_the_longest_gold_turn(prepared, capsys):
    """A demonstrated turn the sampler would cut off (SmolLM2's gold executor replies on GSM-Symbolic
    reach 44 tokens; the model's budget was 32) is named with the setting that fixes it."""
    from helpers import run_stage
    from utils.agent.traces import longest_turns, read_trace_examples

    out, args = prepared
    assert run_stage("03_generate_sft_traces", out, *args) == 0
    longest = longest_turns(read_trace_examples(out / "t" / "03_generate_sft_traces" / "sft_traces.jsonl"))
    n = longest["executor"][0]
    capsys.readouterr()
    assert run_stage("03_generate_sft_traces", out, *args, "--set", f"agent.max_new_tokens_executor={n - 1}") == 0
    err = capsys.readouterr().err
    manifest = json.loads((out / "t" / "03_generate_sft_traces" / "manifest.json").read_text())
    assert any(w.startswith(f"agent.max_new_tokens_executor={n - 1}: ") for w in manifest["warnings"])
    assert (f"agent.max_new_tokens_executor={n - 1}: a gold executor turn of question {longest['executor'][1]} is {n} "
            f"tokens") in err and f"--set agent.max_new_tokens_executor={n}" in err, err
    assert run_stage("03_generate_sft_traces", out, *args, "--set", f"agent.max_new_tokens_executor={n}") == 0
    assert "max_new_tokens_executor" not in capsys.readouterr().err


def test_longest_turns_reads_each_run_of_trained_tokens():
    from utils.agent.traces import Example, longest_turns

    examples = [Example("q1", "planner", [1] * 8, [0, 1, 1, 0, 1, 1, 1, 0]), Example("q2", "planner", [1] * 4, [1] * 4),
                Example("q3", "executor", [1] * 3, [0, 1, 1])]
    assert longest_turns(examples) == {"planner": (4, "q2"), "executor": (2, "q3")}

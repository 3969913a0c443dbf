"""Real-format datasets: gold decompositions read from the datasets' own annotations, context in the
prompt within a token budget, split sizes as fractions, and 00→04 on a GSM8K-format fixture."""
import json

import pytest
from transformers import AutoTokenizer

from helpers import FIXTURES, manifest, run_stage
from utils.agent.prompts import TemplateError, fit_context, render_executor, render_planner
from utils.core.schema import DataConfig, TemplatesConfig
from utils.core.loader import load_run_config
from utils.data.adapters import Row
from utils.data.decompose import finqa_program_steps, gsm8k_annotation_steps, hotpot_bridge_steps
from utils.data.prepare import PrepareError, prepare_splits

TABLE = [["", "2019", "2018", "2017"], ["revenue", "$ 1,200", "$ 1,000", "$ 800"], ["costs", "( 300 )", "250", "200"]]


def test_finqa_program_resolves_references_constants_and_table_rows():
    steps, why = finqa_program_steps("table_average(revenue, none), divide(#0, 1200), multiply(#1, const_100)",
                                     TABLE, 83.33333)
    assert why is None
    assert steps == [("average of 1200, 1000, 800", "1000"), ("1000 / 1200", "0.833333"), ("0.833333 * 100", "83.3333")]
    assert finqa_program_steps("table_sum(costs, none)", TABLE, 150)[0] == [("sum of -300, 250, 200", "150")]
    assert finqa_program_steps("subtract(5%, const_m1), greater(#0, 1)", TABLE, "yes")[0] == [
        ("0.05 - -1", "1.05"), ("is 1.05 greater than 1", "yes")]


@pytest.mark.parametrize("program,gold,reason", [
    ("subtract(1050, 1000), divide(#0, 1000)", 0.5, "program gives 0.05, gold is 0.5"),
    ("divide(#1, 2)", 1, "step 0 (divide): reference #1 before step 1 was computed"),
    ("divide(3, 0)", 1, "step 0 (divide): division by zero"),
    ("table_max(profit, none)", 1, "step 0 (table_max): no table row named 'profit'"),
    ("median(1, 2)", 1, "step 0 (median): unknown operation 'median'"),
    ("add(1, 2) add", 3, "cannot parse the program"),
    (None, 3, "no program"),
])
def test_finqa_programs_that_give_no_trace_say_why(program, gold, reason):
    steps, why = finqa_program_steps(program, TABLE, gold)
    assert steps == [] and why.startswith(reason)


def test_gsm8k_annotations_become_subtasks():
    text = "She packs 36/3 = <<36/3=12>>12 jars.\nIn all 36+12 = <<36+12=48>>48 jars.\n"
    assert gsm8k_annotation_steps(text, "48") == ([("36/3", "12"), ("36+12", "48")], None)
    assert gsm8k_annotation_steps(text, "50")[1] == "no annotation's result is the answer 50"
    assert gsm8k_annotation_steps("no marks", "5")[1] == "no <<expr=value>> annotations"


def test_hotpotqa_bridge_hops_and_the_questions_without_them():
    paragraphs = [("Marlow Glass Works", "The Marlow Glass Works stood in Brenfold."),
                  ("Brenfold", "Brenfold is a market town on the Tessel."), ("Other", "Unrelated.")]
    q = "Which river flows through the town where the Marlow Glass Works stood?"
    support = [["Brenfold", 0], ["Marlow Glass Works", 0]]  # order in the data does not matter
    steps, why = hotpot_bridge_steps(q, "the Tessel", "bridge", support, paragraphs)
    assert why is None and [r for _, r in steps] == ["Brenfold", "the Tessel"]
    assert steps[0][0].startswith('In "Marlow Glass Works"') and steps[1][0] == f"About Brenfold: {q}"
    hub = {"title": ["Marlow Glass Works", "Brenfold"], "sent_id": [0, 0]}  # the hub's form of the same facts
    assert hotpot_bridge_steps(q, "the Tessel", "bridge", hub, paragraphs) == (steps, None)
    assert "comparison question" in hotpot_bridge_steps(q, "no", "comparison", support, paragraphs)[1]
    assert "bridge entity not found" in hotpot_bridge_steps(q, "x", "bridge", [["Other", 0], ["Brenfold", 0]],
                                                            paragraphs)[1]


def test_context_is_cut_by_whole_lines_and_says_what_it_cut():
    context = "\n".join(f"line {i} " + "x" * 20 for i in range(10))
    count = len  # one token per character, as the tiny model's tokenizer
    assert fit_context(context, count, 1000) == (context, None)
    cut, info = fit_context(context, count, 120)
    assert len(cut) <= 120 and cut.startswith("line 0 ")
    assert cut.splitlines()[-1] == f"[context cut: {10 - info['lines_kept']} of 10 lines dropped to fit 120 tokens]"
    assert info["lines_total"] == 10 and info["tokens_before"] == len(context) and 0 < info["lines_kept"] < 10
    assert cut.splitlines()[:-1] == context.splitlines()[:info["lines_kept"]]
    with pytest.raises(TemplateError, match="cannot even hold the note"):
        fit_context(context, count, 10)


def test_templates_frame_the_context_and_context_free_rows_render_as_before():
    t = TemplatesConfig()
    assert render_planner(t, "3+4") == "plan: 3+4\n"  # the synthetic default: no context, same prompt
    assert render_planner(t, "q?", "a | b") == "context:\na | b\nplan: q?\n"
    assert render_executor(t, "3+4", context="a | b") == "solve: 3+4\n"  # the default executor sees no context
    shared = TemplatesConfig(executor="{context}solve: {task}\n")
    assert render_executor(shared, "3+4", context="a | b") == "context:\na | b\nsolve: 3+4\n"


def test_the_executor_sees_the_context_only_when_its_template_asks(hf_engine, protocol_adapter, base_dir):
    from utils.agent.rollout import Codec, Rollout, RolloutSpec

    tok = AutoTokenizer.from_pretrained(base_dir)
    row = {"id": "r", "question": "3+4-2", "answers": ["5"], "context": "note 1"}
    hf_engine.set_adapter(protocol_adapter)
    try:
        for template, sees in (("solve: {task}\n", False), ("{context}solve: {task}\n", True)):
            ro = Rollout(hf_engine, Codec(tok, TemplatesConfig(executor=template)), RolloutSpec(temperature=0))
            ep = ro.run([row], n=1, seed=0)[0]
            assert tok.decode(ep.planner_ids, skip_special_tokens=True).startswith("context:\nnote 1\nplan: 3+4-2\n")
            calls = [s for s in ep.segments if s.role == "executor"]
            assert calls, ep.transcript  # the protocol adapter delegates
            assert all(("note 1" in tok.decode(s.context_ids)) == sees for s in calls)
    finally:
        hf_engine.set_adapter(None)


def _rows(n: int, prefix: str) -> list[Row]:
    return [Row(f"{prefix}{i}", f"{prefix} question {i}", ["1"]) for i in range(n)]


def test_split_sizes_may_be_fractions():
    splits, stats = prepare_splits({"train": _rows(40, "t")}, DataConfig(name="gsm8k", n_train=0, n_val=0.1,
                                                                        n_test=0.25))
    assert {k: len(v) for k, v in splits.items()} == {"train": 27, "val": 3, "test": 10}
    assert stats["carved"] == {"test": "10 rows from train", "val": "3 rows from train"}  # a tenth of what test left
    capped, _ = prepare_splits({"train": _rows(40, "t"), "val": _rows(10, "v"), "test": _rows(10, "s")},
                               DataConfig(name="gsm8k", n_train=0.5, n_val=0, n_test=0))
    assert len(capped["train"]) == 20 and len(capped["val"]) == 10
    with pytest.raises(PrepareError, match="strictly between 0 and 1"):
        prepare_splits({"train": _rows(40, "t")}, DataConfig(name="gsm8k", n_val=1.5, n_test=0.1))
    with pytest.raises(PrepareError, match=r"cannot carve 200 val rows from 30; lower data.n_val or give a fraction"):
        prepare_splits({"train": _rows(40, "t")}, DataConfig(name="gsm8k", n_val=200, n_test=10))
    assert load_run_config(overrides=["data.n_val=0.1"]).data.n_val == 0.1  # the CLI form


def test_a_long_context_is_cut_in_01_and_recorded(tmp_path):
    out = tmp_path / "o"
    args = ["--data", "finqa", "--set", f"data.path={FIXTURES / 'finqa'}", "--set", "data.n_val=1",
            "--set", "data.n_test=0", "--set", "data.context_max_tokens=90"]
    for stage in ("00_check_data", "01_prepare_dataset"):
        assert run_stage(stage, out, *args) == 0
    rows = [json.loads(x) for x in (out / "t" / "01_prepare_dataset" / "train.jsonl").read_text().splitlines()]
    cut = [r for r in rows if "context_cut" in r["meta"]]
    assert cut and manifest(out, "01_prepare_dataset")["metrics"]["context_cut_train"] == len(cut)
    for r in cut:
        assert r["context"].splitlines()[-1].startswith("[context cut: ") and len(r["context"]) + 1 <= 90
        assert r["prompt"].endswith(f"{r['context']}\nplan: {r['question']}\n")


def test_gsm8k_fixture_runs_00_to_04_with_gold_annotation_traces(tmp_path):
    """End to end on a real-format file with the tiny model: every stage runs, the traces hold the
    calculator annotations as subtasks and reach the gold answer. Accuracy is not the point."""
    out = tmp_path / "o"
    args = ["--data", "gsm8k", "--set", f"data.path={FIXTURES / 'gsm8k'}", "--set", "data.n_val=0.34",
            "--set", "warmup.steps=4", "--set", "warmup.batch_size=4", "--set", "warmup.eval_every=0",
            "--set", "warmup.eval_size=2", "--set", "warmup.warmup_steps=1", "--set", "model.engine.name=hf"]
    for stage in ("00_check_data", "01_prepare_dataset", "02_build_rewards", "03_generate_sft_traces",
                  "04_sft_warmup"):
        assert run_stage(stage, out, *args) == 0, stage
    assert manifest(out, "01_prepare_dataset")["metrics"]["rows_val"] == 2  # 0.34 of 6 train rows
    traces = [json.loads(x) for x in (out / "t" / "03_generate_sft_traces" / "sft_traces.jsonl").read_text().splitlines()]
    train = {r["id"]: r for r in map(json.loads, (out / "t" / "01_prepare_dataset" / "train.jsonl").open())}
    assert len(traces) == len(train) == 4
    for t in traces:  # the calculator annotations, in order, then the answer after ####
        row = train[t["qid"]]
        assert [c[0] for c in t["executor_calls"]] == [s["task"] for s in row["meta"]["steps"]]
        assert t["planner_turns"][-1] == f"<think>{row['answers'][0]}</think><answer>{row['answers'][0]}</answer>"
    bakery = next(t for t in traces if t["question"].startswith("A bakery"))  # a train row under data.seed
    assert [c[0] for c in bakery["executor_calls"]] == ["3*12", "2*6", "36+12"]
    assert bakery["executor_calls"][0][1] == "<think>3*12=36</think><answer>36</answer>"
    m = manifest(out, "04_sft_warmup")
    assert m["status"] == "completed" and m["metrics"]["steps"] == 4

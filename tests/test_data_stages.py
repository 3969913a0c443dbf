"""Stages 00-02 on the embedded default and on small native-format fixtures, including bad input."""
import json
import re
import shutil
from pathlib import Path

import pytest

from utils.core.io import DataError
from utils.data.adapters import load_split
from utils.core.schema import DataConfig
from utils.data.synthetic import write_dataset
from helpers import FIXTURES, manifest, run_stage

@pytest.fixture
def synth(tmp_path):
    root = tmp_path / "synth"
    write_dataset(DataConfig(n_train=60, n_val=10, n_test=20), root)
    return root


def test_stages_00_to_02_chain_on_the_default_task(tmp_path, synth, capsys):
    out = tmp_path / "outputs"
    data = ["--set", f"data.path={synth}", "--set", "data.n_train=60", "--set", "data.n_val=10",
            "--set", "data.n_test=20"]
    for stage in ("00_check_data", "01_prepare_dataset", "02_build_rewards"):
        assert run_stage(stage, out, *data) == 0, capsys.readouterr().err
        assert manifest(out, stage)["status"] == "completed"
    m1 = manifest(out, "01_prepare_dataset")
    assert m1["parents"]["00_check_data"]
    assert m1["metrics"]["rows_train"] == 60 and m1["metrics"]["rows_test"] == 20
    row = json.loads((out / "t" / "01_prepare_dataset" / "test.jsonl").read_text().splitlines()[0])
    assert set(row) == {"id", "question", "answers", "context", "solution", "meta", "prompt"}
    assert row["prompt"] == f"plan: {row['question']}\n"
    results = json.loads((out / "t" / "02_build_rewards" / "unit_tests" / "test_results.json").read_text())
    assert results and all(r["passed"] for r in results)
    first = (out / "t" / "01_prepare_dataset" / "train.jsonl").read_bytes()
    assert run_stage("01_prepare_dataset", out, *data) == 0
    assert (out / "t" / "01_prepare_dataset" / "train.jsonl").read_bytes() == first  # deterministic


def test_gsm8k_adapter_reads_native_rows():
    path, rows = load_split("gsm8k", FIXTURES / "gsm8k", "train")
    assert path.name == "train.jsonl" and len(rows) == 6
    _, first = rows[0]
    assert first.answers == ["48"] and first.id == "train-00001"
    assert first.meta["solution_steps"][0] == "On Tuesday she packs 36/3 = 12 jars."  # calculator marks gone
    assert rows[5][1].answers == ["2500"]  # "#### 2,500"
    assert load_split("gsm8k", FIXTURES / "gsm8k", "val") is None


def test_finqa_adapter_reads_native_rows():
    _, rows = load_split("finqa", FIXTURES / "finqa", "train")
    row = rows[0][1]
    assert row.id == "ACME/2019/page_12.pdf-1"
    assert row.answers == ["2400.0", "2400"]
    assert "fair value of swaps | $ 512" in row.context and "no other hedges" in row.context
    path, val = load_split("finqa", FIXTURES / "finqa", "val")
    assert path.name == "dev.json" and len(val) == 1


def test_hotpotqa_adapter_reads_both_native_forms():
    _, orig = load_split("hotpotqa", FIXTURES / "hotpotqa", "train")
    _, hub = load_split("hotpotqa", FIXTURES / "hotpotqa", "val")
    assert orig[0][1].id == "hp-train-0001" and "Ida Lorne: Ida Lorne (1901-1980)" in orig[0][1].context
    assert hub[1][1].answers == ["Lisbon"] and "Vale Group: The Vale Group" in hub[1][1].context


# per fixture: split sizes after 01, text that the rendered train prompts must hold (table cells,
# paragraph sentences), and the gold traces 03 must write (train ids)
FIXTURE_RUNS = {
    "gsm8k": (2, {"train": 4, "val": 2, "test": 3}, [], 4),
    "finqa": (1, {"train": 4, "val": 1, "test": 2},
              ["fair value of swaps | $ 512 | $ -230 ( 230 )", "revenue | $ 1,200 | $ 1,000 | $ 800",
               "a 100 basis point change would move annual interest expense"], 4),
    "hotpotqa": (1, {"train": 3, "val": 1, "test": 1},
                 ["Ida Lorne: Ida Lorne (1901-1980) was a Scottish painter.",
                  "Brenfold: Brenfold is a market town on the Tessel."], 1),
}


def _prepared(out: Path, split: str) -> list[dict]:
    return [json.loads(x) for x in (out / "t" / "01_prepare_dataset" / f"{split}.jsonl").read_text().splitlines()]


@pytest.mark.parametrize("name", FIXTURE_RUNS)
def test_fixture_datasets_run_through_00_to_03(tmp_path, name, capsys):
    """Native-format fixtures: every stage to the SFT traces runs, the planner prompts carry the
    row's context, and every gold trace ends in the row's gold answer."""
    from utils.reward.scorers import score_numeric

    n_val, expect, evidence, n_traces = FIXTURE_RUNS[name]
    out = tmp_path / "outputs"
    args = ["--data", name, "--set", f"data.path={FIXTURES / name}", "--set", f"data.n_val={n_val}",
            "--set", "data.n_test=1" if name == "hotpotqa" else "data.n_test=0"]
    for stage in ("00_check_data", "01_prepare_dataset", "02_build_rewards", "03_generate_sft_traces"):
        assert run_stage(stage, out, *args) == 0, capsys.readouterr().err
    counts = {s: manifest(out, "01_prepare_dataset")["metrics"][f"rows_{s}"] for s in expect}
    assert counts == expect
    prompts = "\n".join(r["prompt"] for r in _prepared(out, "train"))
    for text in evidence:
        assert text in prompts
    for row in _prepared(out, "train"):
        assert (row["context"] is None) == ("context:" not in row["prompt"])
    traces = [json.loads(x) for x in (out / "t" / "03_generate_sft_traces" / "sft_traces.jsonl").read_text().splitlines()]
    stats = json.loads((out / "t" / "03_generate_sft_traces" / "stats.json").read_text())
    assert len(traces) == n_traces and stats["no_trace"]["count"] == expect["train"] - n_traces
    golds = {r["id"]: r["answers"] for r in _prepared(out, "train")}
    for t in traces:
        last_result = re.search(r"<answer>(.*)</answer>", t["executor_calls"][-1][1]).group(1)
        assert t["planner_turns"][-1].endswith(f"<answer>{golds[t['qid']][0]}</answer>")
        if name != "hotpotqa":  # the executed decomposition reaches the gold answer
            assert score_numeric(last_result, golds[t["qid"]])[0] == 1.0, t
        else:
            assert last_result == golds[t["qid"]][0]


def _corrupt(root: Path, kind: str) -> str:
    """Break the synthetic train file one way; return the text the error must contain."""
    path = root / "train.jsonl"
    lines = path.read_text().splitlines()
    row = json.loads(lines[2])
    if kind == "truncated":
        lines[2] = lines[2][: len(lines[2]) // 2]
        expect = f"{path}, row 3: invalid JSON (truncated line?)"
    elif kind == "missing":
        del row["question"]
        lines[2] = json.dumps(row)
        expect = f"{path}, row 3, field 'question': missing field"
    elif kind == "duplicate":
        row["id"] = json.loads(lines[0])["id"]
        lines[2] = json.dumps(row)
        expect = f"{path}, row 3, field 'id': duplicate id '{row['id']}' (first at {path}, row 1)"
    elif kind == "empty":
        lines = []
        expect = f"{path}: file is empty"
    elif kind == "wrong_type":
        row["answer"] = str(row["answer"])
        lines[2] = json.dumps(row)
        expect = f"{path}, row 3, field 'answer': expected int, got str"
    elif kind == "empty_question":
        row["question"] = "  "
        lines[2] = json.dumps(row)
        expect = f"{path}, row 3, field 'question': empty question"
    elif kind == "bad_step":
        row["steps"][1]["result"] = "x"
        lines[2] = json.dumps(row)
        expect = f"{path}, row 3, field 'steps[1].result': expected int, got str"
    elif kind == "bad_utf8":  # the whole file name, extension included, and the row
        data = "\n".join(lines).encode()
        cut = data.index(lines[2].encode()) + 5
        path.write_bytes(data[:cut] + b"\xff\xfe" + data[cut:] + b"\n")
        return f"{path}, row 3: not valid UTF-8 (invalid start byte at byte {cut}, line 3)"
    path.write_text("\n".join(lines) + ("\n" if lines else ""))
    return expect


@pytest.mark.parametrize("kind", ["truncated", "missing", "duplicate", "empty", "wrong_type", "empty_question",
                                  "bad_step", "bad_utf8"])
def test_bad_input_names_file_row_field_and_keeps_previous_outputs(tmp_path, synth, kind, capsys):
    out = tmp_path / "outputs"
    data = ["--set", f"data.path={synth}"]
    assert run_stage("00_check_data", out, *data) == 0
    assert run_stage("01_prepare_dataset", out, *data) == 0
    prepared = {p.name: p.read_bytes() for p in (out / "t" / "01_prepare_dataset").iterdir()}
    expect = _corrupt(synth, kind)
    capsys.readouterr()
    assert run_stage("00_check_data", out, *data) == 1
    err = capsys.readouterr().err
    assert expect in err, err
    if kind == "truncated":  # the decoder's own words, then where: no "starting at at col"
        assert re.search(r"row 3: invalid JSON \(truncated line\?\): [A-Z][^:]*: column \d+", err), err
    assert manifest(out, "00_check_data")["status"] == "failed"
    # 01 refuses to build on a failed check, and its previous outputs are untouched
    assert run_stage("01_prepare_dataset", out, *data) == 1
    assert "parent stage '00_check_data' has status 'failed'" in capsys.readouterr().err
    assert {p.name: p.read_bytes() for p in (out / "t" / "01_prepare_dataset").iterdir()
            if p.name != "manifest.json"} == {k: v for k, v in prepared.items() if k != "manifest.json"}


def test_unparseable_gold_answer_is_a_hard_error(tmp_path, capsys):
    root = tmp_path / "gsm"
    shutil.copytree(FIXTURES / "gsm8k", root)
    path = root / "test.jsonl"
    lines = path.read_text().splitlines()
    row = json.loads(lines[1])
    row["answer"] = row["answer"].rsplit("####", 1)[0] + "#### six"
    lines[1] = json.dumps(row)
    path.write_text("\n".join(lines) + "\n")
    assert run_stage("00_check_data", tmp_path / "o", "--data", "gsm8k", "--set", f"data.path={root}") == 1
    assert f"{path}, row 2, field 'answers': scorer 'numeric' cannot parse 'six'" in capsys.readouterr().err


def test_leakage_is_warned_then_dropped_from_train_or_fatal(tmp_path, synth, capsys):
    test_row = json.loads((synth / "test.jsonl").read_text().splitlines()[0])
    leaked = dict(test_row, id="train-leak")
    with (synth / "train.jsonl").open("a") as fh:
        fh.write(json.dumps(leaked) + "\n")
    out = tmp_path / "outputs"
    data = ["--set", f"data.path={synth}"]
    assert run_stage("00_check_data", out, *data) == 0
    m0 = manifest(out, "00_check_data")
    assert any(w.startswith("leakage: 1 question(s)") for w in m0["warnings"])
    assert run_stage("01_prepare_dataset", out, *data) == 0
    assert manifest(out, "01_prepare_dataset")["metrics"]["dropped_leaked"]["train"] == 1
    train_ids = [json.loads(x)["id"] for x in (out / "t" / "01_prepare_dataset" / "train.jsonl").read_text().splitlines()]
    assert "train-leak" not in train_ids
    capsys.readouterr()
    assert run_stage("01_prepare_dataset", out, *data, "--set", "data.on_leakage=error") == 1
    assert "1 train question(s) also appear in val/test" in capsys.readouterr().err


def test_01_refuses_raw_files_changed_after_00(tmp_path, synth, capsys):
    out = tmp_path / "outputs"
    assert run_stage("00_check_data", out, "--set", f"data.path={synth}") == 0
    with (synth / "val.jsonl").open("a") as fh:
        fh.write("\n")
    assert run_stage("01_prepare_dataset", out, "--set", f"data.path={synth}") == 1
    assert "changed since 00_check_data validated it" in capsys.readouterr().err


def test_missing_parent_says_which_stage_to_run(tmp_path, capsys):
    assert run_stage("02_build_rewards", tmp_path / "o") == 1
    assert "run 01_prepare_dataset.py (or 09_driver.py) for run 't' first" in capsys.readouterr().err


def test_missing_dataset_directory_is_explained(tmp_path, capsys):
    assert run_stage("00_check_data", tmp_path / "o", "--set", f"data.path={tmp_path / 'nope'}") == 1
    assert "dataset directory not found (run `bash download.sh`" in capsys.readouterr().err


def test_load_split_rejects_non_object_rows(tmp_path):
    (tmp_path / "train.json").write_text("[1, 2]")
    with pytest.raises(DataError, match=r"train.json, row 1: expected an object, got int"):
        load_split("hotpotqa", tmp_path, "train")


def test_check_refuses_synthetic_files_generated_with_other_knobs(tmp_path, synth, capsys):
    out = tmp_path / "outputs"
    data = ["--set", f"data.path={synth}", "--set", "data.n_train=60", "--set", "data.n_val=10",
            "--set", "data.n_test=20"]
    made = DataConfig().max_steps  # what the fixture's files were generated with
    assert run_stage("00_check_data", out, *data, "--set", f"data.max_steps={made + 1}") == 1
    err = capsys.readouterr().err
    assert f"{synth / 'manifest.json'}" in err and f"max_steps: files have {made}, config has {made + 1}" in err
    assert "bash download.sh" in err
    assert manifest(out, "00_check_data")["status"] == "failed"
    assert run_stage("00_check_data", out, *data) == 0  # the knobs the files were made with pass
    assert run_stage("00_check_data", out, *data, "--set", "data.n_val=11") == 0  # sizes: a warning
    assert any("n_val: files have 10, config has 11" in w for w in manifest(out, "00_check_data")["warnings"])

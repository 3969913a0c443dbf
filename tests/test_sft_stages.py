"""Stages 03-04: SFT traces in the rollout protocol, masked LoRA SFT, resume after a kill."""
import json
import re
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from transformers import AutoTokenizer

from helpers import FIXTURES, kill_once_logged, manifest, run_stage, sft_args
from utils.core.config import ROOT, ConfigError
from utils.core.schema import DataConfig, LoraConfig, TemplatesConfig, WarmupConfig

def _records(out):
    return [json.loads(x) for x in (out / "t" / "03_generate_sft_traces" / "sft_traces.jsonl").read_text().splitlines()]


def test_gold_traces_follow_the_rollout_protocol(prepared, base_dir):
    out, args = prepared
    # no length cap (the default task's tier caps demonstrations at 4 subtasks + 16 longer): one per row
    assert run_stage("03_generate_sft_traces", out, *args, "--set", "traces.max_subtasks=0") == 0
    recs = _records(out)
    assert len(recs) == 60
    tok = AutoTokenizer.from_pretrained(base_dir)
    rec = recs[0]
    planner = next(e for e in rec["examples"] if e["role"] == "planner")
    trained = tok.decode([i for i, m in zip(planner["ids"], planner["mask"]) if m])
    assert trained == "".join(rec["planner_turns"])  # only the planner's own turns are trained
    full = tok.decode(planner["ids"], skip_special_tokens=True)
    assert full.startswith(f"plan: {rec['question']}\n") and "<result>" in full
    execs = [e for e in rec["examples"] if e["role"] == "executor"]
    assert len(execs) == len(rec["executor_calls"])
    for e, (task, text) in zip(execs, rec["executor_calls"]):
        assert tok.decode([i for i, m in zip(e["ids"], e["mask"]) if not m], skip_special_tokens=True) == f"solve: {task}\n"
        assert tok.decode([i for i, m in zip(e["ids"], e["mask"]) if m]) == text
    stats = json.loads((out / "t" / "03_generate_sft_traces" / "stats.json").read_text())
    assert stats["roles"]["executor"]["examples"] == sum(len(r["executor_calls"]) for r in recs)
    assert stats["acceptance_rate"] is None


def test_trace_caps_keep_short_chains_then_the_first_n(prepared):
    """traces.max_subtasks keeps only demonstrations of at most that many subtasks (recall vs extend);
    traces.long_traces lets the first N longer ones through too; traces.max_traces then keeps the first
    N of those, in train order."""
    out, args = prepared
    train = [json.loads(x) for x in (out / "t" / "01_prepare_dataset" / "train.jsonl").read_text().splitlines()]
    short = [r["id"] for r in train if len(r["meta"]["steps"]) <= 2]
    assert 0 < len(short) < len(train)  # the fixture has both lengths, so the cap can fail
    no_long = ("--set", "traces.long_traces=0")  # explicit: a tier may let longer ones through
    assert run_stage("03_generate_sft_traces", out, *args, "--set", "traces.max_subtasks=2", *no_long) == 0
    recs = _records(out)
    assert [r["qid"] for r in recs] == short
    assert all(len(r["executor_calls"]) <= 2 for r in recs)
    assert run_stage("03_generate_sft_traces", out, *args, "--set", "traces.max_subtasks=2", *no_long,
                     "--set", "traces.max_traces=5") == 0
    assert [r["qid"] for r in _records(out)] == short[:5]
    long_ids = [r["id"] for r in train if len(r["meta"]["steps"]) > 2]
    assert run_stage("03_generate_sft_traces", out, *args, "--set", "traces.max_subtasks=2",
                     "--set", "traces.long_traces=1") == 0  # one longer demonstration, the first
    assert [r["qid"] for r in _records(out)] == [r["id"] for r in train if r["id"] in short or r["id"] == long_ids[0]]


def test_solution_traces_from_gsm8k_worked_solutions(tmp_path):
    out = tmp_path / "o"
    args = ["--data", "gsm8k", "--set", f"data.path={FIXTURES / 'gsm8k'}", "--set", "data.n_val=1",
            "--set", "traces.source=solution"]
    for stage in ("00_check_data", "01_prepare_dataset", "02_build_rewards", "03_generate_sft_traces"):
        assert run_stage(stage, out, *args) == 0
    recs = _records(out)
    assert len(recs) >= 3 and all(r["source"] == "solution" for r in recs)
    for r in recs:  # every worked line "expr = n" became a subtask whose executor answers n
        for task, text in r["executor_calls"]:
            result = re.fullmatch(r"<think>(.+)=(.+)</think><answer>(.+)</answer>", text)
            assert result and result.group(1) == task and result.group(2) == result.group(3)
        assert r["planner_turns"][-1] == f"<think>{r['answer']}</think><answer>{r['answer']}</answer>"
    theo = [r for r in recs if r["question"].startswith("Theo")]
    assert not theo or theo[0]["executor_calls"][0] == ["4*3", "<think>4*3=12</think><answer>12</answer>"]


def _oracle(rows, right):
    """A teacher that is right by construction on the questions in `right` and off by one elsewhere:
    the planner delegates the whole question, the executor answers it, and the planner returns the
    executor's result."""
    gold = {r["question"]: r["answers"][0] for r in rows}

    def respond(role, prompt, call, occurrence):  # noqa: ARG001 - the same text at every call and sample
        if role == "executor":
            question = prompt.removeprefix("solve: ").strip()
            value = gold[question] if question in right else str(int(gold[question]) + 1)
            return f"<answer>{value}</answer>"  # no <think>: a 6-step question's would pass the token budget
        result = re.search(r"<result>(.*?)</result>", prompt)
        return f"<answer>{result.group(1)}</answer>" if result else f"<task>{prompt.split(chr(10))[0][6:]}</task>"
    return respond


def _train_rows(out):
    return [json.loads(x) for x in (out / "t" / "01_prepare_dataset" / "train.jsonl").read_text().splitlines()]


@pytest.mark.parametrize("cap", [0, 5])
def test_teacher_keeps_the_first_correct_episode_per_question(prepared, hf_base, base_dir, monkeypatch, cap):
    """Rejection sampling on a teacher whose right answers are known: exactly the questions it gets
    right are kept, once each, in train order, and the acceptance rate is kept / sampled. With
    traces.max_traces the teacher stops after the batch that reaches the cap (16 questions here,
    6 of them right: rows 0, 3, ..., 15), and the rate counts only what it sampled."""
    from utils.agent import engines
    from scripted import RuleEngine

    out, args = prepared
    rows = _train_rows(out)
    right = {r["question"] for i, r in enumerate(rows) if i % 3 == 0}
    teacher = RuleEngine(hf_base, AutoTokenizer.from_pretrained(base_dir), _oracle(rows, right))
    monkeypatch.setattr(engines, "make_engine", lambda *a, **k: teacher)
    assert run_stage("03_generate_sft_traces", out, *args, "--set", "traces.source=teacher",
                     "--set", f"traces.teacher_adapter={out.parent / 'teacher'}", "--set", "traces.teacher_samples=2",
                     "--set", "traces.teacher_batch=16", "--set", f"traces.max_traces={cap}") == 0
    assert teacher.closed and teacher.adapters == [out.parent / "teacher"]
    sampled = rows[:16] if cap else rows
    kept = [r for r in sampled if r["question"] in right]
    assert len(kept) == (6 if cap else 20)
    stats = json.loads((out / "t" / "03_generate_sft_traces" / "stats.json").read_text())
    assert (stats["accepted_episodes"], stats["sampled_episodes"]) == (len(kept), 2 * len(sampled))
    assert manifest(out, "03_generate_sft_traces")["metrics"]["acceptance_rate"] == round(len(kept) / (2 * len(sampled)), 4)
    recs = _records(out)
    assert [r["qid"] for r in recs] == [r["id"] for r in kept][:cap or None]
    tok = AutoTokenizer.from_pretrained(base_dir)
    for rec, row in zip(recs, kept):
        assert rec["source"] == "teacher" and rec["answer"] == row["answers"][0]
        value = row["answers"][0]  # the executor's answer, returned by the planner
        assert rec["executor_calls"] == [[row["question"], f"<answer>{value}</answer>"]]
        planner = next(e for e in rec["examples"] if e["role"] == "planner")
        assert tok.decode([i for i, m in zip(planner["ids"], planner["mask"]) if m]) == "".join(rec["planner_turns"])


def test_teacher_traces_from_a_real_engine(prepared, protocol_adapter, capsys):
    """The same stage on the real HF engine and the quickly trained protocol adapter, which follows
    the protocol but rarely gets the arithmetic right. Whether any of its 120 sampled episodes is
    right depends on the CPU's kernels (none on the Intel AVX-512 box, some on the AVX2 one; on the
    AMD AVX-512 box one answered `56</answer` for 56, which `numeric` scores right and 03 now
    refuses; the test above pins the counts), so both outcomes are checked: every kept trace is correct, once
    per question, and the rate is kept / sampled; or the stage fails naming the source, its
    manifest says failed and no traces file is left."""
    out, args = prepared
    code = run_stage("03_generate_sft_traces", out, *args, "--set", "traces.source=teacher",
                     "--set", f"traces.teacher_adapter={protocol_adapter}", "--set", "model.engine.name=hf",
                     "--set", "traces.teacher_samples=2")
    stage = out / "t" / "03_generate_sft_traces"
    if code != 0:
        err = capsys.readouterr().err
        assert "no usable traces from 60 rows" in err and "with source 'teacher'" in err
        assert manifest(out, "03_generate_sft_traces")["status"] == "failed"
        assert not (stage / "sft_traces.jsonl").exists()
        return
    gold = {r["id"]: r["answers"][0] for r in _train_rows(out)}
    recs = _records(out)
    assert recs and all(rec["answer"] == gold[rec["qid"]] for rec in recs)  # only correct, clean answers kept
    assert len({rec["qid"] for rec in recs}) == len(recs)  # one per question
    stats = json.loads((stage / "stats.json").read_text())
    assert (stats["accepted_episodes"], stats["sampled_episodes"]) == (len(recs), 120)


def test_sft_changes_every_lora_parameter_and_no_base_weight(base_dir, tmp_path):
    """TRL-style: train briefly, then every trainable (LoRA) tensor moved and no base weight did."""
    from utils.agent.rollout import Codec
    from utils.agent.traces import gold_examples
    from utils.train.policy import load_policy
    from utils.train.sft_trainer import SftLoop
    from utils.data.synthetic import generate_rows

    tok = AutoTokenizer.from_pretrained(base_dir)
    rows = [{"id": r["id"], "question": r["question"], "answers": [str(r["answer"])], "meta": {"steps": r["steps"]}}
            for r in generate_rows(DataConfig(n_train=40, n_val=0, n_test=0))["train"]]
    examples = gold_examples(rows, Codec(tok, TemplatesConfig()))
    model = load_policy(base_dir, LoraConfig())
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    loop = SftLoop(model, examples, WarmupConfig(steps=5, batch_size=8, warmup_steps=1, eval_every=0, save_every=5),
                   seed=0, pad_id=tok.pad_token_id, out_dir=tmp_path, validate=None, config_sha="x")
    loop.run()
    lora = [n for n, p in model.named_parameters() if p.requires_grad]
    assert lora and all("lora_" in n for n in lora)
    for name, p in model.named_parameters():
        if p.requires_grad:
            assert not torch.equal(p, before[name]), f"{name} did not change"
        else:
            assert torch.equal(p, before[name]), f"frozen {name} changed"
    assert (tmp_path / "ckpt_sft" / "final" / "adapter_model.safetensors").is_file()


def test_lr_schedule_warms_up_then_decays_to_the_final_ratio():
    from utils.train.schedule import warmup_cosine

    assert [warmup_cosine(s, 4, 20, final=0.1) for s in (0, 3)] == [0.25, 1.0]
    assert warmup_cosine(20, 4, 20, final=0.1) == pytest.approx(0.1)  # cosine down to 10%
    assert warmup_cosine(12, 4, 20, final=0.5) == pytest.approx(0.75)  # halfway: midpoint of 1 and 0.5
    assert {warmup_cosine(s, 4, 20, final=1.0) for s in range(4, 30)} == {1.0}  # constant after warmup
    assert [warmup_cosine(s, 4, 20, final=0.5, decay_start=12) for s in (5, 11, 12)] == [1.0, 1.0, 1.0]  # flat
    assert warmup_cosine(16, 4, 20, final=0.5, decay_start=12) == pytest.approx(0.75)  # half of the decay
    assert warmup_cosine(20, 4, 20, final=0.5, decay_start=12) == pytest.approx(0.5)


def test_sft_stage_writes_adapters_logs_and_validation(prepared):
    out, args = prepared
    assert run_stage("03_generate_sft_traces", out, *args) == 0
    assert run_stage("04_sft_warmup", out, *args, *sft_args()) == 0
    stage = out / "t" / "04_sft_warmup"
    for name in ("ckpt_sft/best/adapter_config.json", "ckpt_sft/final/adapter_model.safetensors",
                 "valid_samples/step_12.json", "logs/train.jsonl"):
        assert (stage / name).is_file(), name
    m = manifest(out, "04_sft_warmup")
    assert m["status"] == "completed" and m["metrics"]["steps"] == 12
    assert m["metrics"]["final_val_accuracy"] is not None
    val = json.loads((stage / "valid_samples" / "step_12.json").read_text())
    assert val["metrics"]["n"] == 4 and len(val["samples"]) == 4


def _losses(stage_out: Path) -> list[tuple[int, float]]:
    rows = [json.loads(x) for x in (stage_out / "logs" / "train.jsonl").read_text().splitlines()]
    return [(r["step"], r["loss"]) for r in rows]


@pytest.mark.parametrize("saves", [[], ["--set", "warmup.save_every=1000", "--set", "warmup.save_minutes=0.0001"]],
                         ids=["every_3_steps", "by_time_alone"])
def test_killed_sft_run_resumes_without_lost_or_repeated_steps(prepared, tmp_path, monkeypatch, saves):
    """Killed once step 7 is logged, the run resumes from its last checkpoint (a multiple of 3 when it
    saves every 3 steps; any step from 6 when only the time floor saves, at 0.0001 minutes after every
    step), and ends with the uninterrupted run's losses and trained-token count."""
    out, args = prepared
    assert run_stage("03_generate_sft_traces", out, *args) == 0
    shutil.copytree(out / "t", out / "ref")  # an uninterrupted reference run in a second run id
    # the two runs compare bit for bit, so neither may take a load-dependent path: one thread, and
    # MKL's reproducible mode (without it, a loaded CI box once gave step 1 losses 6e-6 apart)
    monkeypatch.setenv("MKL_CBWR", "AUTO,STRICT")
    monkeypatch.setenv("MKL_DYNAMIC", "FALSE")
    cmd = [sys.executable, "04_sft_warmup.py", "--set", f"outputs_dir={out}", *args,
           *sft_args(["--set", "warmup.steps=30", "--set", "threads=1", *saves])]
    assert subprocess.run(cmd + ["--run_id", "ref"], cwd=ROOT, capture_output=True).returncode == 0
    reference = _losses(out / "ref" / "04_sft_warmup")
    # the interrupted run: SIGKILL once step 7 is logged (checkpoint at 6), then run again
    log = out / "t" / "04_sft_warmup" / "logs" / "train.jsonl"
    code = kill_once_logged(cmd + ["--run_id", "t"], ROOT, log, lines=7, timeout=300)
    assert code == -signal.SIGKILL, "the run finished before it could be killed"
    assert manifest(out, "04_sft_warmup")["status"] == "running"
    second = subprocess.run(cmd + ["--run_id", "t"], cwd=ROOT, capture_output=True, text=True)
    assert second.returncode == 0, second.stderr
    step = int(re.search(r"resuming from step (\d+)", second.stdout)[1])
    assert step >= 6 and (saves or step % 3 == 0), second.stdout  # by time alone: a checkpoint at (nearly) every step
    resumed = _losses(out / "t" / "04_sft_warmup")
    assert [s for s, _ in resumed] == list(range(1, 31))  # every step once
    assert resumed == reference  # and the same losses as the uninterrupted run
    ref = json.loads((out / "ref" / "04_sft_warmup" / "manifest.json").read_text())  # trained tokens survive the kill
    assert manifest(out, "04_sft_warmup")["metrics"]["trained_tokens"] == ref["metrics"]["trained_tokens"] == sum(
        json.loads(x)["tokens"] for x in log.read_text().splitlines()) > 0


def test_sft_skips_non_finite_steps_and_stops_after_k_in_a_row(base_dir, tmp_path, monkeypatch):
    """A NaN loss or an inf gradient skips the update (counted in the log); the checkpoints written
    around it hold only finite tensors; warmup.max_skips_in_a_row skips in a row stop the run."""
    from safetensors.torch import load_file

    import utils.train.sft_trainer as st
    from utils.agent.rollout import Codec
    from utils.core.stages import StageError
    from utils.agent.traces import gold_examples
    from utils.train.policy import load_policy
    from utils.data.synthetic import generate_rows

    tok = AutoTokenizer.from_pretrained(base_dir)
    rows = [{"id": r["id"], "question": r["question"], "answers": [str(r["answer"])], "meta": {"steps": r["steps"]}}
            for r in generate_rows(DataConfig(n_train=40, n_val=0, n_test=0))["train"]]
    examples = gold_examples(rows, Codec(tok, TemplatesConfig()))
    real, calls = st.sft_backward, {"n": 0}

    def faulty(model, *args, **kwargs):  # step 2: NaN loss; step 3: inf gradient
        calls["n"] += 1
        loss, ent = real(model, *args, **kwargs)
        if calls["n"] == 3:  # one more backward, into the accumulated gradient
            (next(p for p in model.parameters() if p.requires_grad).sum() * float("inf")).backward()
        return (loss * float("nan") if calls["n"] == 2 else loss), ent
    monkeypatch.setattr(st, "sft_backward", faulty)

    def loop(out, steps, k):
        model = load_policy(base_dir, LoraConfig())
        cfg = WarmupConfig(steps=steps, batch_size=8, warmup_steps=1, eval_every=0, save_every=1, max_skips_in_a_row=k)
        return st.SftLoop(model, examples, cfg, seed=0, pad_id=tok.pad_token_id, out_dir=out, validate=None,
                          config_sha="x")
    loop(tmp_path / "a", 4, 3).run()
    log = [json.loads(x) for x in (tmp_path / "a" / "logs" / "train.jsonl").read_text().splitlines()]
    assert [r["skipped_nonfinite"] for r in log] == [0, 1, 1, 0]
    weights = load_file(tmp_path / "a" / "ckpt_sft" / "last" / "weights" / "adapter_model.safetensors")
    assert weights and all(torch.isfinite(t).all() for t in weights.values())
    calls["n"] = 0
    with pytest.raises(StageError, match=r"steps 2-3: 2 SFT steps in a row skipped .*max_skips_in_a_row"):
        loop(tmp_path / "b", 8, 2).run()


def test_the_imperfect_teacher_stops_a_share_of_chains_one_subtask_early(prepared):
    """traces.flaw_rate: the chosen chains (2+ subtasks; drawn from (seed, question id), so the same
    on any CPU) lose their last subtask and answer the result before it; every other trace is the
    gold one, byte for byte; 1-subtask chains are never flawed."""
    from utils.agent.traces import stops_early
    from utils.core.loader import load_run_config

    out, args = prepared
    no_cap = ("--set", "traces.max_subtasks=0")
    assert run_stage("03_generate_sft_traces", out, *args, *no_cap) == 0
    gold = {r["qid"]: r for r in _records(out)}
    assert run_stage("03_generate_sft_traces", out, *args, *no_cap, "--set", "traces.flaw_rate=0.5") == 0
    recs, rows = _records(out), {r["id"]: r for r in _train_rows(out)}
    seed = load_run_config().seed
    chosen = [q for q in gold if stops_early(q, len(rows[q]["meta"]["steps"]), 0.5, seed)]
    assert 10 <= len(chosen) <= 40 and manifest(out, "03_generate_sft_traces")["metrics"]["flawed_traces"] == len(chosen)
    for rec in recs:
        steps = rows[rec["qid"]]["meta"]["steps"]
        if rec["qid"] not in chosen:
            assert rec == gold[rec["qid"]] and "flawed" not in rec
            continue
        assert rec["flawed"] and len(steps) >= 2
        assert rec["executor_calls"] == gold[rec["qid"]]["executor_calls"][:-1]  # the last subtask is never asked
        assert rec["answer"] == str(steps[-2]["result"]) != rows[rec["qid"]]["answers"][0]
        assert rec["planner_turns"][-1].endswith(f"<answer>{steps[-2]['result']}</answer>")
    assert not any(stops_early("q", 1, 1.0, seed) for _ in range(3)) and stops_early("q", 2, 1.0, seed)
    assert run_stage("03_generate_sft_traces", out, *args, "--set", "traces.flaw_rate=1.5") == 1


def test_flaws_drawn_per_length_give_each_length_the_rate_exactly(prepared):
    """traces.flaw_draw=length: of the traced chains of each gold length >= 2, round(rate x count)
    flawed (halves up), each the same record the per-question teacher writes for a flawed chain; the
    rest are gold byte for byte."""
    from utils.agent.traces import flawed_by_length

    out, args = prepared
    no_cap = ("--set", "traces.max_subtasks=0")
    assert run_stage("03_generate_sft_traces", out, *args, *no_cap) == 0
    gold = {r["qid"]: r for r in _records(out)}
    assert run_stage("03_generate_sft_traces", out, *args, *no_cap, "--set", "traces.flaw_rate=1.0") == 0
    flawed_form = {r["qid"]: r for r in _records(out)}
    assert run_stage("03_generate_sft_traces", out, *args, *no_cap, "--set", "traces.flaw_rate=0.5",
                     "--set", "traces.flaw_draw=length") == 0
    recs, rows = _records(out), {r["id"]: r for r in _train_rows(out)}
    counts: dict[int, list[int]] = {}
    for rec in recs:
        n = len(rows[rec["qid"]]["meta"]["steps"])
        counts.setdefault(n, [0, 0])[0] += bool(rec.get("flawed"))
        counts[n][1] += 1
        assert rec == (flawed_form if rec.get("flawed") else gold)[rec["qid"]]
    assert counts[1][0] == 0 and len(counts) >= 3
    assert all(f == int(0.5 * total + 0.5) for n, (f, total) in counts.items() if n >= 2), counts
    assert manifest(out, "03_generate_sft_traces")["metrics"]["flawed_traces"] == sum(f for f, _ in counts.values())
    lengths = {f"q{i}": 2 + i % 3 for i in range(30)}  # ten chains each of 2, 3 and 4 subtasks
    picked = flawed_by_length(lengths, 0.35, seed=7)
    assert [sum(lengths[q] == n for q in picked) for n in (2, 3, 4)] == [4, 4, 4]  # 3.5 rounds up
    assert picked == flawed_by_length(lengths, 0.35, seed=7) != flawed_by_length(lengths, 0.35, seed=8)
    assert flawed_by_length({"a": 1, "b": 1}, 1.0, 0) == set() and flawed_by_length(lengths, 0.0, 0) == set()
    with pytest.raises(ConfigError, match="flaw_rate: 1.5 is not a share"):
        flawed_by_length(lengths, 1.5, 0)


def test_patience_stops_after_validations_without_a_better_one_and_a_resume_stays_stopped(base_dir, tmp_path):
    """warmup.patience=2, validations every 2 steps scoring 0.1, 0.3, 0.2, 0.25, (0.28, 0.29): the run
    stops at step 8, after the second validation below 0.3. Its steps are the full run's (same losses
    under the same lr schedule), its best adapter is the full run's (step 4) byte for byte, and a
    resumed stopped run trains no more."""
    from utils.agent.rollout import Codec
    from utils.agent.traces import gold_examples
    from utils.train.policy import load_policy
    from utils.train.sft_trainer import SftLoop
    from utils.data.synthetic import generate_rows

    tok = AutoTokenizer.from_pretrained(base_dir)
    rows = [{"id": r["id"], "question": r["question"], "answers": [str(r["answer"])], "meta": {"steps": r["steps"]}}
            for r in generate_rows(DataConfig(n_train=40, n_val=0, n_test=0))["train"]]
    examples = gold_examples(rows, Codec(tok, TemplatesConfig()))
    scores = {2: 0.1, 4: 0.3, 6: 0.2, 8: 0.25, 10: 0.28, 12: 0.29}

    def run(out, patience):
        torch.manual_seed(0)
        model = load_policy(base_dir, LoraConfig())
        cfg = WarmupConfig(steps=12, batch_size=8, warmup_steps=1, eval_every=2, save_every=3, patience=patience)
        loop = SftLoop(model, examples, cfg, seed=0, pad_id=tok.pad_token_id, out_dir=out, config_sha="x",
                       validate=lambda _d, step: {"accuracy": scores[step]})
        loop.try_resume()
        return loop.run()

    def log(run_dir):
        lines = (run_dir / "logs" / "train.jsonl").read_text().splitlines()
        return [{k: v for k, v in json.loads(x).items() if k != "time/step"} for x in lines]

    full, stopped = run(tmp_path / "full", 0), run(tmp_path / "stopped", 2)
    assert (full.step, full.best_step, [h["step"] for h in full.history]) == (12, 4, [2, 4, 6, 8, 10, 12])
    assert (stopped.step, stopped.best_step, [h["step"] for h in stopped.history]) == (8, 4, [2, 4, 6, 8])
    assert log(tmp_path / "stopped") == log(tmp_path / "full")[:8]
    best = [(d / "ckpt_sft" / "best" / "adapter_model.safetensors").read_bytes() for d in (tmp_path / "full", tmp_path / "stopped")]
    assert best[0] == best[1]
    assert run(tmp_path / "stopped", 2).step == 8 and len(log(tmp_path / "stopped")) == 8  # resumed: still stopped

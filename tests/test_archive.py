"""utils/run/archive.py: a study's records, archived without their transcripts, give 08 the same
summary, tests and curves as the run itself; seeds archived apart join one archive; a bad evaluation
stops the archive before it writes; 08 refuses one seed read from two places."""
import csv
import json
import shutil
import subprocess
import sys

from utils.core.config import ROOT
from utils.run.archive import archive, slim_record
from helpers import evaluation_dir, run_compare

TRANSCRIPT = "Planner: <task>" + "7 + 5 = ? " * 60 + "</task>"  # longer than any field the archive keeps


def _study(run, seeds, lift=0):
    """A run folder with sft_warmup, grpo and red evaluated on 40 items per seed, each record with a
    transcript and sample counts, as 07 writes them."""
    for seed in seeds:
        warmup = run / f"seed_{seed}" / "04_sft_warmup"
        (warmup / "ckpt_sft").mkdir(parents=True)
        (warmup / "ckpt_sft" / "adapter_model.safetensors").write_bytes(b"weights")
        (warmup / "manifest.json").write_text(json.dumps({"stage": "04_sft_warmup", "status": "completed", "seed": seed,
                                                          "config": {"warmup": {"steps": 800}}}))
        for method, right in (("sft_warmup", 12), ("grpo", 20 + seed + lift), ("red", 21 + seed)):
            evaluation_dir(run / f"seed_{seed}", method, seed, [float(i < right) for i in range(40)])
            preds = run / f"seed_{seed}" / "07_evaluate" / method / "samples" / "predictions.jsonl"
            rows = [json.loads(line) for line in preds.read_text().splitlines()]
            for i, r in enumerate(rows):
                r.update(transcript=TRANSCRIPT, prediction=str(i), curve_correct=min(i, 8), curve_n=8, status="answered")
            preds.write_text("".join(json.dumps(r) + "\n" for r in rows))


def _summary(tmp_path, runs):
    out = tmp_path / "cmp"
    shutil.rmtree(out, ignore_errors=True)
    proc = run_compare(tmp_path, "--runs", *map(str, runs), "--out", str(out), "--resamples", "200")
    assert proc.returncode == 0, proc.stderr
    rows = list(csv.DictReader(open(out / "summary.csv")))
    report = (out / "report.md").read_text()
    return [{k: v for k, v in r.items() if k != "source"} for r in rows], report


def test_slim_record_drops_the_transcript_and_long_fields_and_keeps_the_sample_scores():
    row = {"qid": "test-001", "answer": 1.0, "ok": True, "error": None, "golds": ["48"], "sampled": [1.0, 0.0] * 64,
           "curve_n": 64, "transcript": "plan: 1+1", "turns_detail": [{"role": "planner", "text": TRANSCRIPT}]}
    assert slim_record(row) == {"qid": "test-001", "answer": 1.0, "ok": True, "error": None, "golds": ["48"],
                                "sampled": [1.0, 0.0] * 64, "curve_n": 64}


def test_08_reads_an_archive_as_it_reads_the_run(tmp_path):
    run = tmp_path / "outputs" / "study"
    _study(run, (1, 2, 3))
    dest = tmp_path / "records" / "study"
    outcome = archive(run, dest)
    assert len(outcome["added"]) == 3 * 3 + 3 * 2 + 3 and not outcome["replaced"]  # 9 evaluations, 6 trainings, 3 warmups
    assert sorted(p.name for p in (dest / "seed_3" / "04_sft_warmup").iterdir()) == ["manifest.json"]
    preds = (dest / "seed_1" / "07_evaluate" / "red" / "samples" / "predictions.jsonl").read_text()
    assert "transcript" not in preds and '"curve_n": 8' in preds
    assert len(preds) < 0.2 * len((run / "seed_1" / "07_evaluate" / "red" / "samples" / "predictions.jsonl").read_text())
    index = json.loads((dest / "archive.json").read_text())
    assert index["seed_2/06_ablate_grpo_only/grpo"]["kind"] == "training"
    assert index["seed_2/07_evaluate/red"]["source"] == "study/seed_2/07_evaluate/red" and index["seed_2/07_evaluate/red"]["archived_on"]

    from_run, report_run = _summary(tmp_path, [run])
    from_archive, report_archive = _summary(tmp_path, [dest])
    assert from_archive == from_run and len(from_run) == 9
    tests = lambda r: [line for line in r.splitlines() if line.startswith("| ") and "−" in line]  # noqa: E731
    assert tests(report_archive) == tests(report_run) and tests(report_run)
    assert "pass@k" in report_archive and "04's configured steps, study: 800" in report_archive


def test_seeds_archived_apart_join_and_a_rerun_replaces_only_what_changed(tmp_path):
    dest = tmp_path / "records" / "study"
    first, second = tmp_path / "outputs" / "study", tmp_path / "other" / "outputs" / "study"
    _study(first, (1, 2))
    _study(second, (2, 9), lift=5)  # seed 2 again, its grpo better; seed 9 is new
    archive(first, dest)
    assert archive(first, dest) == {"added": [], "replaced": [], "unchanged": sorted(
        f"seed_{s}/{d}" for s in (1, 2) for d in ("04_sft_warmup", "05_train_red_grpo/red", "06_ablate_grpo_only/grpo",
                                                  "07_evaluate/grpo", "07_evaluate/red",
                                                  "07_evaluate/sft_warmup"))}
    outcome = archive(second, dest)
    assert "seed_2/07_evaluate/grpo" in outcome["replaced"] and "seed_2/07_evaluate/red" in outcome["unchanged"]
    assert "seed_9/07_evaluate/red" in outcome["added"]
    assert sorted(p.name for p in dest.iterdir()) == ["archive.json", "seed_1", "seed_2", "seed_9"]
    assert not list(dest.rglob("*.tmp"))
    metrics = json.loads((dest / "seed_2" / "07_evaluate" / "grpo" / "metrics.json").read_text())
    assert metrics["accuracy"] == (20 + 2 + 5) / 40


def test_a_bad_evaluation_stops_the_archive_before_it_writes(tmp_path):
    run, dest = tmp_path / "outputs" / "study", tmp_path / "records" / "study"
    _study(run, (1,))
    archive(run, dest)
    before = {p: p.read_bytes() for p in dest.rglob("*") if p.is_file()}
    _study(run, (4,))
    bad = run / "seed_4" / "07_evaluate" / "red" / "samples" / "predictions.jsonl"
    rows = bad.read_text().splitlines()
    rows[6] = json.dumps({"qid": "test-006"})  # its score is gone
    bad.write_text("\n".join(rows) + "\n")
    proc = subprocess.run([sys.executable, "-m", "utils.run.archive", str(run), str(dest)], cwd=ROOT,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2
    assert "predictions.jsonl" in proc.stderr and "row 7" in proc.stderr and "answer" in proc.stderr, proc.stderr
    assert {p: p.read_bytes() for p in dest.rglob("*") if p.is_file()} == before
    empty = tmp_path / "outputs" / "empty"
    empty.mkdir()
    proc = subprocess.run([sys.executable, "-m", "utils.run.archive", str(empty), str(dest)], cwd=ROOT,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and "nothing to archive" in proc.stderr


def test_08_refuses_one_seed_read_from_two_places(tmp_path):
    run, dest = tmp_path / "outputs" / "study", tmp_path / "records" / "study"
    _study(run, (1, 2))
    archive(run, dest)
    proc = run_compare(tmp_path, "--runs", str(run), str(dest), "--out", str(tmp_path / "cmp"), "--resamples", "200")
    assert proc.returncode != 0
    assert "two evaluations of run study, seed 1, grpo" in proc.stderr and "records/study/seed_1" in proc.stderr
    assert not (tmp_path / "cmp" / "report.md").exists()


def test_an_archive_killed_between_its_renames_loses_neither_folder_and_the_next_one_finishes(tmp_path):
    """A replaced folder goes in through publish_dir: a SIGKILL between moving the old folder aside and
    renaming the new one in leaves the old one aside, which the next archive puts back and replaces."""
    import os

    from utils.core.faults import FAULT_ENV

    first, second, dest = tmp_path / "outputs" / "study", tmp_path / "other" / "outputs" / "study", tmp_path / "records"
    _study(first, (2,))
    _study(second, (2,), lift=5)  # seed 2's grpo evaluation differs, so its folder is replaced
    archive(first, dest)
    target = dest / "seed_2" / "07_evaluate" / "grpo"
    proc = subprocess.run([sys.executable, "-m", "utils.run.archive", str(second), str(dest)], cwd=ROOT,
                          env={**os.environ, FAULT_ENV: "publish:grpo"}, start_new_session=True,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == -9, proc.stderr
    aside = list(target.parent.glob(".grpo.old-*"))
    assert not target.exists() and len(aside) == 1  # killed with the old folder aside, the new one not yet in
    assert json.loads((aside[0] / "metrics.json").read_text())["accuracy"] == (20 + 2) / 40
    outcome = archive(second, dest)
    assert "seed_2/07_evaluate/grpo" in outcome["replaced"]
    assert json.loads((target / "metrics.json").read_text())["accuracy"] == (20 + 2 + 5) / 40
    assert not list(dest.rglob(".*"))  # nothing aside or half-built is left

"""Archive a study's records: `python -m utils.run.archive RUN DEST`.

Copies what 08_compare_runs reads from a run folder (outputs/<run_id>, or a run id) into DEST, in the
same layout, so that 08 re-derives every verdict, table and curve of the run from DEST alone
(`08_compare_runs.py --runs DEST`) and later seeds join it from another session or machine:

- every completed `07_evaluate/<checkpoint>/`: metrics.json, manifest.json and
  samples/predictions.jsonl without each record's transcript (`slim_record`), under half its size;
- every completed trainer's metrics.jsonl and manifest.json (05_train_red_grpo/<method>/,
  06_ablate_grpo_only/<method>/), for the training curves and RED's mechanism;
- each seed's 04_sft_warmup/manifest.json, for the warmup the arms started from.

DEST is named like the run it holds (`docs/records/study` holds `study`): 08 names a run outside
outputs/ by its folder. What DEST already holds and RUN lacks is kept (a seed archived in an earlier
session stays); what both hold is replaced by RUN's. Every evaluation is checked as 08 checks it
before anything is written, and each folder is written whole or not at all (built beside its place,
then renamed). DEST/archive.json lists each archived folder with its source, the commit that
wrote it and the CPU of the machine that archived it (archive on the box that ran the study).
Exit status 0, or 2 on an error, named with its file.
"""
from __future__ import annotations

import argparse
import json
import platform
import shutil
import sys
from pathlib import Path

from utils.core.config import ROOT
from utils.core.errors import StageError
from utils.core.io import jsonl_text, read_records
from utils.core.files import atomic_write_json, publish_dir, recover_aside
from utils.core.manifest import MANIFEST_NAME, read_manifest
from utils.core.provenance import utc_now
from utils.core.methods import TRAINERS
from utils.eval.compare import CompareError, evaluation_dirs, find_run_dirs, load_evaluation, load_trainings
from utils.run.diff import find_run

INDEX = "archive.json"
WARMUP = "04_sft_warmup"  # its manifest: the report names the warmup each run's arms started from
TRANSCRIPTS = ("transcript",)  # 07's record of each episode's turns: most of a record's bytes
KEEP = ("sampled",)  # mean@k's per-sample scores, kept whatever their length: 08 reads them
LONGEST = 200  # any other field whose JSON is longer than this stays behind too


def slim_record(row: dict) -> dict:
    """A predictions.jsonl record without its transcript: its scores, counts, category, prediction and
    golds, everything 08 reads and whatever short fields a reader audits by."""
    return {key: value for key, value in row.items() if key not in TRANSCRIPTS
            and (key in KEEP or len(json.dumps(value, ensure_ascii=False)) <= LONGEST)}


def cpu_name() -> str:
    """This machine's CPU as the docs name boxes: model, family and widest vector extension
    ("AMD EPYC, family 25, AVX-512"); what /proc/cpuinfo lacks is left out."""
    fields: dict[str, str] = {}
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            key, _, value = line.partition(":")
            if not key.strip():
                break  # the first processor's block is enough
            fields.setdefault(key.strip(), value.strip())
    except OSError:
        pass
    flags = set(fields.get("flags", "").split())
    vector = "AVX-512" if "avx512f" in flags else "AVX2" if "avx2" in flags else None
    parts = [fields.get("model name") or platform.processor() or platform.machine(),
             f"family {fields['cpu family']}" if "cpu family" in fields else None, vector]
    return ", ".join(p for p in parts if p)


def _folder_files(kind: str, folder: Path) -> dict[str, bytes]:
    """{name inside the folder: bytes} of what the archive keeps of one evaluation or training."""
    if kind == "evaluation":
        preds = folder / "samples" / "predictions.jsonl"
        rows = [r for _, r in read_records(preds)]
        return {"metrics.json": (folder / "metrics.json").read_bytes(),
                MANIFEST_NAME: (folder / MANIFEST_NAME).read_bytes(),
                "samples/predictions.jsonl": jsonl_text(slim_record(r) for r in rows).encode()}
    if kind == "warmup":  # 08 reads the warmup's config (its steps) only; the checkpoint stays behind
        return {MANIFEST_NAME: (folder / MANIFEST_NAME).read_bytes()}
    return {"metrics.jsonl": (folder / "metrics.jsonl").read_bytes(), MANIFEST_NAME: (folder / MANIFEST_NAME).read_bytes()}


def collect(run: Path) -> dict[str, tuple[str, Path, dict]]:
    """{folder inside the run: (kind, source folder, its manifest)} for every completed evaluation,
    training and warmup, each evaluation loaded as 08 loads it first (a bad one stops the archive
    before anything is written) and the trainings found as 08 finds them (`load_trainings`)."""
    run_dirs = find_run_dirs([run])
    if not run_dirs:
        raise CompareError(f"{run}: no 07_evaluate/ folder in it or its seed_* folders: nothing to archive")
    outputs = ROOT / "outputs"
    found = {}
    for e in (load_evaluation(d, outputs) for d in evaluation_dirs(run_dirs)):
        found[e.directory.relative_to(run).as_posix()] = ("evaluation", e.directory, e.manifest)
    for t in load_trainings(run_dirs, outputs):
        if t.manifest.get("status") == "completed":
            found[t.directory.relative_to(run).as_posix()] = ("training", t.directory, t.manifest)
    for d in run_dirs:
        warmup = d / WARMUP
        if (warmup / MANIFEST_NAME).is_file() and (manifest := read_manifest(warmup)).get("status") == "completed":
            found[warmup.relative_to(run).as_posix()] = ("warmup", warmup, manifest)
    return found


def _write_folder(target: Path, files: dict[str, bytes]) -> None:
    """Build the folder beside `target`, then put it in place with `publish_dir` (utils/core/files.py:
    a kill between its renames leaves the old folder or the new one, which the next archive recovers)."""
    staging = target.with_name(f".{target.name}.new.tmp")
    shutil.rmtree(staging, ignore_errors=True)  # a build a kill cut short: never published, rebuilt whole
    for name, data in files.items():
        (staging / name).parent.mkdir(parents=True, exist_ok=True)
        (staging / name).write_bytes(data)
    publish_dir(staging, target)


def _same(target: Path, files: dict[str, bytes]) -> bool:
    return target.is_dir() and all((target / n).is_file() and (target / n).read_bytes() == b for n, b in files.items())


def archive(run: Path, dest: Path) -> dict[str, list[str]]:
    """Archive `run` into `dest`; returns {"added": [...], "replaced": [...], "unchanged": [...]}."""
    found = collect(run)
    recover_aside(dest)  # a folder an archive killed mid-replace left aside is back before anything is compared
    index_path = dest / INDEX
    index = json.loads(index_path.read_text()) if index_path.is_file() else {}
    if not isinstance(index, dict):
        raise CompareError(f"{index_path}: expected a JSON object of archived folders")
    outcome: dict[str, list[str]] = {"added": [], "replaced": [], "unchanged": []}
    source_cpu, archived_at = cpu_name(), utc_now()
    for name, (kind, folder, manifest) in sorted(found.items()):
        files = _folder_files(kind, folder)
        target = dest / name
        if _same(target, files):
            outcome["unchanged"].append(name)
            continue
        outcome["replaced" if target.exists() else "added"].append(name)
        _write_folder(target, files)
        index[name] = {"kind": kind, "source": folder.relative_to(run.parent).as_posix(), "archived_on": source_cpu,
                       "commit": manifest.get("git", {}).get("commit"), "archived_at": archived_at}
        atomic_write_json(index_path, dict(sorted(index.items())))
    return outcome


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m utils.run.archive", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("run", help="a run folder (outputs/<run_id>) or a run id")
    ap.add_argument("dest", help="the archive folder, named like the run (e.g. docs/records/study)")
    args = ap.parse_args(argv)
    try:
        outcome = archive(find_run(args.run), Path(args.dest))
    except (OSError, ValueError, StageError) as exc:  # DataError is a ValueError, CompareError a StageError
        print(f"utils.run.archive: error: {exc}", file=sys.stderr)
        return 2
    for what, names in outcome.items():
        print(f"{what}: {len(names)}" + "".join(f"\n  {n}" for n in names if what != "unchanged"))
    return 0


if __name__ == "__main__":
    sys.exit(main())

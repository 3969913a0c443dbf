"""Diff the manifests of two runs, stage by stage: `python -m utils.run.diff RUN_A RUN_B`.

A run is `outputs/<run_id>` (a path, or a run id looked up under `outputs/`). Every `manifest.json`
below it is one stage (`seed_1/05_train_red_grpo/red`, ...). For each stage both runs have, this
prints what differs:

- `status`, `seed`, `world_size`, `device`, the git commit and the package versions;
- config keys, dotted, with both values;
- the base model a stage loaded: its folder and each file's digest (utils/core/hashing.py
  `model_identity`);
- input, output and parent digests (paths inside the run are written `<run>/...`, so two run ids
  compare; a path only one side has is marked `only in A` / `only in B`);
- metrics, with B − A for numbers.

Stages only one run has are listed. Times, peak memory, seals and warnings always differ between
two runs and are left out unless `--all` (which shows them but does not count them as a
difference). Read-only. Exit status as `diff`'s: 0 when nothing else differs, 1 when something does, 2 on an error (a run that is not there, a manifest that is not
JSON), named with its file. Plain `diff -r` on the two folders keeps working: manifests are
sorted-key JSON (utils/core/files.py `canonical_json`).
"""
from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

from utils.core.config import ROOT
from utils.core.manifest import MANIFEST_NAME, SEAL_KEY, VOLATILE_KEYS, read_manifest

RUN_MANIFEST = "run_manifest.json"  # written by 09_driver.py (utils/driver.RunManifest)
HIDDEN = (*VOLATILE_KEYS, SEAL_KEY, "warnings")  # always differ between two runs; shown with --all
DIGESTS = ("inputs", "outputs", "parents")
NESTED = ("config", "metrics", "versions", "git", "model", *DIGESTS)  # compared key by key


def find_run(spec: str) -> Path:
    """`spec` as a run folder: a path, else `outputs/<spec>` under the repo root."""
    for path in (Path(spec), ROOT / "outputs" / spec):
        if path.is_dir():
            return path
    raise FileNotFoundError(f"{spec}: no such run folder" + ("" if "/" in spec else f" (nor outputs/{spec})"))


def stage_manifests(run: Path) -> dict[str, dict]:
    """{label: manifest} for every stage manifest below `run`, labelled by its folder inside the run,
    and the driver's `run_manifest.json` (its command, regime, methods, seeds), labelled `run`."""
    out = {}
    paths = sorted(run.rglob(MANIFEST_NAME)) + ([run / RUN_MANIFEST] if (run / RUN_MANIFEST).is_file() else [])
    for path in paths:
        manifest = read_manifest(path)  # names the file that is not JSON
        if not isinstance(manifest, dict):
            raise ValueError(f"{path}: a manifest is a JSON object, found {type(manifest).__name__}")
        if path.name == RUN_MANIFEST:  # its per-stage rows are the stages' own manifests, compared above
            manifest = {k: v for k, v in manifest.items() if k not in ("stages", "report")}
        out["run" if path.name == RUN_MANIFEST else path.parent.relative_to(run).as_posix()] = manifest
    return out


def flatten(value, prefix: str = "") -> dict:
    """Nested dicts as {"a.b.c": leaf}; lists and scalars are leaves."""
    if isinstance(value, dict) and value:
        out = {}
        for key, sub in value.items():
            out.update(flatten(sub, f"{prefix}.{key}" if prefix else str(key)))
        return out
    return {prefix: value}


def run_prefix(manifest: dict, label: str) -> str | None:
    """How the run's own folder is written in `manifest`'s paths: what precedes `<label>/` in one of
    its outputs. Manifests write paths relative to the repo root of the clone that ran them, else
    absolute (utils/core/files.py `rel`), so a copied or moved run keeps the paths of the first."""
    for path in manifest.get("outputs") or {}:
        at = path.find(f"/{label}/")
        if at >= 0:
            return path[:at]
    return None


def _in_run(path: str, prefix: str | None) -> str:
    if prefix and (path == prefix or path.startswith(prefix + "/")):
        return "<run>" + path[len(prefix):]
    return path


def _show(value) -> str:
    text = json.dumps(value, sort_keys=True)
    return text if len(text) <= 80 else text[:77] + "..."


def _delta(a, b) -> str:
    numbers = all(isinstance(x, (int, float)) and not isinstance(x, bool) for x in (a, b))
    if not numbers or not (math.isfinite(a) and math.isfinite(b)):
        return ""
    return f"  (B − A {b - a:+.6g})"


def key_changes(fa: dict, fb: dict):
    """(key, kind) for each key of two flattened dicts whose values differ, in key order: kind
    "removed" (only in `fa`), "added" (only in `fb`) or "changed"."""
    for key in sorted(set(fa) | set(fb)):
        if key not in fb:
            yield key, "removed"
        elif key not in fa:
            yield key, "added"
        elif fa[key] != fb[key]:
            yield key, "changed"


def compare_section(name: str, a: dict, b: dict, sep: str = ".") -> list[str]:
    """Lines for the keys of one nested section that differ: changed, only in A, only in B. Each is
    named `<name><sep><key>` (`sep` " " for digests, whose keys are paths)."""
    fa, fb = flatten(a or {}), flatten(b or {})
    say = {"removed": lambda k: f"only in A = {_show(fa[k])}", "added": lambda k: f"only in B = {_show(fb[k])}",
             "changed": lambda k: f"A {_show(fa[k])} | B {_show(fb[k])}{_delta(fa[k], fb[k])}"}
    return [f"  {name}{sep}{key}: {say[kind](key)}" for key, kind in key_changes(fa, fb)]


def _top_level(a: dict, b: dict, keys) -> list[str]:
    lines = []
    for key in sorted(keys):
        if a.get(key) != b.get(key):
            lines.append(f"  {key}: A {_show(a.get(key))} | B {_show(b.get(key))}{_delta(a.get(key), b.get(key))}")
    return lines


def compare_stage(a: dict, b: dict, label: str) -> list[str]:
    """What differs between two manifests of one stage, times, memory, seals and warnings aside.
    The config is compared key by key; its hash would only say that it differs."""
    lines = _top_level(a, b, (set(a) | set(b)) - {*HIDDEN, "config_sha256", *NESTED})
    for key in ("config", "metrics", "versions", "git"):
        lines += compare_section(key, a.get(key), b.get(key))
    ma, mb = ({"path": m.get("path"), **{n: d[:12] for n, d in m.get("files", {}).items()}} if m else {}
              for m in (a.get("model"), b.get("model")))
    lines += compare_section("model", ma, mb, sep=" ")
    prefix_a, prefix_b = run_prefix(a, label), run_prefix(b, label)
    for key in DIGESTS:
        da = {_in_run(p, prefix_a): str(d)[:12] for p, d in (a.get(key) or {}).items()}  # digests: 12 hex digits
        db = {_in_run(p, prefix_b): str(d)[:12] for p, d in (b.get(key) or {}).items()}
        lines += compare_section(key, da, db, sep=" ")
    return lines


def _same_parents_dropped(changes: dict[str, list[str]], label: str) -> list[str]:
    """The stage's changes without its parent-digest lines for parents that differ in nothing
    else (their own such lines dropped first): a digest covers the run's own paths, so it differs
    between any two run ids."""
    seed = label.split("/", 1)[0] + "/" if label.startswith("seed_") else ""
    return [line for line in changes[label]
            if not (line.startswith("  parents ") and not changes.get(seed + line.split()[1].rstrip(":"), True))]


def diff_runs(run_a: Path, run_b: Path, everything: bool = False, only: str | None = None) -> tuple[list[str], bool]:
    """(report lines, whether anything differs) for two run folders; `only`: stages whose label
    contains it."""
    ma, mb = stage_manifests(run_a), stage_manifests(run_b)
    if not ma and not mb:
        raise FileNotFoundError(f"{run_a} and {run_b}: no {MANIFEST_NAME} below either")
    changes: dict[str, list[str]] = {}
    for label in sorted(set(ma) & set(mb)):  # a stage's parents sort before it
        changes[label] = compare_stage(ma[label], mb[label], label)
        changes[label] = _same_parents_dropped(changes, label)
    lines, differs = [f"A = {run_a}", f"B = {run_b}"], False
    for label in sorted(set(ma) | set(mb)):
        if only and only not in label:
            continue
        if label not in mb or label not in ma:
            lines.append(f"{label}: only in {'A' if label in ma else 'B'}")
            differs = True
            continue
        differs |= bool(changes[label])
        shown = changes[label] + (_top_level(ma[label], mb[label], HIDDEN) if everything else [])
        if shown:
            lines += [f"{label}:", *shown]
    if not differs:
        lines.append("no differences" + ("" if everything else " (times, memory, seals and warnings not compared: --all)"))
    return lines, differs


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m utils.run.diff", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("run_a", help="a run folder (outputs/<run_id>) or a run id")
    ap.add_argument("run_b", help="the run to compare it with")
    ap.add_argument("--all", dest="everything", action="store_true",
                    help="also compare times, peak memory, seals and warnings")
    ap.add_argument("--stage", default=None, help="only stages whose label contains this (e.g. 05_train_red_grpo)")
    args = ap.parse_args(argv)
    try:
        lines, differs = diff_runs(find_run(args.run_a), find_run(args.run_b), args.everything, args.stage)
    except (OSError, ValueError) as exc:
        print(f"utils.run.diff: error: {exc}", file=sys.stderr)
        return 2
    print("\n".join(lines))
    return 1 if differs else 0


if __name__ == "__main__":
    sys.exit(main())

"""Manifests: deterministic bytes apart from times, atomic writes, honest status on failure or kill."""
import json
import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from utils.core import files, hashing, manifest as mf
from utils.core.config import ROOT
from utils.core.files import atomic_write_json
from utils.core.hashing import path_sha256
from utils.core.manifest import StageRun, VOLATILE_KEYS, manifest_digest, read_manifest


def _run_stage(out_dir, inp, config):
    with StageRun("01_demo", out_dir, config, seed=3) as run:
        run.add_input(inp)
        (out_dir / "rows.jsonl").write_text(inp.read_text().upper())
        run.add_output(out_dir / "rows.jsonl")
        run.metrics["n_rows"] = 2
    return (out_dir / "manifest.json").read_bytes()


def _strip_times(raw: bytes) -> list[str]:
    return [line for line in raw.decode().splitlines() if not any(f'"{k}"' in line for k in VOLATILE_KEYS)]


def test_same_stage_twice_gives_identical_manifest_apart_from_times(tmp_path):
    inp = tmp_path / "in.jsonl"
    inp.write_text('{"a": 1}\n{"a": 2}\n')
    out = tmp_path / "stage"
    first = _run_stage(out, inp, {"b": 2, "a": [1, 2]})
    time.sleep(0.01)
    second = _run_stage(out, inp, {"a": [1, 2], "b": 2})  # key order must not matter
    assert first != second  # the times differ...
    assert _strip_times(first) == _strip_times(second)  # ...and nothing else does
    data = json.loads(second)
    assert set(VOLATILE_KEYS) - {"peak_gpu_mb", "memory_estimate_gib"} <= set(data)
    assert "peak_gpu_mb" not in data  # written only by a process that started CUDA
    assert data["status"] == "completed"
    assert data["config_sha256"] == hashing.config_sha256({"a": [1, 2], "b": 2})
    assert data["inputs"] == {str(inp.resolve()): path_sha256(inp)}
    assert data["metrics"] == {"n_rows": 2}
    for key in ("git", "versions", "device", "seed", "parents", "outputs"):
        assert key in data
    assert list(data) == sorted(data)  # sorted keys, so diffs line up


def test_changed_input_changes_manifest_and_digest(tmp_path):
    inp = tmp_path / "in.jsonl"
    inp.write_text("x\n")
    out = tmp_path / "stage"
    d1 = manifest_digest(json.loads(_run_stage(out, inp, {"a": 1})))
    inp.write_text("y\n")
    d2 = manifest_digest(json.loads(_run_stage(out, inp, {"a": 1})))
    assert d1 != d2


def test_paths_inside_the_repo_are_stored_relative():
    assert files.rel(ROOT / "configs" / "data") == "configs/data"


def test_directory_hash_covers_names_and_contents(tmp_path):
    (tmp_path / "d").mkdir()
    (tmp_path / "d" / "a.bin").write_bytes(b"1")
    h1 = path_sha256(tmp_path / "d")
    (tmp_path / "d" / "a.bin").write_bytes(b"2")
    h2 = path_sha256(tmp_path / "d")
    (tmp_path / "d" / "a.bin").rename(tmp_path / "d" / "b.bin")
    h3 = path_sha256(tmp_path / "d")
    assert len({h1, h2, h3}) == 3


def test_failed_stage_records_failure_and_reraises(tmp_path):
    with pytest.raises(ZeroDivisionError):
        with StageRun("02_demo", tmp_path, {"a": 1}):
            1 / 0
    data = read_manifest(tmp_path)
    assert data["status"] == "failed"
    assert "ZeroDivisionError" in data["error"]


def test_interrupted_write_keeps_the_previous_manifest(tmp_path, monkeypatch):
    path = tmp_path / "manifest.json"
    atomic_write_json(path, {"status": "completed", "n": 1})

    def boom(*_a, **_k):
        raise OSError("disk full")

    monkeypatch.setattr(os, "replace", boom)
    with pytest.raises(OSError):
        atomic_write_json(path, {"status": "completed", "n": 2})
    assert json.loads(path.read_text()) == {"n": 1, "status": "completed"}
    assert [p.name for p in tmp_path.iterdir()] == ["manifest.json"]  # no temp file left behind


def test_sigkilled_stage_never_claims_success(tmp_path):
    """A stage killed mid-run leaves a manifest that says 'running', never 'completed'."""
    # First a completed run, so a stale success exists that must not survive the re-run.
    with StageRun("03_demo", tmp_path, {"a": 1}):
        pass
    assert read_manifest(tmp_path)["status"] == "completed"
    script = textwrap.dedent(f"""
        import sys, time
        sys.path.insert(0, {str(ROOT)!r})
        from utils.core.manifest import StageRun
        with StageRun("03_demo", {str(tmp_path)!r}, {{"a": 1}}):
            print("started", flush=True)
            time.sleep(60)
    """)
    proc = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "started"
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=30)
    data = read_manifest(tmp_path)
    assert data["status"] == "running"
    assert "finished_at" not in data


def test_parent_must_be_completed(tmp_path):
    parent, child = tmp_path / "p", tmp_path / "c"
    with pytest.raises(RuntimeError):
        with StageRun("00_p", parent, {}):
            raise RuntimeError("parent failed")
    with pytest.raises(RuntimeError, match=r"parent stage '00_p' has status 'failed', expected 'completed'"):
        with StageRun("01_c", child, {}) as run:
            run.add_parent(parent)


def test_parent_digest_ignores_times(tmp_path):
    parent = tmp_path / "p"
    digests = []
    for _ in range(2):
        with StageRun("00_p", parent, {"k": 1}):
            pass
        digests.append(manifest_digest(read_manifest(parent)))
    assert digests[0] == digests[1]


def test_missing_manifest_error_names_the_path(tmp_path):
    with pytest.raises(FileNotFoundError, match=str(tmp_path / "manifest.json")):
        read_manifest(tmp_path)


def test_manifest_records_peak_memory_outside_the_digest(tmp_path):
    with StageRun("s", tmp_path / "run" / "s", {"k": 1}, seed=0):
        blob = bytearray(64 * 1024 * 1024)  # 64 MiB touched
        blob[::4096] = b"x" * len(blob[::4096])
    m = read_manifest(tmp_path / "run" / "s")
    assert m["peak_rss_mb"] >= 64 and m["peak_rss_children_mb"] >= 0
    assert {"peak_rss_mb", "peak_rss_children_mb"} <= set(VOLATILE_KEYS)


def test_a_hand_edited_manifest_is_not_trusted(tmp_path):
    """The seal is the manifest's own digest: a failed stage turned into "completed" by hand is
    detected, and a child stage refuses it as a parent."""
    inp = tmp_path / "in.txt"
    inp.write_text("a\nb\n")
    _run_stage(tmp_path / "s", inp, {"k": 1})
    m = read_manifest(tmp_path / "s")
    assert mf.seal_state(m) == "sealed" and m["seal_sha256"] == manifest_digest(m)
    atomic_write_json(tmp_path / "s" / "manifest.json", {**m, "metrics": {"n_rows": 3}})
    assert mf.seal_state(read_manifest(tmp_path / "s")) == "edited"
    with pytest.raises(RuntimeError, match="edited by hand"):
        with StageRun("02_child", tmp_path / "c", {}, seed=3) as run:
            run.add_parent(tmp_path / "s")
    unsealed = {k: v for k, v in m.items() if k != "seal_sha256"}
    assert mf.seal_state(unsealed) == "unsealed" and manifest_digest(unsealed) == manifest_digest(m)


def _folder(path, text: str):
    path.mkdir()
    (path / "f.txt").write_text(text)
    return path


def test_publishing_a_folder_replaces_the_old_one_and_a_cut_keeps_one_whole(tmp_path, monkeypatch):
    """files.publish_dir: the new folder takes the name and nothing is left aside; when the process dies
    after the old one is moved aside (simulated: the second rename raises SystemExit, as a signal's
    unwinding would), the old one is put back and the new one stays whole beside it, where the
    delete-then-rename that checkpoints, adapters and data used before would have left neither."""
    from pathlib import Path

    dest = _folder(tmp_path / "best", "old")
    files.publish_dir(_folder(tmp_path / "best.tmp", "new"), dest)
    assert (dest / "f.txt").read_text() == "new" and sorted(p.name for p in tmp_path.iterdir()) == ["best"]

    real = Path.rename

    def killed(self, target):  # the process dies before the new folder is renamed in
        if self.name == "best.tmp":
            raise SystemExit("killed")
        return real(self, target)

    monkeypatch.setattr(Path, "rename", killed)
    with pytest.raises(SystemExit):
        files.publish_dir(_folder(tmp_path / "best.tmp", "newer"), dest)
    monkeypatch.undo()
    assert (dest / "f.txt").read_text() == "new"  # put back
    assert (tmp_path / "best.tmp" / "f.txt").read_text() == "newer"  # the new one, whole, for a rerun


def test_a_kill_between_publishings_two_renames_is_undone_by_the_next_start(tmp_path):
    """SIGKILL at `publish:best` (utils/core/faults.py), after the old folder is moved aside and before
    the new one takes its name: both folders survive; the next publish of the folder, or a stage's
    start in its parent (remove_stale_temporaries), puts the old one back, and a later publish then
    replaces it and leaves nothing aside."""
    (tmp_path / "ckpt").mkdir()
    dest = _folder(tmp_path / "ckpt" / "best", "old")
    _folder(tmp_path / "ckpt" / "best.tmp", "new")
    code = ("import sys; from pathlib import Path; from utils.core.files import publish_dir; "
            "publish_dir(Path(sys.argv[1]) / 'best.tmp', Path(sys.argv[1]) / 'best')")
    env = {**os.environ, "REDCODA_FAULT": "publish:best"}
    env.pop("REDCODA_FAULT_STAGE", None)
    proc = subprocess.run([sys.executable, "-c", code, str(dest.parent)], cwd=ROOT, env=env, start_new_session=True,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == -signal.SIGKILL, proc.stderr[-2000:]
    left = sorted(p.name for p in dest.parent.iterdir())
    assert left[0].startswith(".best.old-") and left[1:] == ["best.tmp"], left  # cut: neither has the name

    files.remove_stale_temporaries(tmp_path)  # a stage's start: the old folder back, the cut new one gone
    assert (dest / "f.txt").read_text() == "old" and sorted(p.name for p in dest.parent.iterdir()) == ["best"]

    aside = _folder(tmp_path / "ckpt" / ".best.old-12345", "older")  # a kill after the new one took the name
    files.publish_dir(_folder(tmp_path / "ckpt" / "best.tmp", "newest"), dest)
    assert (dest / "f.txt").read_text() == "newest" and not aside.exists()
    assert sorted(p.name for p in dest.parent.iterdir()) == ["best"]

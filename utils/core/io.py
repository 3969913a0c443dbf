"""Reading and writing the project's JSON-lines files, with errors that name the file, row and field.

Every JSONL (or JSON-array) file a stage reads goes through `read_records`, so a truncated line, a
non-object row or an empty file is reported the same way everywhere (`DataError`). Writes go
through `write_jsonl`, which is atomic: a reader never sees a half-written file.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Iterable, Iterator

from utils.core.files import atomic_write_text


class DataError(ValueError):
    """Bad input data; the message names file, row and field."""

    def __init__(self, path: Path | str, row: int | None, fld: str | None, message: str):
        where = str(path) + (f", row {row}" if row is not None else "") + (f", field '{fld}'" if fld else "")
        super().__init__(f"{where}: {message}")
        self.path, self.row, self.field = str(path), row, fld


def type_name(value: Any) -> str:
    return "null" if value is None else type(value).__name__


def require(obj: dict, key: str, types: type | tuple, path: Path, row: int, prefix: str = "") -> Any:
    """obj[key], checked against `types`; errors name file, row and the dotted field."""
    name = f"{prefix}{key}"
    if not isinstance(obj, dict):
        raise DataError(path, row, prefix.rstrip(".") or None, f"expected an object, got {type_name(obj)}")
    if key not in obj:
        raise DataError(path, row, name, "missing field")
    value = obj[key]
    allowed = types if isinstance(types, tuple) else (types,)
    if not isinstance(value, allowed) or (isinstance(value, bool) and bool not in allowed):
        want = " or ".join(t.__name__ for t in allowed)
        raise DataError(path, row, name, f"expected {want}, got {type_name(value)} {str(value)[:60]!r}")
    return value


def _json_array(path: Path, text: str) -> Iterator[tuple[int, Any]]:
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise DataError(path, None, None, f"invalid JSON at line {exc.lineno} col {exc.colno}: {exc.msg}") from None
    if not isinstance(data, list):
        raise DataError(path, None, None, f"expected a JSON array of rows, got {type_name(data)}")
    yield from enumerate(data, 1)


def _json_lines(path: Path, text: str) -> Iterator[tuple[int, Any]]:
    for i, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            yield i, json.loads(line)
        except json.JSONDecodeError as exc:
            raise DataError(path, i, None, f"invalid JSON (truncated line?): {exc.msg}: column {exc.colno}") from None


def read_records(path: Path) -> Iterator[tuple[int, dict]]:
    """(1-based row, object) pairs from a JSONL file or a JSON array file (`.json`); blank lines
    are skipped but counted, so row numbers are line numbers."""
    if not path.is_file():
        raise DataError(path, None, None, "file not found")
    try:
        text = path.read_text(encoding="utf-8", errors="strict")
    except UnicodeDecodeError as exc:
        line = path.read_bytes()[:exc.start].count(b"\n") + 1
        row = None if path.suffix == ".json" else line  # a JSONL row is a line; an array row is not
        raise DataError(path, row, None, f"not valid UTF-8 ({exc.reason} at byte {exc.start}, line {line})") from None
    if not text.strip():
        raise DataError(path, None, None, "file is empty")
    for i, obj in (_json_array if path.suffix == ".json" else _json_lines)(path, text):
        if not isinstance(obj, dict):
            raise DataError(path, i, None, f"expected an object, got {type_name(obj)}")
        yield i, obj


def read_jsonl(path: Path) -> list[dict]:
    """Every object of a JSONL (or JSON-array) file, in order; errors as `read_records`."""
    return [obj for _, obj in read_records(Path(path))]


def jsonl_text(records: Iterable[dict]) -> str:
    """One sorted-key JSON object per line."""
    return "".join(json.dumps(r, sort_keys=True, ensure_ascii=False) + "\n" for r in records)


def write_jsonl(path: Path, records: Iterable[dict]) -> None:
    """One sorted-key JSON object per line, written atomically."""
    atomic_write_text(path, jsonl_text(records))

"""Strict, typed configs: YAML tiers plus `key.sub=value` command-line overrides.

A config is a tree of dataclasses; each field's docstring-like `help` metadata documents it.
Loading is strict: an unknown key raises `ConfigError` naming the file, the key and the nearest
valid key, and a value of the wrong type names what was expected and what was found.

The run config is assembled from three tiers, as in the seed pipeline:
    configs/models/<model>.yaml      -> `model`      (weights, LoRA, templates, engine)
    configs/algorithms/<algo>.yaml   -> `algorithm`  (a method of utils/core/methods.py)
    configs/data/<data>.yaml         -> `data`
then `--set a.b=value` overrides, applied last. The resolved tree is what manifests hash.
"""
from __future__ import annotations

import dataclasses
import difflib
import re
import types
import typing
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[2]
CONFIG_DIR = ROOT / "configs"


class ConfigError(ValueError):
    """A config file or override is invalid; the message names the source and the key."""


def field(default: Any, help: str, choices: tuple | None = None,  # noqa: A002 - argparse's name
          minimum: float | None = None, maximum: float | None = None) -> Any:
    """A dataclass field with documentation; mutable defaults are copied per instance. A field with
    `choices` accepts only those values, one with `minimum` nothing below it, one with `maximum`
    nothing above it; all are checked when the config is parsed (`from_dict`)."""
    meta = {"help": help, **({"choices": tuple(choices)} if choices else {}),
            **({"minimum": minimum} if minimum is not None else {}),
            **({"maximum": maximum} if maximum is not None else {})}
    if isinstance(default, (list, dict)):
        return dataclasses.field(default_factory=lambda d=default: type(d)(d), metadata=meta)
    if dataclasses.is_dataclass(default):
        return dataclasses.field(default_factory=lambda d=default: dataclasses.replace(d), metadata=meta)
    return dataclasses.field(default=default, metadata=meta)


# "Section.key" -> where a key that moved now lives, for the unknown-key error (filled by the schema)
MOVED: dict[str, str] = {}


def _nearest(key: str, valid: list[str], cls: type | None = None) -> str:
    moved = MOVED.get(f"{cls.__name__}.{key}") if cls is not None else None
    if moved:
        return f"; it moved to '{moved}'"
    close = difflib.get_close_matches(key, valid, n=1, cutoff=0.0)
    return f"; did you mean '{close[0]}'?" if close else ""


_EXPONENT_FLOAT = re.compile(r"[-+]?(\d+\.?\d*|\.\d+)[eE][-+]?\d+")


def _coerce(value: Any, tp: Any, where: str) -> Any:
    """Check `value` against the annotation `tp`, converting only lossless cases (int -> float)."""
    origin = typing.get_origin(tp)
    if tp is Any:
        return value
    if origin in (typing.Union, types.UnionType):
        args = typing.get_args(tp)
        if value is None and type(None) in args:
            return None
        errors = []
        for arg in args:
            if arg is type(None):
                continue
            try:
                return _coerce(value, arg, where)
            except ConfigError as exc:
                errors.append(str(exc))
        raise ConfigError(errors[0] if errors else f"{where}: invalid value {value!r}")
    if origin is list:
        if not isinstance(value, list):
            raise ConfigError(f"{where}: expected a list, got {type(value).__name__} {value!r}")
        (item,) = typing.get_args(tp) or (Any,)
        return [_coerce(v, item, f"{where}[{i}]") for i, v in enumerate(value)]
    if origin is dict:
        if not isinstance(value, dict):
            raise ConfigError(f"{where}: expected a mapping, got {type(value).__name__} {value!r}")
        return dict(value)
    if dataclasses.is_dataclass(tp):
        return from_dict(tp, value, where)
    if tp is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if tp is float and isinstance(value, str) and _EXPONENT_FLOAT.fullmatch(value.strip()):
        return float(value)  # YAML 1.1 (PyYAML) reads 5e-4 as a string: it wants 5.0e-4
    if tp in (int, float) and isinstance(value, bool):
        raise ConfigError(f"{where}: expected {tp.__name__}, got bool {value!r}")
    if isinstance(tp, type) and not isinstance(value, tp):
        raise ConfigError(f"{where}: expected {tp.__name__}, got {type(value).__name__} {value!r}")
    return value


def from_dict(cls: type, data: Any, where: str) -> Any:
    """Build dataclass `cls` from a mapping, rejecting unknown keys and wrong types."""
    if not isinstance(data, dict):
        raise ConfigError(f"{where}: expected a mapping for {cls.__name__}, got {type(data).__name__}")
    hints = typing.get_type_hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls)}
    kwargs = {}
    for key, value in data.items():
        if key not in hints:
            raise ConfigError(f"{where}: unknown key '{key}'{_nearest(str(key), list(fields), cls)}")
        kwargs[key] = _coerce(value, hints[key], f"{where}.{key}")
        choices = fields[key].metadata.get("choices")
        if choices and kwargs[key] not in choices:
            raise ConfigError(f"{where}.{key}: '{kwargs[key]}' is not a valid value; valid: {', '.join(choices)}")
        minimum = fields[key].metadata.get("minimum")
        if minimum is not None and kwargs[key] < minimum:
            raise ConfigError(f"{where}.{key}: {kwargs[key]} is below its minimum {minimum}")
        maximum = fields[key].metadata.get("maximum")
        if maximum is not None and kwargs[key] > maximum:
            raise ConfigError(f"{where}.{key}: {kwargs[key]} is above its maximum {maximum}")
    try:
        return cls(**kwargs)
    except TypeError as exc:  # a required field is missing
        raise ConfigError(f"{where}: {exc}") from None


def to_dict(cfg: Any) -> dict:
    return dataclasses.asdict(cfg)


def deep_merge(base: dict, top: dict) -> dict:
    """A new dict: `top`'s keys win, nested mappings merge key by key."""
    out = dict(base)
    for key, value in top.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = deep_merge(out[key], value)
        else:
            out[key] = value
    return out


def read_yaml(path: Path) -> dict:
    """Read a YAML mapping; errors name the file."""
    if not path.is_file():
        raise ConfigError(f"{path}: config file not found")
    try:
        data = yaml.safe_load(path.read_text())
    except yaml.YAMLError as exc:
        raise ConfigError(f"{path}: invalid YAML: {exc}") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: expected a mapping at the top level, got {type(data).__name__}")
    return data


def tier_path(tier: str, name: str) -> Path:
    """`name` is either a path to a YAML file or the stem of one in configs/<tier>/."""
    as_path = Path(name)
    if as_path.suffix in (".yaml", ".yml"):
        return as_path
    path = CONFIG_DIR / tier / f"{name}.yaml"
    if not path.is_file():
        valid = sorted(p.stem for p in (CONFIG_DIR / tier).glob("*.yaml"))
        raise ConfigError(f"no {tier} config named '{name}'{_nearest(name, valid)} (valid: {', '.join(valid)})")
    return path


def apply_overrides(data: dict, overrides: list[str], cls: type) -> dict:
    """Apply `a.b.c=value` overrides to a nested dict; values are parsed as YAML scalars/lists.

    Keys are checked against the dataclass schema here, so a typo fails with the nearest key.
    """
    for item in overrides:
        if "=" not in item:
            raise ConfigError(f"override '{item}': expected key=value")
        dotted, raw = item.split("=", 1)
        try:
            value = yaml.safe_load(raw) if raw != "" else ""
        except yaml.YAMLError as exc:
            raise ConfigError(f"override '{item}': cannot parse value: {exc}") from None
        node, node_cls, parts = data, cls, dotted.split(".")
        for depth, part in enumerate(parts):
            hints = typing.get_type_hints(node_cls) if dataclasses.is_dataclass(node_cls) else {}
            if dataclasses.is_dataclass(node_cls) and part not in hints:
                prefix = ".".join(parts[:depth])
                raise ConfigError(f"override '{item}': unknown key '{part}'"
                                  f"{' under ' + prefix if prefix else ''}{_nearest(part, list(hints), node_cls)}")
            if depth == len(parts) - 1:
                node[part] = value
            else:
                node = node.setdefault(part, {})
                if not isinstance(node, dict):
                    raise ConfigError(f"override '{item}': '{part}' is not a section")
                node_cls = hints.get(part, Any)
    return data


def describe(cls: type, prefix: str = "", values: dict | None = None, sources: dict[str, str] | None = None) -> list[str]:
    """One line per leaf field, `key = value [valid values]: help`, for --help-config. With `values`
    (a resolved config as a nested dict) and `sources` (dotted key -> the layer that set it), the
    value is the effective one, and a value some layer set names that layer and the schema default."""
    lines = []
    for f in dataclasses.fields(cls):
        tp = typing.get_type_hints(cls)[f.name]
        key = f"{prefix}{f.name}"
        if dataclasses.is_dataclass(tp):
            lines += describe(tp, key + ".", values[f.name] if values is not None else None, sources)
            continue
        default = f.default if f.default is not dataclasses.MISSING else (
            f.default_factory() if f.default_factory is not dataclasses.MISSING else "required")
        shown = f"{default!r}"
        if values is not None and sources and key in sources:
            shown = f"{values[f.name]!r} (from {sources[key]}; default {default!r})"
        choices = f.metadata.get("choices")
        valid = f" [{' | '.join(choices)}]" if choices else ""
        if "minimum" in f.metadata:
            valid += f" [>= {f.metadata['minimum']}]"
        if "maximum" in f.metadata:
            valid += f" [<= {f.metadata['maximum']}]"
        lines.append(f"  {key} = {shown}{valid}: {f.metadata.get('help', '')}")
    return lines


def repo_path(p: str) -> Path:
    """Resolve a config path relative to the repo root (absolute paths pass through)."""
    path = Path(p)
    return path if path.is_absolute() else ROOT / path

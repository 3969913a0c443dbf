"""Methods that live in one file: `utils/train/methods/<name>.py` holds a method's maths, its wiring
into the RL step and, as literals at its top, what the config and the method registry need to know
of it. Adding such a method is that file, its config `configs/algorithms/<name>.yaml` and its test,
with no edit to the loop, the update, the schema or the registry (docs/EXTENDING.md).

The config's schema lives in `core` and is parsed before any stage imports torch, so it cannot import
the method's file; it reads the literals from the file's text instead (the standard library's `ast`,
as utils/core/choices.py reads a registry's names):
- `SETTINGS`: the method's config section `algorithm.<name>`, a dict from each setting's name to
  `(default, help)` or `(default, help, {"minimum": …, "maximum": …, "choices": (…)})`; the default's
  type (bool, int, float or str) is the setting's. An `enabled` bool is required: it is the flag
  that says a config is this method (utils/core/methods.py `defining_flags`), off by default.
- `METHOD`: its registry entry, `{"summary": …}` plus, optionally, `"in_study"` (default False),
  `"needs"` (methods that must run first) and what it asks of the run: `"demonstrations"` (True:
  the RL stage reads 03's traces for it) and `"demonstration_tokens"` (True: it trains tokens the
  sampler never produced, so it refuses the sampler's importance weights and per-token process
  rewards, which have no meaning there).
Anything not literal is refused here, naming the file and line. The training side
(utils/train/method_variants.py) imports the same files by name and calls their `variants` and
`piece` functions."""
from __future__ import annotations

import ast
import dataclasses
from functools import cache
from pathlib import Path

from utils.core.config import ROOT, field

METHOD_DIR = "utils/train/methods"
_TYPES = (bool, int, float, str)
_LIMITS = {"minimum", "maximum", "choices"}
_METHOD_KEYS = {"summary", "in_study", "needs", "demonstrations", "demonstration_tokens"}


@dataclasses.dataclass(frozen=True)
class MethodFile:
    """One method file's declarations: `name` its stem, `settings` its section's (name -> (default,
    help, limits)), `method` its registry entry's keys."""
    name: str
    path: str
    settings: dict
    method: dict


def _literal(where: str, node: ast.Assign, variable: str):
    try:
        return ast.literal_eval(node.value)
    except ValueError:
        raise ValueError(f"{where}:{node.lineno}: {variable} must be a literal (utils/core/method_files.py reads it "
                         f"without importing the file)") from None


def _declared(path: Path, where: str) -> dict:
    found = {}
    for node in ast.parse(path.read_text(), where).body:
        if isinstance(node, ast.Assign):
            for t in node.targets:
                if isinstance(t, ast.Name) and t.id in ("SETTINGS", "METHOD"):
                    found[t.id] = (node, _literal(where, node, t.id))
    return found


def _check_settings(where: str, settings) -> dict:
    if not isinstance(settings, dict) or not isinstance(settings.get("enabled"), tuple) \
            or settings["enabled"][0] is not False:
        raise ValueError(f"{where}: SETTINGS must be a dict with 'enabled': (False, \"help\")")
    out = {}
    for key, spec in settings.items():
        ok = isinstance(key, str) and key.isidentifier() and isinstance(spec, tuple) and len(spec) in (2, 3)
        if not ok or type(spec[0]) not in _TYPES or not isinstance(spec[1], str) \
                or (len(spec) == 3 and not (isinstance(spec[2], dict) and set(spec[2]) <= _LIMITS)):
            raise ValueError(f"{where}: SETTINGS['{key}'] must be (default, \"help\") or (default, \"help\", "
                             f"{{limits among {', '.join(sorted(_LIMITS))}}}) with a bool, int, float or str default")
        out[key] = (spec[0], spec[1], spec[2] if len(spec) == 3 else {})
    return out


def _check_method(where: str, method) -> dict:
    if not isinstance(method, dict) or not isinstance(method.get("summary"), str) or set(method) - _METHOD_KEYS:
        raise ValueError(f"{where}: METHOD must be a dict with a 'summary' string and keys among "
                         f"{', '.join(sorted(_METHOD_KEYS))}")
    out = {"in_study": False, "needs": (), "demonstrations": False, "demonstration_tokens": False, **method}
    needs = out["needs"]
    if not all(isinstance(out[k], bool) for k in ("in_study", "demonstrations", "demonstration_tokens")) \
            or not isinstance(needs, (tuple, list)) or not all(isinstance(n, str) for n in needs):
        raise ValueError(f"{where}: METHOD's in_study, demonstrations and demonstration_tokens are true or false, "
                         f"its needs a tuple of method names")
    return out


def read_method_file(path: Path, root: Path = ROOT) -> MethodFile:
    """The declarations of the method file at `path` (under `root`); a ValueError names the file and
    line of what is missing or malformed."""
    rel = str(path.relative_to(root))
    found = _declared(path, rel)
    for variable in ("SETTINGS", "METHOD"):
        if variable not in found:
            raise ValueError(f"{rel}: a method file declares {variable} at its top level (utils/core/method_files.py)")
    (s_node, settings), (m_node, method) = found["SETTINGS"], found["METHOD"]
    return MethodFile(path.stem, rel, _check_settings(f"{rel}:{s_node.lineno}", settings),
                      _check_method(f"{rel}:{m_node.lineno}", method))


@cache
def method_files(root: Path = ROOT) -> tuple[MethodFile, ...]:
    """Every method file in `utils/train/methods/`, by name."""
    paths = sorted((root / METHOD_DIR).glob("*.py"))
    return tuple(read_method_file(p, root) for p in paths if p.name != "__init__.py")


def _class_name(name: str) -> str:
    return "".join(part.capitalize() for part in name.split("_")) + "Config"


@cache
def sections(root: Path = ROOT) -> dict[str, type]:
    """Each method file's config section by name: a dataclass `<Name>Config` whose fields are its
    `SETTINGS`."""
    return {mf.name: _section(mf) for mf in method_files(root)}


def _section(mf: MethodFile) -> type:
    fields = []
    for key, (default, help_text, limits) in mf.settings.items():
        choices = limits.get("choices")
        fields.append((key, type(default), field(default, help_text, tuple(choices) if choices else None,
                                                  limits.get("minimum"), limits.get("maximum"))))
    cls = dataclasses.make_dataclass(_class_name(mf.name), fields)
    cls.__module__ = "utils.core.algorithm_schema"  # where the schema binds it, so that a config pickles
    cls.__doc__ = f"algorithm.{mf.name}: the settings {mf.path} declares."
    return cls


def enabled(alg) -> list[MethodFile]:
    """The method files whose section a config turns on."""
    return [mf for mf in method_files() if getattr(alg, mf.name).enabled]


def wants(alg, capability: str) -> bool:
    """Whether a method file the config turns on asks for `capability` ("demonstrations" or
    "demonstration_tokens", see the module docstring)."""
    return any(mf.method[capability] for mf in enabled(alg))

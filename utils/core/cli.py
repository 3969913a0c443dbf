"""The command line every numbered stage shares.

    python 0N_stage.py [--model tiny-arith] [--algorithm red] [--data synthetic_arith]
                       [--config run.yaml] [--run_id run_001] [--seed 1] [--set key.sub=value ...]

`--set` may repeat; keys are dotted paths into the run config (`--help-config` lists them all,
with the effective value of this command line, the tier, regime, run YAML or `--set` that set it,
the schema default and help). Unknown keys fail with the nearest valid key.
"""
from __future__ import annotations

import argparse
import sys

from utils.core.config import ConfigError, describe, to_dict
from utils.core.schema import RunConfig
from utils.core.loader import config_from_layers, config_layers, config_sources


DEFAULT_RUN = ("tiny-arith", "red", "synthetic_arith")  # --model, --algorithm, --data of the main command


def default_run_settings(model: str = DEFAULT_RUN[0], algorithm: str = DEFAULT_RUN[1],
                         data: str = DEFAULT_RUN[2]) -> list[str]:
    """What a run with these tiers trains with beyond the schema's defaults, `key = value  (file)` a
    line, the model's and the data's own sections left out (their files describe the model and the
    task): the regime, the tiers' `run:` sections and the method's settings."""
    layers = config_layers(model, algorithm, data, [], None)
    values, lines = to_dict(config_from_layers(layers)), []
    for key, source in config_sources(layers).items():
        if not key.startswith(("model.", "data.")):
            value = values
            for part in key.split("."):
                value = value[part]
            lines.append(f"  {key} = {value!r}  ({source})")
    return lines


class HelpWithDefaults(argparse.ArgumentParser):
    """An argument parser whose --help ends with what the main command trains with (computed only
    when help is asked for), so the schema's defaults are never mistaken for the default run's."""

    def format_help(self) -> str:
        try:
            lines = default_run_settings()
        except ConfigError as exc:  # a broken config tree: help still prints, and says why
            lines = [f"  (not readable: {exc})"]
        self.epilog = ("What the main command (--model {} --algorithm {} --data {}) trains with beyond the schema's "
                       "defaults (utils/core/schema.py), each setting with the file that sets it; --help-config "
                       "lists every key:\n".format(*DEFAULT_RUN) + "\n".join(lines))
        return super().format_help()


def stage_parser(description: str) -> argparse.ArgumentParser:
    ap = HelpWithDefaults(description=description, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="tiny-arith", help="configs/models/<name>.yaml or a YAML path")
    ap.add_argument("--algorithm", default="red", help="configs/algorithms/<name>.yaml or a YAML path")
    ap.add_argument("--data", default="synthetic_arith", help="configs/data/<name>.yaml or a YAML path")
    ap.add_argument("--config", default=None, help="optional run-level YAML merged over the tiers")
    ap.add_argument("--run_id", default=None, help="shorthand for --set run_id=...")
    ap.add_argument("--seed", type=int, default=None, help="shorthand for --set seed=...")
    ap.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                    help="override one config value, e.g. --set algorithm.red.G=3 (repeatable)")
    ap.add_argument("--help-config", action="store_true",
                    help="list every config key with its effective value, the file or flag that set it, and its default")
    return ap


def parse_stage_args(description: str, argv: list[str] | None = None,
                     parser: argparse.ArgumentParser | None = None) -> tuple[RunConfig, argparse.Namespace]:
    """Parse the shared flags and load the resolved config; exits 2 with a clear message on errors."""
    ap = parser or stage_parser(description)
    args = ap.parse_args(argv)
    overrides = list(args.overrides)
    if args.run_id is not None:
        overrides.append(f"run_id={args.run_id}")
    if args.seed is not None:
        overrides.append(f"seed={args.seed}")
    try:
        layers = config_layers(args.model, args.algorithm, args.data, overrides, args.config)
        cfg = config_from_layers(layers)
        if args.help_config:  # every key with its effective value, and the file or flag that set it
            print("\n".join(describe(RunConfig, values=to_dict(cfg), sources=config_sources(layers))))
            sys.exit(0)
    except ConfigError as exc:
        ap.exit(2, f"{ap.prog}: config error: {exc}\n")
    return cfg, args

"""01_prepare_dataset: Write train/val/test JSONL in the unified schema with rendered planner prompts.

Not implemented yet (issue #3); it exits with status 2 and writes nothing.
"""
import sys

from utils.cli import not_implemented

if __name__ == "__main__":
    sys.exit(not_implemented("01_prepare_dataset", "issue #3"))

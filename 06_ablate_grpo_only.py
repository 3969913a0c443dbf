"""06_ablate_grpo_only: The same trainer with the grpo config (SFT term off).

Not implemented yet (issue #6); it exits with status 2 and writes nothing.
"""
import sys

from utils.cli import not_implemented

if __name__ == "__main__":
    sys.exit(not_implemented("06_ablate_grpo_only", "issue #6"))

"""09_driver: Run the whole chain for --method red|grpo|fixed_sft|sft|all.

Not implemented yet (issue #7); it exits with status 2 and writes nothing.
"""
import sys

from utils.cli import not_implemented

if __name__ == "__main__":
    sys.exit(not_implemented("09_driver", "issue #7"))

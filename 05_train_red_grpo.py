"""05_train_red_grpo: RED-GRPO training (method red by default).

Not implemented yet (issue #6); it exits with status 2 and writes nothing.
"""
import sys

from utils.cli import not_implemented

if __name__ == "__main__":
    sys.exit(not_implemented("05_train_red_grpo", "issue #6"))

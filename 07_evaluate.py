"""07_evaluate: Evaluate a checkpoint on test.jsonl with greedy rollouts.

Not implemented yet (issue #7); it exits with status 2 and writes nothing.
"""
import sys

from utils.cli import not_implemented

if __name__ == "__main__":
    sys.exit(not_implemented("07_evaluate", "issue #7"))

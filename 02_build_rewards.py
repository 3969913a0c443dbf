"""02_build_rewards: Write reward_spec.yaml and run the reward unit cases.

Not implemented yet (issue #3); it exits with status 2 and writes nothing.
"""
import sys

from utils.cli import not_implemented

if __name__ == "__main__":
    sys.exit(not_implemented("02_build_rewards", "issue #3"))

"""03_generate_sft_traces: Write planner/executor SFT traces (gold, solution or teacher).

Not implemented yet (issue #5); it exits with status 2 and writes nothing.
"""
import sys

from utils.cli import not_implemented

if __name__ == "__main__":
    sys.exit(not_implemented("03_generate_sft_traces", "issue #5"))

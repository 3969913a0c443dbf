"""08_compare_runs: Aggregate runs into summary.csv, plots/ and report.md.

Not implemented yet (issue #7); it exits with status 2 and writes nothing.
"""
import sys

from utils.cli import not_implemented

if __name__ == "__main__":
    sys.exit(not_implemented("08_compare_runs", "issue #7"))

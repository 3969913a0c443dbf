"""00_check_data: Validate raw data: schema, ids, empty fields, unparseable answers, leakage.

Not implemented yet (issue #3); it exits with status 2 and writes nothing.
"""
import sys

from utils.cli import not_implemented

if __name__ == "__main__":
    sys.exit(not_implemented("00_check_data", "issue #3"))

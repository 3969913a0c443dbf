"""Running a study: tools over whole runs (utils/run/diff.py: diff two runs\x27 manifests)."""

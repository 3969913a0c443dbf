"""Running and reading whole runs: the plan behind 09_driver.py (driver.py), its Ray executor
(ray_executor.py), and diffing two runs' manifests (diff.py)."""

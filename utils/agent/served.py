"""The `openai` engine: the same Planner/Executor rollout against any OpenAI-compatible completions
endpoint, such as a `vllm serve` of a run's model and adapters (`python -m utils.deploy.serve`).

Prompts go out as token ids (`prompt: [ids]`) and come back as token ids (`return_token_ids`), so
the rollout's exact contexts hold across the wire; each request carries its own seed, as the
offline vLLM engine's do, and asks for the sampled tokens' log-probs (a `vllm serve` started with
`--logprobs-mode processed_logprobs` reports those of the distribution it sampled from, as the
offline engine does). Requests run concurrently from a thread pool (the server batches them);
`submit`/`poll` advance all episodes turn by turn (`BatchedCalls`).

`set_adapter(path)` selects the served model whose `root` (the directory it was loaded from, as
`/v1/models` lists it) is `path`; None selects the base (`model.engine.served_model`). An endpoint
cannot be handed new adapters here, so this engine evaluates and serves; it does not train.
"""
from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from utils.agent.sampling import BatchedCalls, Sample, SamplingSpec
from utils.core.http import HTTP_ERRORS, describe_error, request_json
from utils.core.schema import EngineConfig


class EndpointError(RuntimeError):
    """The endpoint was unreachable, too slow, or answered something unusable."""


class OpenAIEngine(BatchedCalls):
    name = "openai"

    def __init__(self, model_path: Path, cfg: EngineConfig, seed: int = 0,  # noqa: ARG002 - seeded per request
                 trust_remote_code: bool = False):  # noqa: ARG002 - the server loads the model
        self.cfg, self.model_path = cfg, model_path
        self.model = cfg.served_model
        self._queue: list[tuple] = []
        self._served = self._models()  # fail at start, clearly, if nothing answers
        if self.model not in self._served:
            raise EndpointError(f"{cfg.base_url} serves {sorted(self._served)}, not the base model "
                                f"model.engine.served_model='{self.model}'")

    def _call(self, path: str, body: dict | None) -> dict:
        try:
            return request_json(self.cfg.base_url, path, body, self.cfg.request_timeout, self.cfg.api_key_env)
        except HTTP_ERRORS as exc:
            raise EndpointError(f"openai engine: {self.cfg.base_url}{path} failed ({describe_error(exc)}); is the "
                                "server up? `python -m utils.deploy.serve` starts one") from None

    def _models(self) -> dict[str, str]:
        """Served model name -> the directory it was loaded from."""
        listing = self._call("/models", None)
        return {m["id"]: str(m.get("root") or "") for m in listing.get("data", []) if isinstance(m, dict)}

    def set_adapter(self, path: Path | None) -> None:
        if path is None:
            self.model = self.cfg.served_model
            return
        want = Path(path).resolve()
        names = [n for n, root in self._served.items() if root and Path(root).resolve() == want]
        if not names:
            raise EndpointError(f"{self.cfg.base_url} serves no adapter loaded from {path} (it serves "
                                f"{sorted(self._served)}); serve it with python -m utils.deploy.serve --checkpoint ...")
        self.model = names[0]

    def _one(self, prompt: list[int], spec: SamplingSpec, seed: int) -> list[Sample]:
        body = {"model": self.model, "prompt": prompt, "max_tokens": spec.max_tokens, "n": spec.n,
                "temperature": spec.temperature, "top_p": spec.top_p if spec.temperature else 1.0,
                "stop": spec.stop or None, "include_stop_str_in_output": True, "skip_special_tokens": True,
                "logprobs": 0, "return_token_ids": True, "seed": seed}
        reply = self._call("/completions", body)
        try:
            return [_sample(c) for c in sorted(reply["choices"], key=lambda c: c.get("index", 0))]
        except (KeyError, TypeError, ValueError) as exc:
            raise EndpointError(f"openai engine: {self.cfg.base_url}/completions answered without token ids or "
                                f"log-probs ({type(exc).__name__}: {exc}); a vLLM server is needed") from None

    def generate(self, prompts: list[list[int]], spec: SamplingSpec, seeds: list[int]) -> list[list[Sample]]:
        if not prompts:
            return []
        with ThreadPoolExecutor(max_workers=min(len(prompts), self.cfg.max_concurrent_requests)) as pool:
            return list(pool.map(lambda ps: self._one(ps[0], spec, ps[1]), zip(prompts, seeds)))

    def close(self) -> None:
        pass


def _sample(choice: dict) -> Sample:
    ids = [int(t) for t in choice["token_ids"]]
    lps = [float(x) for x in choice["logprobs"]["token_logprobs"]]
    if len(lps) != len(ids):
        raise ValueError(f"{len(ids)} token ids but {len(lps)} log-probs")
    return Sample(ids, choice["text"], lps, "stop" if choice.get("finish_reason") == "stop" else "length")

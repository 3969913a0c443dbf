"""Test engines that emit chosen text instead of sampling it: `ScriptedEngine` (item k of a role's
script for its k-th call), for malformed-output cases no real policy produces on demand, and
`RuleEngine` (text from a function of the role and the prompt), for a policy whose correctness is
known by construction (the teacher's rejection sampling, tests/test_sft_stages.py).

The *text* is chosen; the log-probs are the real base model's for that text (teacher forcing),
and stop strings are applied exactly as the real engines apply them, so everything downstream of
the engine (parsing, ending, masks, serialisation) runs unchanged.
"""
from collections.abc import Callable

import torch

from utils.agent.sampling import BatchedCalls, Sample, truncate_at_stop


class RuleEngine(BatchedCalls):
    """`respond(role, prompt_text, call, occurrence)` gives the text for one prompt, where `call`
    counts this role's engine calls from 1 (one call serves one role) and `occurrence` counts the
    same prompt text earlier in this call from 0 (a question's n samples arrive together, in order,
    so on their first turn it is the sample's index)."""
    name = "rule"

    def __init__(self, model, tokenizer, respond: Callable[[str, str, int, int], str]):
        self.model, self.tokenizer, self.respond = model, tokenizer, respond
        self.calls = {"planner": 0, "executor": 0}
        self.adapters, self.closed = [], False
        self._queue = []

    def set_adapter(self, path):
        self.adapters.append(path)  # recorded: the text does not depend on it

    def close(self):
        self.closed = True

    def _role(self, prompt_text: str) -> str:
        return "planner" if prompt_text.startswith("plan:") else "executor"

    def generate(self, prompts, spec, seeds):
        texts = [self.tokenizer.decode(p, skip_special_tokens=True) for p in prompts]
        roles = {self._role(t) for t in texts}
        assert len(roles) == 1, "one engine call must serve one role"
        role = roles.pop()
        self.calls[role] += 1
        out, seen = [], {}
        for p, prompt_text in zip(prompts, texts):
            occurrence = seen[prompt_text] = seen.get(prompt_text, -1) + 1
            ids = self.tokenizer.encode(self.respond(role, prompt_text, self.calls[role], occurrence),
                                        add_special_tokens=False)[: spec.max_tokens]
            keep, text, reason = truncate_at_stop(self.tokenizer, ids, spec.stop, self.tokenizer.eos_token_id)
            ids = ids[:keep]
            with torch.no_grad():
                logits = self.model(input_ids=torch.tensor([p + ids])).logits[0, len(p) - 1:-1]
            lps = torch.log_softmax(logits.float(), -1).gather(-1, torch.tensor(ids)[:, None])[:, 0].tolist()
            out.append([Sample(ids, text, lps, reason)])
        return out


class ScriptedEngine(RuleEngine):
    name = "scripted"

    def __init__(self, model, tokenizer, planner_script, executor_script):
        self.scripts = {"planner": list(planner_script), "executor": list(executor_script)}
        super().__init__(model, tokenizer, self._scripted)

    def _scripted(self, role: str, prompt_text: str, call: int, occurrence: int) -> str:  # noqa: ARG002
        script = self.scripts[role]
        return script[min(call - 1, len(script) - 1)]  # call k of a role gets item k

    def set_adapter(self, path):
        raise NotImplementedError

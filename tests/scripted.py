"""A test engine that emits scripted text (item k of a role's script for its k-th call), for malformed-output cases no real policy produces on demand.

The *text* is scripted; the log-probs are the real base model's for that text (teacher forcing),
and stop strings are applied exactly as the real engines apply them, so everything downstream of
the engine (parsing, ending, masks, serialisation) runs unchanged.
"""
import torch

from utils.agent.sampling import BatchedCalls, Sample, truncate_at_stop


class ScriptedEngine(BatchedCalls):
    name = "scripted"

    def __init__(self, model, tokenizer, planner_script, executor_script):
        self.model, self.tokenizer = model, tokenizer
        self.scripts = {"planner": list(planner_script), "executor": list(executor_script)}
        self.calls = {"planner": 0, "executor": 0}
        self._queue = []

    def set_adapter(self, path):
        raise NotImplementedError

    def _role(self, prompt_ids):
        return "planner" if self.tokenizer.decode(prompt_ids, skip_special_tokens=True).startswith("plan:") else "executor"

    def generate(self, prompts, spec, seeds):
        roles = {self._role(p) for p in prompts}
        assert len(roles) == 1, "one engine call must serve one role"
        role = roles.pop()
        self.calls[role] += 1
        out = []
        script = self.scripts[role]
        text_for_call = script[min(self.calls[role] - 1, len(script) - 1)]  # call k of a role gets item k
        for p in prompts:
            text = text_for_call
            ids = self.tokenizer.encode(text, add_special_tokens=False)[: spec.max_tokens]
            keep, text, reason = truncate_at_stop(self.tokenizer, ids, spec.stop, self.tokenizer.eos_token_id)
            ids = ids[:keep]
            with torch.no_grad():
                logits = self.model(input_ids=torch.tensor([p + ids])).logits[0, len(p) - 1:-1]
            lps = torch.log_softmax(logits.float(), -1).gather(-1, torch.tensor(ids)[:, None])[:, 0].tolist()
            out.append([Sample(ids, text, lps, reason)])
        return out

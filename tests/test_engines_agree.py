"""transformers and vLLM (CPU build) load the same base and agree on greedy generations and log-probs."""
import random

import torch

from utils.tinyarith.model import BOS_ID, EOS_ID, PAD_ID, char_vocab

LOGPROB_TOL = 1e-4  # fp32 on CPU; docs/ARCHITECTURE.md "Engines" gives the measured agreement


def _prompts(n: int = 48) -> list[list[int]]:
    vocab, rng = char_vocab(), random.Random(7)
    texts = [f"{rng.randint(0, 99)}{rng.choice('+-')}{rng.randint(0, 99)}=" for _ in range(n - 4)]
    texts += ["what is 12+7? ", "12 plus 7 is ", "plan: 3+4+5\n", "solve: 40-2\n"]
    return [[BOS_ID] + [vocab[c] for c in t] for t in texts]


def _hf_greedy(model, prompts, max_new):
    out = []
    for ids in prompts:  # one at a time: no padding, so nothing but the engine differs
        gen = model.generate(input_ids=torch.tensor([ids]), max_new_tokens=max_new, do_sample=False,
                             pad_token_id=PAD_ID, eos_token_id=EOS_ID)
        out.append(gen[0, len(ids):].tolist())
    return out


def _hf_logprobs(model, prompt, completion):
    ids = torch.tensor([prompt + completion])
    with torch.no_grad():
        logp = torch.log_softmax(model(input_ids=ids).logits[0, :-1].float(), dim=-1)
    targets = ids[0, 1:]
    return logp.gather(-1, targets[:, None])[:, 0][len(prompt) - 1:].tolist()


def test_greedy_outputs_and_logprobs_agree(hf_base, vllm_engine):
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt

    prompts, max_new = _prompts(), 10
    params = SamplingParams(temperature=0.0, max_tokens=max_new, logprobs=0, stop_token_ids=[EOS_ID])
    vllm_engine.set_adapter(None)
    results = vllm_engine.llm.generate([TokensPrompt(prompt_token_ids=p) for p in prompts], params, use_tqdm=False)
    hf = _hf_greedy(hf_base, prompts, max_new)
    worst = 0.0
    for prompt, res, hf_ids in zip(prompts, results, hf):
        sample = res.outputs[0]
        assert list(sample.token_ids) == hf_ids
        v_lp = [next(iter(d.values())).logprob if len(d) == 1 else d[t].logprob
                for d, t in zip(sample.logprobs, sample.token_ids)]
        h_lp = _hf_logprobs(hf_base, prompt, list(sample.token_ids))
        worst = max(worst, max(abs(a - b) for a, b in zip(v_lp, h_lp)))
    assert worst < LOGPROB_TOL, f"max |logprob diff| {worst:.2e}"
    texts = [r.outputs[0].text for r in results]
    assert sum(t.split("\n")[0].lstrip("-").isdigit() for t in texts[:44]) > 30  # it answers sums with numbers

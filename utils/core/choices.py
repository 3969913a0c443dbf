"""The value sets that config fields accept (`choices` in utils/core/schema.py).

Most mirror a registry that lives in a higher layer (the comment names it), so the schema can refuse
a typo when the config is parsed without importing those layers; tests/test_config.py checks that
each pair agrees.
"""

DTYPES = ("float32", "bfloat16", "float16")
ENGINE_NAMES = ("vllm", "hf", "openai")  # utils/agent/engines.py ENGINES
LORA_SERVING = ("adapter", "merged")  # utils/agent/engines.py VLLMEngine
LORA_FORWARDS = ("fused", "folded")  # utils/train/lora_fast.py FORWARDS
LOSS_AGGS = ("token-mean", "seq-mean-token-mean", "seq-mean-token-sum-norm")  # utils/train/losses.py
ADV_SCALINGS = ("group", "batch", "none", "rloo")  # utils/train/losses.py ADVANTAGES
POLICY_LOSS_NAMES = ("ppo_clip", "gspo")  # utils/train/losses.py POLICY_LOSSES
SCORER_NAMES = ("em", "f1", "cem", "numeric")  # utils/reward/scorers.py SCORERS
ADAPTER_NAMES = ("synthetic_arith", "synthetic_lookup", "gsm8k", "finqa", "hotpotqa")  # utils/data/adapters.py
RETRIEVER_NAMES = ("none", "bm25", "dense")  # utils/agent/retrieval.py RETRIEVERS, or no tool
TRAIN_ROLES = ("both", "planner", "executor")  # utils/train/grpo.py build_rl_batch
REFILLS = ("rounds", "pipelined")  # utils/train/grpo_trainer.py _rollouts, utils/train/refill.py
INDEPENDENCE_REFS = (r"\b(it|its|this|that|these|those|above|previous|prior|earlier|last|same|former|latter)\b"
                     r"|\bthe (result|answer|output|value)s?\b|\bstep\s*\d+|#\d+|<result>")
OFFLINE_SHIFTS = ("accuracy", "none")  # utils/train/losses.py offline_ratio
THINKING_MODES = ("plain", "actor_critic")  # utils/agent/protocol.py split_actor_critic
PRIMARY_METRICS = ("greedy", "mean_at_k")  # utils/eval/evaluation.py, 08's paired tests
LEAKAGE_POLICIES = ("drop_from_train", "warn", "error")  # utils/data/prepare.py

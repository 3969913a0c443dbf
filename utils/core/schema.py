"""The run config's schema: model, algorithm and data tiers, plus run-level fields (the algorithm
tier's sections are in utils/core/algorithm_schema.py).

Each field's `help` is what `--help-config` prints. Stages add fields here, never constants in their
scripts. Fields with a fixed set of values list them (`choices`, from utils/core/choices.py), so a typo
fails when the config is parsed, not at RL step 1. utils/core/loader.py assembles a RunConfig.
"""
from __future__ import annotations

from dataclasses import dataclass

from utils.core.algorithm_schema import (METHOD_NAMES, AlgorithmConfig, ChordConfig, RedConfig,  # noqa: F401
                                         RedPaperConfig, RlConfig, SftConfig)
from utils.core.choices import (DTYPES, ENGINE_NAMES, LORA_SERVING, LORA_FORWARDS, SCORER_NAMES, ADAPTER_NAMES,
                                RETRIEVER_NAMES, TRAIN_ROLES, INDEPENDENCE_REFS, OFFLINE_SHIFTS,  # noqa: F401
                                THINKING_MODES, LEAKAGE_POLICIES, PRIMARY_METRICS, TRACE_SOURCE_NAMES)
from utils.core.config import MOVED, field

@dataclass
class LoraConfig:
    rank: int = field(8, "LoRA rank r.", minimum=1)
    alpha: int = field(16, "LoRA alpha (scaling = alpha / rank).")
    dropout: float = field(0.0, "LoRA dropout.", minimum=0.0)
    target_modules: list[str] = field(["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"],
                                      "Module names that get LoRA adapters.")
    full_finetune: bool = field(False, "Train all weights instead of LoRA adapters.")
    forward: str = field("fused", "The trainer's LoRA layer: `fused`, base(x) + (A x)(s B)^T in one GEMM (peft's "
                                  "sum, fewer passes), or `folded`, x (W + s B A)^T, one wide product instead of "
                                  "four skinny rank-r ones a layer: faster on the tiny CPU model, not the same "
                                  "arithmetic (utils/train/lora_fast.py, docs/PERFORMANCE.md).", LORA_FORWARDS)


@dataclass
class MemoryConfig:
    micro_batch_tokens: int = field(16384, "Token budget per forward and backward: a batch's sequences, longest "
                                           "first, in micro-batches of at most this many tokens, a backward after "
                                           "each, one optimizer step per batch, every normaliser the whole "
                                           "batch's (utils/train/update.py). 0 = the whole batch in one.", minimum=0)
    logits_chunk_mib: float = field(512.0, "The LM head runs over chunks of positions whose working set (fp32 "
                                           "logits, copies, gradients: utils/train/head.py LIVE_LOGITS) takes at "
                                           "most this many MiB, recomputed in the backward, so no [positions, "
                                           "vocabulary] tensor outlives one chunk. 0 = one chunk.", minimum=0.0)
    activation_checkpointing: bool = field(False, "Recompute each decoder layer's activations in the backward "
                                                  "instead of keeping them (transformers' gradient "
                                                  "checkpointing, non-reentrant): less memory per token, one "
                                                  "more forward of each layer in the backward.")
    preflight: bool = field(True, "On a CPU, 04 and the RL stages estimate their peak resident memory before "
                                  "loading the model and stop at once, naming the setting to change, where the "
                                  "machine's available memory is short (utils/train/preflight.py). false runs "
                                  "anyway.")


@dataclass
class EngineConfig:
    name: str = field("vllm", "Sampling engine.", ENGINE_NAMES)
    dtype: str = field("float32", "Engine dtype. fp32 makes vLLM and the trainer agree to ~1e-6 on CPU.", DTYPES)
    max_model_len: int = field(512, "Longest context (prompt + generation) the engine accepts.", minimum=1)
    memory_share: float = field(0.3, "vLLM gpu_memory_utilization: on CPU the share of RAM for the KV cache "
                                     "(0.92 fails to start on a 24 GiB box; 0.3 works).", minimum=0.0)
    lora_serving: str = field("adapter", "vllm: serve the policy's LoRA as an adapter (LoRARequest), or merged "
                                         "into the base weights, reloaded on each policy change (no LoRA kernels "
                                         "in decoding; docs/PERFORMANCE.md).", LORA_SERVING)
    in_process: bool = field(False, "vllm: run the engine core and its worker in this process instead of two "
                                    "spawned ones (VLLM_ENABLE_V1_MULTIPROCESSING=0). On the 2-core box: engine "
                                    "start 9 s instead of 22 s, decode steps up to 1.6x faster (docs/PERFORMANCE.md). "
                                    "A second in-process engine in the same process needs `kv_cache_gb`. "
                                    "Untested on GPU.")
    kv_cache_gb: float = field(0.0, "vllm: KV cache size in GiB; 0 lets vLLM size it from `memory_share`. An "
                                    "explicit size lets two in-process engines share one process.", minimum=0.0)
    max_lora_rank: int = field(16, "Largest LoRA rank vLLM serves (1, 8, 16, 32, ...); at least model.lora.rank, checked at parse.")
    max_loras: int = field(2, "LoRA adapters vLLM keeps loaded at once (old and new policy).")
    max_num_seqs: int = field(256, "Sequences vLLM batches at once.", minimum=1)
    enable_sleep_mode: bool = field(False, "GPU only: let vLLM free its memory while the trainer runs. Untested here.")
    enforce_eager: bool = field(True, "Skip CUDA graph capture (no effect on CPU).")
    hf_batch_size: int = field(64, "hf engine: prompts per generate() call (bounds padded memory).", minimum=1)
    base_url: str = field("http://127.0.0.1:8000/v1", "openai engine: the OpenAI-compatible endpoint, e.g. "
                                                      "`python -m utils.deploy.serve`.")
    served_model: str = field("base", "openai engine: the endpoint's name for the base model (adapters are "
                                      "found by the directory they were served from).")
    api_key_env: str = field("OPENAI_API_KEY", "openai engine: environment variable holding the API key, if any.")
    request_timeout: float = field(120.0, "openai engine: seconds per request before it fails.", minimum=0.0)
    max_concurrent_requests: int = field(64, "openai engine: requests in flight at once.", minimum=1)


@dataclass
class TemplatesConfig:
    planner: str = field("{context}plan: {question}\n", "Planner prompt; {question} is replaced, and {context} by "
                                                         "the row's framed context (`context`), or by nothing.")
    executor: str = field("solve: {task}\n", "Executor prompt; {task} is replaced by the subtask. It may use "
                                              "{context} too; by default it does not (the executor sees only "
                                              "its subtask: the planner must put what it needs there).")
    context: str = field("context:\n{context}\n", "How a row's context (FinQA table and text, HotpotQA "
                                                    "paragraphs) is framed where a role prompt says {context}.")
    result: str = field("<result>{result}</result>\n", "Text injected into the planner context after a subtask.")
    use_chat_template: bool = field(False, "Wrap prompts with the tokenizer's chat template (real chat models).")
    planner_system: str = field("", "Chat template: the planner's system message, replacing the template's default.")
    executor_system: str = field("", "Chat template: the executor's system message (empty: none of ours).")
    thinking: str = field("plain", "What a <think> block holds: plain, or actor_critic (the seed's procedural "
                                   "thinking: 'actor:' attempt, 'critic:' check, 'refined:' reasoning, in one "
                                   "generation; the `actor_critic` text is put before each role prompt, and "
                                   "gold traces are written that way).", THINKING_MODES)
    actor_critic: str = field("Inside <think>, reason in three parts, in this order: 'actor:' a step-by-step "
                              "attempt; 'critic:' a strict, skeptical check of that attempt; 'refined:' the "
                              "corrected reasoning you act on.\n",
                              "With thinking: actor_critic, the instruction put before each role prompt.")
    actor_critic_roles: str = field("both", "With thinking: actor_critic, the roles that think that way: both, "
                                            "planner or executor (a planner's thinking stays in its context "
                                            "for every later turn).", TRAIN_ROLES)


@dataclass
class ModelConfig:
    name: str = field("tiny-arith", "Short name, used in output paths and reports.")
    path: str = field("artifacts/tiny-arith", "Local directory (relative to the repo) or hub id of the base model.")
    dtype: str = field("float32", "Trainer dtype.", DTYPES)
    device: str = field("cpu", "Where 04/05/06 train: cpu, or cuda (a GPU per rank under a launcher; run on one "
                               "H100 and one H200, docs/PERFORMANCE.md). Batches follow the policy; engines pick their device.", ("cpu", "cuda"))
    trust_remote_code: bool = field(False, "Let transformers and vLLM run Python code shipped in the model's "
                                           "directory (auto_map). Off: such a model is refused.")
    lora: LoraConfig = field(LoraConfig(), "LoRA settings.")
    memory: MemoryConfig = field(MemoryConfig(), "The trainers' memory: micro-batches, LM-head chunks, "
                                                 "activation checkpointing (docs/ARCHITECTURE.md, \"Memory of "
                                                 "the update\").")
    engine: EngineConfig = field(EngineConfig(), "Sampling-engine settings.")
    templates: TemplatesConfig = field(TemplatesConfig(), "Prompt templates; the tag protocol is the same everywhere.")


@dataclass
class DataConfig:
    name: str = field("synthetic_arith", "Dataset adapter name.", ADAPTER_NAMES)
    path: str = field("data/synthetic_arith", "Local directory of the dataset's native files.")
    scorer: str = field("numeric", "Answer scorer.", SCORER_NAMES)
    seed: int = field(1234, "Seed of a generated dataset's generator, apart from the run seed: every run and seed "
                            "is scored on the same test items (synthetic, word problems).")
    n_train: int | float = field(2000, "Synthetic: questions to generate. Real data: cap on train rows (0 = all; "
                                       "a fraction in (0, 1) keeps that share).")
    n_val: int | float = field(100, "Synthetic: questions to generate. Real data: cap, or rows carved from "
                                    "train when the source has no val split; a count, or a fraction in (0, 1) "
                                    "of the split it comes from (0.1: a tenth).")
    n_test: int | float = field(200, "Synthetic: questions to generate. Real data: cap, or rows carved when "
                                     "the source has no test split; a count or a fraction, as n_val.")
    context_max_tokens: int = field(0, "Token budget of a row's context in the prompt (0 = what max_model_len "
                                       "leaves after the prompt and one planner turn); 01 cuts whole lines "
                                       "from the end and says so in a last line.")
    on_leakage: str = field("drop_from_train", "A val/test question also in train.", LEAKAGE_POLICIES)
    min_steps: int = field(1, "Fewest subtasks per problem (generated data: synthetic, word problems).")
    max_steps: int = field(6, "Most subtasks per problem (generated data).")
    ops: list[str] = field(["+", "-"], "Operators (synthetic only).")
    operand_max: int = field(50, "Largest operand (generated data).")
    templates: list[int] = field([], "GSM-Symbolic: reasoning-gym's template indices to draw from (empty: every "
                                     "template it marks working); min_steps/max_steps bound an item's calculation "
                                     "lines (utils/data/gsm_symbolic.py).")
    value_max: int = field(99, "Largest running value (synthetic only).")


@dataclass
class TracesConfig:
    source: str = field("gold", "SFT trace source: gold (the task's decomposition), solution (worked solution "
                                "lines) or teacher (rejection-sampled episodes of a teacher model).",
                        TRACE_SOURCE_NAMES)
    max_traces: int = field(0, "Cap on traces written, in train order (0 = one per usable training row).", minimum=0)
    max_subtasks: int = field(0, "Keep only traces with at most this many subtasks (0 = all lengths).", minimum=0)
    long_traces: int = field(0, "With max_subtasks: also keep this many longer ones, first in train order.", minimum=0)
    critic_error_rate: float = field(0.2, "With thinking: actor_critic, the share of gold executor steps (integer "
                                          "results only) whose actor part shows a result off by one, which the critic "
                                          "flags ('no') and the refined part corrects. Not tuned.")
    flaw_rate: float = field(0.0, "The imperfect teacher: the share of gold chains of 2+ subtasks (drawn as "
                                  "traces.flaw_draw says) whose planner stops one subtask early and answers that "
                                  "result.")
    flaw_draw: str = field("question", "How the imperfect teacher's flawed chains are drawn: question (each chain of "
                                       "2+ subtasks on its own, with probability flaw_rate) or length (of the traced "
                                       "chains of each gold length, exactly round(flaw_rate x their count), the first "
                                       "by a draw from (seed, question id)).", ("question", "length"))
    teacher_path: str = field("", "teacher source: base model directory (empty = model.path).")
    teacher_adapter: str = field("", "teacher source: optional LoRA adapter directory for the teacher.")
    teacher_samples: int = field(4, "teacher source: episodes sampled per question.", minimum=1)
    teacher_temperature: float = field(0.7, "teacher source: sampling temperature.", minimum=0.0)
    teacher_batch: int = field(32, "teacher source: questions rolled out per engine batch.", minimum=1)


@dataclass
class WarmupConfig:
    steps: int = field(300, "SFT optimizer steps.", minimum=0)
    lr: float = field(5e-3, "Peak lr (linear warmup, then cosine decay to final_lr_ratio * lr).", minimum=0.0)
    final_lr_ratio: float = field(1.0, "LR at the last step as a share of the peak; 1 keeps it constant after "
                                       "warmup (measured on regime A: docs/journal).")
    warmup_steps: int = field(30, "Linear warmup steps.", minimum=0)
    decay_start: int = field(0, "Step where the cosine decay begins; the lr stays at its peak until then "
                                "(0 = decay right after the linear warmup).", minimum=0)
    batch_size: int = field(32, "Examples per step (planner and executor examples mixed).", minimum=1)
    weight_decay: float = field(0.0, "AdamW weight decay.", minimum=0.0)
    max_grad_norm: float = field(1.0, "Gradient-norm clip of each SFT step.", minimum=0.0)
    max_skips_in_a_row: int = field(5, "Stop when this many SFT steps in a row were skipped for a non-finite "
                                       "loss or gradient (0 = never stop).", minimum=0)
    eval_every: int = field(100, "Validate (greedy rollouts on val) every N steps; 0 = only at the end.", minimum=0)
    eval_size: int = field(100, "Validation questions per evaluation (0 = all).", minimum=0)
    patience: int = field(0, "Stop once this many validations in a row have not beaten the best one (0 = run all "
                             "`steps`). The lr schedule stays the one for `steps`, so a stopped run's steps are "
                             "the full run's up to the stop, and its best checkpoint is the full run's unless the "
                             "full run would have beaten it later.", minimum=0)
    save_every: int = field(100, "Write the resumable checkpoint every N steps.", minimum=1)
    save_minutes: float = field(10.0, "Also write it once this many minutes have passed since the last one, "
                                      "so a pre-empted machine loses at most that much (0 = by steps only).",
                                minimum=0.0)


@dataclass
class JudgeConfig:
    enabled: bool = field(False, "Score answers with an LLM judge behind an OpenAI-compatible endpoint.")
    base_url: str = field("http://127.0.0.1:8000/v1", "Endpoint base URL, e.g. a `vllm serve` judge.")
    model: str = field("judge", "Model name the endpoint serves.")
    timeout: float = field(30.0, "Seconds per request.")
    api_key_env: str = field("OPENAI_API_KEY", "Environment variable holding the API key, if any.")


@dataclass
class ProcessRewardConfig:
    source: str = field("none", "Process rewards, one per planner step (utils/reward/process.py): none, verifier "
                                "(the step is the gold chain's next step; rows with meta.steps) or judge (the "
                                "SFT warmup asked yes/no on its own engine).", ("none", "verifier", "judge"))
    judge_template: str = field("question: {question}\nsteps: {steps}\nnext: {subtask}\nis next a sensible next "
                                "step? yes or no: ", "judge: the prompt; {question}, {steps} (earlier subtasks), "
                                "{subtask}.")
    judge_max_tokens: int = field(4, "judge: tokens of the reply read for a yes or no.")
    judge_engine: str = field("hf", "judge: the engine serving the judge (the SFT warmup adapter).", ENGINE_NAMES)


@dataclass
class RewardConfig:
    answer_scale: float = field(6.0, "Composite: answer_scale*score + answer_shift + format_weight*format.")
    answer_shift: float = field(-3.0, "Composite shift (seed default -3).")
    format_weight: float = field(0.1, "Weight of the graduated format score (seed default 0.1).")
    efficiency_weight: float = field(0.0, "Penalty per unit of token overrun past efficiency_budget (0 = off).")
    efficiency_budget: int = field(256, "Generated tokens per episode before the efficiency penalty starts.")
    independence_weight: float = field(0.0, "Weight of the subtask-independence score in [0, 1] (the Recursive "
                                            "Reasoner's term; its seed used 0.3; 0 = off).")
    independence_refs: str = field(INDEPENDENCE_REFS, "Regex of back-references into the planner's context; a "
                                                      "subtask that matches it is not independent "
                                                      "(utils/reward/scorers.py subtask_independence).")
    numeric_rel_tol: float = field(1e-4, "Relative tolerance of the numeric scorer.")
    judge: JudgeConfig = field(JudgeConfig(), "Optional LLM judge (replaces the scorer when enabled).")
    process: ProcessRewardConfig = field(ProcessRewardConfig(), "Step-level process rewards (CDRA), used by "
                                                                "algorithm.rl.process_weight.")


@dataclass
class EvalConfig:
    samples: int = field(0, "07 also samples this many episodes per test item at the rollout temperature "
                            "(algorithm.rl.temperature): mean@k and pass@k beside greedy (0 = greedy only).", minimum=0)
    primary: str = field("greedy", "The metric 08's paired tests run on, fixed before a study: greedy accuracy, or "
                                   "mean@k (an item's share of correct samples; needs samples > 0).", PRIMARY_METRICS)
    equivalence_margin: float = field(0.0, "08's margin δ on the primary metric, declared before the study: a pair "
                                           "within ±δ by two one-sided tests reads 'equivalent' (0 = off).", minimum=0.0)
    curve_samples: int = field(0, "07's pass@k curve: n more episodes per test item at the rollout temperature, apart "
                                  "from `samples` (mean@k stays as it is), pass@k for k = 1, 2, 4, ... n (0 = none).", minimum=0)


@dataclass
class ToolConfig:
    retriever: str = field("none", "The executor's search tool: none (no tool), bm25 or dense. Set by a data "
                                   "tier that needs it (configs/data/synthetic_lookup.yaml).", RETRIEVER_NAMES)
    corpus: str = field("corpus.jsonl", "Corpus file, JSONL of {id, title, text}, relative to data.path; \"@context\": "
                                        "the rows' own context paragraphs (HotpotQA), built by 01.")
    top_k: int = field(2, "Passages returned per search.")
    max_searches: int = field(2, "Searches allowed per subtask; one more ends the episode (executor_error).")
    max_query_chars: int = field(200, "Longest query searched; a longer one gets an information block saying so.")
    information: str = field("<information>{passages}</information>\n",
                             "Text injected into the executor's context after a search; {passages} is the "
                             "top-k passages, one per line (never trained on).")
    embedding_model: str = field("", "dense: local directory of the model that embeds passages and queries.")


@dataclass
class AgentConfig:
    """What the episode loop reads, in every stage that rolls one out (03's gold traces, 04's validation,
    05/06's rollouts, 07): the planner's turns, each role's token budget and the executor's tool. The
    thinking mode stays in model.templates: it changes the prompt text, which the templates render."""
    max_turns: int = field(8, "Planner turns before the episode is forced to end (gold needs subtasks + 1).", minimum=1)
    max_new_tokens_planner: int = field(48, "Generation budget per planner turn.", minimum=1)
    max_new_tokens_executor: int = field(48, "Generation budget per executor call.", minimum=1)
    tool: ToolConfig = field(ToolConfig(), "The executor's search tool (off unless agent.tool.retriever is set).")


MOVED.update({"RlConfig.max_turns": "agent.max_turns", "ModelConfig.max_new_tokens_planner": "agent.max_new_tokens_planner",
              "ModelConfig.max_new_tokens_executor": "agent.max_new_tokens_executor", "RunConfig.tool": "agent.tool"})


@dataclass
class RunConfig:
    run_id: str = field("run_001", "Outputs go to outputs/<run_id>/.")
    seed: int = field(1, "Seed for every random choice in the run.")
    regime: str = field("", "The named regime, configs/regimes/<name>.yaml: run-level settings merged over the tiers' "
                            "run: sections, under --config and --set. A data tier names its default (synthetic_arith: "
                            "imperfect_teacher, word_problems: real_cpu); --set regime=NAME selects another.")
    outputs_dir: str = field("outputs", "Root of all run outputs (relative to the repo).")
    threads: int = field(0, "torch CPU threads; 0 keeps torch's default.")
    wandb_mode: str = field("auto", "auto is offline unless WANDB_API_KEY is set.", ("auto", "online", "offline", "disabled"))
    model: ModelConfig = field(ModelConfig(), "Model tier (configs/models/).")
    algorithm: AlgorithmConfig = field(AlgorithmConfig(), "Algorithm tier (configs/algorithms/).")
    data: DataConfig = field(DataConfig(), "Data tier (configs/data/).")
    reward: RewardConfig = field(RewardConfig(), "Reward spec written by 02_build_rewards.")
    traces: TracesConfig = field(TracesConfig(), "SFT traces written by 03_generate_sft_traces.")
    warmup: WarmupConfig = field(WarmupConfig(), "LoRA SFT warmup run by 04_sft_warmup.")
    agent: AgentConfig = field(AgentConfig(), "The episode loop: turns, token budgets, the executor's tool.")
    eval: EvalConfig = field(EvalConfig(), "Test-split evaluation by 07_evaluate (and what 08 tests).")

"""Rendering the role prompts from the model config's templates (docs/ARCHITECTURE.md, "Protocol").

Templates are `str.format` strings: the planner's sees {question} and {context}, the executor's
{task} and {context}. {context} is the row's context framed by `templates.context`, or nothing when
the row has none, so a context-free row renders as if the template had no {context} at all.
`fit_context` cuts a context to a token budget (01_prepare_dataset applies it once, so every
stage renders the same prompt). With `thinking: actor_critic`, the `actor_critic` instruction comes
first in the prompts of the roles `actor_critic_roles` names. With `use_chat_template`, the rendered text becomes the
user turn of the tokenizer's chat template, with the generation prompt appended, after the role's
system message (`planner_system`, `executor_system`) when one is set: it then replaces the
template's default system prompt instead of adding a second one.
"""
from __future__ import annotations

from utils.agent.protocol import EXECUTOR, PLANNER, thinks_actor_critic
from utils.core.config import ConfigError
from utils.core.schema import TemplatesConfig


class TemplateError(ConfigError):
    """A prompt template that cannot be rendered: a config error, reported as one line by run_main."""


def _fill(template: str, name: str, **values: str) -> str:
    try:
        return template.format(**values)
    except (KeyError, IndexError, ValueError) as exc:
        raise TemplateError(f"model.templates.{name}: cannot render {template!r}: {exc!r} "
                            f"(available fields: {', '.join(sorted(values))})") from None


def _chat(text: str, tokenizer, system: str = "") -> str:
    if tokenizer is None:
        raise TemplateError("model.templates.use_chat_template is true but no tokenizer was given")
    messages = ([{"role": "system", "content": system}] if system else []) + [{"role": "user", "content": text}]
    try:
        return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    except Exception as exc:  # noqa: BLE001 - a template's own raise_exception (e.g. no system role)
        raise TemplateError(f"the model's chat template refused the {'system and ' if system else ''}user "
                            f"messages ({type(exc).__name__}: {exc}); with a template that has no system role, "
                            f"leave model.templates.planner_system and executor_system empty") from None


def _framed(t: TemplatesConfig, context: str | None) -> str:
    return _fill(t.context, "context", context=context) if context else ""


def actor_critic_for(t: TemplatesConfig, role: str) -> bool:
    """Whether `role` thinks in the actor-critic mode under templates `t`."""
    return thinks_actor_critic(t.thinking, t.actor_critic_roles, role)


def _role_prompt(t: TemplatesConfig, text: str, tokenizer, role: str) -> str:
    if actor_critic_for(t, role):
        text = t.actor_critic + text
    if not t.use_chat_template:
        return text
    return _chat(text, tokenizer, t.planner_system if role == PLANNER else t.executor_system)


def render_planner(t: TemplatesConfig, question: str, context: str | None = None, tokenizer=None) -> str:
    return _role_prompt(t, _fill(t.planner, "planner", question=question, context=_framed(t, context)), tokenizer,
                        PLANNER)


def render_executor(t: TemplatesConfig, task: str, tokenizer=None, context: str | None = None) -> str:
    return _role_prompt(t, _fill(t.executor, "executor", task=task, context=_framed(t, context)), tokenizer,
                        EXECUTOR)


def fit_context(context: str, count_tokens, budget: int) -> tuple[str, dict | None]:
    """`context` cut to at most `budget` tokens (as `count_tokens` counts them): whole lines are kept
    from the start while they fit, and a last line says how many were cut. Returns (text, None) when
    it fits, else (cut text, {"lines_kept", "lines_total", "tokens_before"})."""
    before = count_tokens(context)
    if before <= budget:
        return context, None
    lines = context.split("\n")
    for kept in range(len(lines) - 1, -1, -1):
        note = f"[context cut: {len(lines) - kept} of {len(lines)} lines dropped to fit {budget} tokens]"
        text = "\n".join([*lines[:kept], note])
        if count_tokens(text) <= budget:
            return text, {"lines_kept": kept, "lines_total": len(lines), "tokens_before": before}
    raise TemplateError(f"a context budget of {budget} tokens cannot even hold the note that says what was cut; "
                        f"raise data.context_max_tokens or model.engine.max_model_len")


def render_result(t: TemplatesConfig, result: str) -> str:
    return _fill(t.result, "result", result=result)

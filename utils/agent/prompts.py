"""Rendering the role prompts from the model config's templates (docs/ARCHITECTURE.md, "Protocol").

Templates are `str.format` strings: the planner's sees {question} and {context} (empty when the
row has none), the executor's sees {task}. With `use_chat_template`, the rendered text becomes the
user turn of the tokenizer's chat template, with the generation prompt appended.
"""
from __future__ import annotations

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


def _chat(text: str, tokenizer) -> str:
    if tokenizer is None:
        raise TemplateError("model.templates.use_chat_template is true but no tokenizer was given")
    return tokenizer.apply_chat_template([{"role": "user", "content": text}], tokenize=False,
                                         add_generation_prompt=True)


def render_planner(t: TemplatesConfig, question: str, context: str | None = None, tokenizer=None) -> str:
    text = _fill(t.planner, "planner", question=question, context=context or "")
    return _chat(text, tokenizer) if t.use_chat_template else text


def render_executor(t: TemplatesConfig, task: str, tokenizer=None) -> str:
    text = _fill(t.executor, "executor", task=task)
    return _chat(text, tokenizer) if t.use_chat_template else text


def render_result(t: TemplatesConfig, result: str) -> str:
    return _fill(t.result, "result", result=result)

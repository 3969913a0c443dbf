"""The agent protocol in one place: tags, stop strings, parsing, turn texts and the format score
(docs/ARCHITECTURE.md, "Protocol").

    planner turn:   <think>…</think><task>subtask</task>      or   <think>…</think><answer>final</answer>
    executor:       <think>…</think><answer>result</answer>
    injected:       <result>executor's answer</result>          (the template is model.templates.result)
    with the search tool (utils/agent/retrieval.py), an executor segment may end in a search instead:
    executor:       <think>…</think><search>query</search>
    injected:       <information>top-k passages</information>  (into that executor's context only;
                    the template is agent.tool.information), then the executor continues

With `model.templates.thinking: actor_critic` (the seed's procedural-thinking mode) a think block
holds three labelled parts, in order: `actor: <first attempt> critic: <a strict check of it>
refined: <the reasoning acted on>`. The format score does not look inside <think>: the mode is
scored by the same rules; `split_actor_critic` tells whether a think block follows it.

The engines stop a planner turn at `</task>` or `</answer>` and an executor at `</answer>`. Parsing
never raises on model output and reads at most `MAX_PARSED_CHARS` characters, so garbage costs
bounded work. The format score is graduated: repeated or nested tags earn partial, not full,
credit, so a policy cannot farm format reward by spamming tags (a departure from the seed).
"""
from __future__ import annotations

import re


THINK, TASK, ANSWER, SEARCH = "think", "task", "answer", "search"
PLANNER, EXECUTOR = "planner", "executor"
ROLE_TAGS = {EXECUTOR: (THINK, (ANSWER,)), PLANNER: (THINK, (TASK, ANSWER))}  # role -> (think tag, action tags)
PLANNER_STOPS = [f"</{TASK}>", f"</{ANSWER}>"]
EXECUTOR_STOPS = [f"</{ANSWER}>"]
SEARCHER_STOPS = [f"</{ANSWER}>", f"</{SEARCH}>"]  # an executor with the search tool
MAX_PARSED_CHARS = 20_000  # longer outputs are parsed and scored on their head


def wrap(tag: str, content: str) -> str:
    return f"<{tag}>{content}</{tag}>"


def planner_task_turn(think: str, task: str) -> str:
    return wrap(THINK, think) + wrap(TASK, task)


def planner_answer_turn(think: str, answer: str) -> str:
    return wrap(THINK, think) + wrap(ANSWER, answer)


def executor_turn(think: str, answer: str) -> str:
    return wrap(THINK, think) + wrap(ANSWER, answer)


ACTOR_CRITIC_LABELS = ("actor", "critic", "refined")
_ACTOR_CRITIC = re.compile(r"\s*actor:(.*?)\bcritic:(.*?)\brefined:(.*)", re.DOTALL)


def thinks_actor_critic(thinking: str, roles: str, role: str) -> bool:
    """Whether `role` thinks in the actor-critic mode under model.templates.thinking and
    actor_critic_roles ("both", "planner" or "executor")."""
    return thinking == "actor_critic" and roles in ("both", role)


def actor_critic_think(actor: str, critic: str, refined: str) -> str:
    """The body of an actor-critic think block."""
    return f"actor: {actor} critic: {critic} refined: {refined}"


def split_actor_critic(think: str | None) -> tuple[str, str, str] | None:
    """(actor, critic, refined) of a think body that has the three labels once each, in order, each
    part non-empty; None otherwise."""
    if not think:
        return None
    text = str(think)[:MAX_PARSED_CHARS]
    if any(text.count(f"{label}:") != 1 for label in ACTOR_CRITIC_LABELS):
        return None
    m = _ACTOR_CRITIC.fullmatch(text)
    if not m:
        return None
    parts = tuple(g.strip() for g in m.groups())
    return parts if all(parts) else None


def tag_pairs(text: str, tag: str) -> list[str]:
    """Contents of the complete <tag>...</tag> pairs, left to right, each closed by the first close
    after its open (what the non-greedy regex `<tag>(.*?)</tag>` finds), in one linear scan: the
    regex is quadratic on an output of many unclosed opens."""
    opening, closing, found, pos = f"<{tag}>", f"</{tag}>", [], 0
    while (i := text.find(opening, pos)) >= 0:
        j = text.find(closing, i + len(opening))
        if j < 0:
            break
        found.append(text[i + len(opening):j])
        pos = j + len(closing)
    return found


def extract_tag(text: str, tag: str) -> str | None:
    """Content of the last complete <tag>...</tag> in `text`, stripped; None if there is none."""
    found = tag_pairs(str(text)[:MAX_PARSED_CHARS], tag)
    return found[-1].strip() if found else None


def last_action(text: str, other: str = TASK) -> tuple[str | None, str | None]:
    """(answer, task) of a planner turn, or (answer, query) of an executor segment with
    other=SEARCH: the action tag that closes the text wins."""
    ans_end, other_end = text.rfind(f"</{ANSWER}>"), text.rfind(f"</{other}>")
    if ans_end > other_end:
        return extract_tag(text, ANSWER), None
    if other_end >= 0:
        return None, extract_tag(text, other)
    return None, None


def _tag_credit(text: str, tag: str) -> float:
    """1 for exactly one well-formed, non-empty, un-nested pair; 0.5 if present but repeated,
    nested or empty; 0 if absent or never closed."""
    opens, closes = text.count(f"<{tag}>"), text.count(f"</{tag}>")
    pairs = tag_pairs(text, tag)
    if not pairs:
        return 0.0
    if opens == closes == 1 and pairs[0].strip() and f"<{tag}>" not in pairs[0]:
        return 1.0
    return 0.5


def format_score(text: str, role: str, search: bool = False) -> tuple[float, dict]:
    """Graduated format score in [0, 1] for one generated segment of `role`, with its parts.

    Half the credit is for a <think> block, half for the role's action tag: executor <answer>
    (or, with the search tool, exactly one of <answer> or <search>); planner exactly one of <task>
    or <answer>. Two action tags in one segment, or text after the action, earn half credit for
    the action.
    """
    if role not in ROLE_TAGS:
        raise KeyError(f"unknown role '{role}'; valid: {', '.join(ROLE_TAGS)}")
    text = str(text)[:MAX_PARSED_CHARS]
    think_tag, actions = ROLE_TAGS[role]
    if search and role == EXECUTOR:
        actions = (*actions, SEARCH)
    think = _tag_credit(text, think_tag)
    present = [(c, a) for c, a in ((_tag_credit(text, a), a) for a in actions) if c > 0]
    if not present:
        action = 0.0
    elif len(present) > 1:
        action = 0.5
    else:
        credit, tag = present[0]
        tail = text[text.rfind(f"</{tag}>") + len(tag) + 3:]
        action = credit if not tail.strip() else min(credit, 0.5)
    return 0.5 * think + 0.5 * action, {"think": think, "action": action}

"""What a model's chat template does with a conversation: where the replies are, where the system prompt goes.

Loss masking needs the character span of every assistant reply in the rendered text. Real
templates make that harder than rendering growing prefixes:

- Phi-3 appends the eos token when there is no generation prompt, so the render of the first
  turns is never a prefix of the whole render;
- Gemma raises ``TemplateError`` on a system message;
- Mistral v0.3 writes the system prompt in front of the *last* user turn only, and drops it from
  a conversation that ends with the assistant.

Spans come from the template's ``{% generation %}`` markers when it has them (what
transformers' ``return_assistant_tokens_mask`` uses), else from rendering per turn: a reply starts
where the generation prompt ends and ends where the render of the conversation up to that reply
stops agreeing with the whole render (the longest common prefix, cut back to a token boundary so
an appended eos never eats the start of the next turn's header).

The system prompt is probed once per tokenizer (``system_placement``) with marker strings, and
``data.system_prompt`` decides what to do when the template cannot keep it in place.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Literal

from lorapod.errors import DataError

GENERATION_TAG = re.compile(r"\{%-?\s*generation\s*-?%\}")

Placement = Literal["keeps", "rejects", "last_user", "drops", "none"]
SystemMode = Literal["keep", "first_user", "last_user"]


class TemplateRejected(DataError):
    """The chat template raised on this conversation (``raise_exception`` in the Jinja template)."""


def has_generation_markers(tokenizer) -> bool:
    template = tokenizer.get_chat_template() if getattr(tokenizer, "chat_template", None) else ""
    return bool(GENERATION_TAG.search(template or ""))


def render(tokenizer, messages: list[dict], add_generation_prompt: bool = False) -> str:
    """The template's text for ``messages``; a template error becomes ``TemplateRejected``."""
    from jinja2 import TemplateError

    try:
        return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=add_generation_prompt)
    except TemplateError as exc:
        raise TemplateRejected(f"the model's chat template refuses this conversation: {exc}",
                               hint="fix the conversation (see docs/llm.md, 'Chat templates'), or "
                               "--set data.skip_bad_examples=true to leave it out") from exc


# ----------------------------------------------------------------------------- system prompt

_PROBE = ("LPSYSPROBE", "LPUSERONE", "LPREPLYONE", "LPUSERTWO", "LPREPLYTWO")


def system_placement(tokenizer) -> Placement:
    """Where the template puts a system prompt in a two-turn conversation that ends with the assistant.

    ``keeps``: before the first user turn (ChatML, Llama 3, Phi-3); ``rejects``: it raises (Gemma);
    ``last_user``: only in front of the last user turn, and dropped once the assistant answered it
    (Mistral v0.3); ``drops``: nowhere; ``none``: the template cannot render the probe at all.
    """
    s, u1, a1, u2, a2 = _PROBE
    msgs = [{"role": "system", "content": s}, {"role": "user", "content": u1}, {"role": "assistant", "content": a1},
            {"role": "user", "content": u2}, {"role": "assistant", "content": a2}]
    try:
        full = render(tokenizer, msgs)
    except TemplateRejected:
        try:
            render(tokenizer, msgs[1:])
        except TemplateRejected:
            return "none"
        return "rejects"
    if s in full:
        return "keeps" if full.index(s) < full.index(u1) else "last_user"
    try:
        prompt = render(tokenizer, msgs[:4], add_generation_prompt=True)
    except TemplateRejected:
        return "drops"
    return "last_user" if s in prompt and prompt.index(s) > prompt.index(u1) else "drops"


@dataclass(frozen=True)
class SystemPlan:
    """What happens to a conversation's system prompt with this template, in words for the log."""

    mode: SystemMode
    placement: Placement
    explanation: str
    refused: bool = False  # data.system_prompt: keep on a template that cannot keep it


EXPLAIN = {
    "rejects": "the chat template has no system role (Gemma raises on one)",
    "last_user": "the chat template writes the system prompt in front of the last user turn only and drops it "
                 "once the assistant has answered (Mistral v0.3)",
    "drops": "the chat template drops the system prompt",
}


def plan_system(tokenizer, policy: str = "auto") -> SystemPlan:
    """Resolve ``data.system_prompt`` (auto | keep | first_user | last_user) against the template."""
    placement = system_placement(tokenizer)
    if placement in ("keeps", "none"):
        mode: SystemMode = "first_user" if policy == "first_user" else "last_user" if policy == "last_user" else "keep"
        why = "the chat template keeps the system prompt before the first user turn"
        if mode != "keep":
            why = f"data.system_prompt: {policy}: the system prompt is folded into the {policy.replace('_', ' ')} turn"
        return SystemPlan(mode, placement, why)
    problem = EXPLAIN[placement]
    if policy == "keep":
        return SystemPlan("keep", placement, f"{problem}; data.system_prompt: keep refuses conversations with one",
                          refused=True)
    if policy == "first_user" or (policy == "auto" and placement in ("rejects", "drops")):
        return SystemPlan("first_user", placement,
                          f"{problem}: the system prompt is written in front of the first user turn "
                          "(\"system\\n\\nuser\", Google's documented practice for Gemma), so every reply "
                          "is trained with it in view")
    return SystemPlan("last_user", placement,
                      f"{problem}: lorapod keeps that placement and writes it in front of the last user turn, "
                      "so the last reply of each conversation trains with the system prompt in view (as the "
                      "model sees it at inference) and earlier replies without it")


def place_system(messages: list[dict], plan: SystemPlan | None) -> list[dict]:
    """The conversation as the template will receive it under ``plan`` (a new list; input untouched)."""
    if plan is None or not messages or messages[0]["role"] != "system":
        return messages
    if plan.refused:
        raise TemplateRejected(f"this conversation has a system prompt and {EXPLAIN[plan.placement]}",
                               hint="set data.system_prompt: first_user (fold it into the first user turn) or "
                               "last_user (where Mistral puts it), or remove the system prompt")
    if plan.mode == "keep":
        return messages
    system, rest = messages[0]["content"], [dict(m) for m in messages[1:]]
    users = [i for i, m in enumerate(rest) if m["role"] == "user"]
    if not users:
        return messages
    answered = [i for i in users if any(m["role"] == "assistant" for m in rest[i:])] or users
    k = users[0] if plan.mode == "first_user" else answered[-1]
    if system.strip():
        rest[k]["content"] = f"{system}\n\n{rest[k]['content']}"
    return rest


# ----------------------------------------------------------------------------- reply spans


def _common_prefix(a: str, b: str) -> int:
    n = min(len(a), len(b))
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i


def _marker_spans(tokenizer, messages: list[dict]) -> tuple[str, list[tuple[int, int]]]:
    """The text and the ``{% generation %}`` spans, rendered as transformers renders them."""
    from jinja2 import TemplateError
    from transformers.utils.chat_template_utils import render_jinja_template

    try:
        texts, spans = render_jinja_template([messages], chat_template=tokenizer.get_chat_template(),
                                             return_assistant_tokens_mask=True, add_generation_prompt=False,
                                             **tokenizer.special_tokens_map)
    except TemplateError as exc:
        raise TemplateRejected(f"the model's chat template refuses this conversation: {exc}") from exc
    return texts[0], [tuple(s) for s in spans[0]]


def _token_start_before(offsets: list[tuple[int, int]], at: int) -> int:
    """``at``, moved back to the start of the token it falls inside (unchanged on a token boundary)."""
    for start, end in offsets:
        if start < at < end:
            return start
    return at


def _turn_spans(tokenizer, messages: list[dict]) -> tuple[str, list[tuple[int, int]]]:
    full = render(tokenizer, messages)
    offsets: list[tuple[int, int]] | None = None  # of the full text, computed once if a suffix needs them
    spans: list[tuple[int, int]] = []
    for i, m in enumerate(messages):
        if m["role"] != "assistant":
            continue
        before = render(tokenizer, messages[:i], add_generation_prompt=True) if i else ""
        if not full.startswith(before):
            raise DataError(
                f"the chat template renders turn {i} differently once later turns follow (the prompt up to reply "
                f"{i} is not the start of the whole conversation), so the reply cannot be located for loss masking",
                hint="set data.train_on_assistant_only: false (every token is trained), or give the tokenizer a "
                "template with {% generation %} markers (see docs/llm.md)",
            )
        upto = render(tokenizer, messages[: i + 1])
        if full.startswith(upto):
            end = len(upto)
        else:  # the template closes a conversation with a suffix (Phi-3's eos) the full render lacks here
            if offsets is None:
                offsets = tokenizer(full, add_special_tokens=False, return_offsets_mapping=True)["offset_mapping"]
            end = _token_start_before(offsets, _common_prefix(upto, full))
        if end < len(before) or (end == len(before) and m["content"]):
            raise DataError(f"reply {i} could not be located in the chat template's rendering",
                            hint="set data.train_on_assistant_only: false, or use a template with "
                            "{% generation %} markers")
        spans.append((len(before), end))
    return full, spans


def assistant_spans(tokenizer, messages: list[dict]) -> tuple[str, list[tuple[int, int]]]:
    """The rendered text and the character span of each assistant reply (with its end marker)."""
    if has_generation_markers(tokenizer):
        return _marker_spans(tokenizer, messages)
    return _turn_spans(tokenizer, messages)


# Used when a tokenizer has no chat template (base models). ChatML, as axolotl and TRL use:
# every turn is "<|im_start|>{role}\n{content}<|im_end|>\n" and the generation prompt is
# "<|im_start|>assistant\n". On a tokenizer without these special tokens they are spelled out as
# ordinary text, which works but costs a few tokens per turn.
FALLBACK_CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)


def ensure_chat_template(tokenizer) -> bool:
    """Give the tokenizer the fallback template when it has none; True when the fallback is used."""
    if getattr(tokenizer, "chat_template", None):
        return False
    tokenizer.chat_template = FALLBACK_CHAT_TEMPLATE
    return True

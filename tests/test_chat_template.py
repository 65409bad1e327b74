"""Label masking on real chat templates: the ones TRL's wheel ships (``trl/chat_templates/*.jinja``),
with small byte-level BPE tokenizers built here around each model's own special tokens.

The ``*_training`` variants carry ``{% generation %}`` markers, so transformers'
``return_assistant_tokens_mask`` is an independent reference for what should be labelled.
"""

from __future__ import annotations

import json
from functools import cache
from importlib import resources

import pytest

from lorapod.chat import tokenize
from lorapod.chat.template import (
    TemplateRejected,
    assistant_spans,
    place_system,
    plan_system,
    system_placement,
)
from lorapod.chat.tokenize import IGNORE
from lorapod.engine import llm_data
from lorapod.errors import DataError

pytest.importorskip("trl")

# Qwen2's pre-tokenizer split: a run of newlines is one piece, so "\n" + "\n" can be one token.
QWEN_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|"
              r"\s*[\r\n]+|\s+(?!\S)|\s+")
CORPUS = ["Hello there, how are you\n\nI am fine, thanks\n", "assistant\n\nSure", "user\nsystem\nmodel\n",
          "You are terse. Answer in French.", "système café 日本語 ✓ naïve"]

# Each model's special tokens (as in its tokenizer_config.json) and the template files to test.
MODELS = {
    "llama3": {"bos_token": "<|begin_of_text|>", "eos_token": "<|eot_id|>",
               "extra": ["<|start_header_id|>", "<|end_header_id|>", "<|eom_id|>", "<|python_tag|>"]},
    "qwen2_5": {"eos_token": "<|im_end|>", "pad_token": "<|endoftext|>", "extra": ["<|im_start|>"]},
    "gemma": {"bos_token": "<bos>", "eos_token": "<eos>", "pad_token": "<pad>",
              "extra": ["<start_of_turn>", "<end_of_turn>"]},
    "phi3": {"bos_token": "<s>", "eos_token": "<|endoftext|>",
             "extra": ["<|system|>", "<|user|>", "<|assistant|>", "<|end|>"]},
    "mistral": {"bos_token": "<s>", "eos_token": "</s>", "extra": ["[INST]", "[/INST]"]},
}
TEMPLATES = {  # template file -> model
    "llama3": "llama3", "llama3_1": "llama3", "llama3_training": "llama3",
    "qwen2_5": "qwen2_5", "qwen2_5_training": "qwen2_5",
    "gemma": "gemma", "gemma_training": "gemma",
    "phi3": "phi3", "phi3_training": "phi3",
}
# TRL ships no Mistral template. This reproduces only the system-prompt rule of Mistral v0.3's
# template (the system text goes in front of the *last* user message, so a conversation that
# ends with the assistant loses it); used to test how lorapod handles that rule.
MISTRAL_V03_RULE = (
    "{%- if messages[0]['role'] == 'system' %}{%- set system_message = messages[0]['content'] %}"
    "{%- set loop_messages = messages[1:] %}{%- else %}{%- set loop_messages = messages %}{%- endif %}"
    "{{- bos_token }}{%- for message in loop_messages %}{%- if message['role'] == 'user' %}"
    "{%- if loop.last and system_message is defined %}{{- '[INST] ' + system_message + '\\n\\n' + message['content'] + '[/INST]' }}"
    "{%- else %}{{- '[INST] ' + message['content'] + '[/INST]' }}{%- endif %}"
    "{%- elif message['role'] == 'assistant' %}{{- ' ' + message['content'] + eos_token }}{%- endif %}{%- endfor %}"
)


def template_text(name: str) -> str:
    return resources.files("trl").joinpath("chat_templates", f"{name}.jinja").read_text(encoding="utf-8")


@cache
def _tokenizer_json(model: str) -> str:
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, trainers

    spec = MODELS[model]
    specials = [v for k, v in spec.items() if k != "extra"] + spec["extra"]
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.Split(Regex(QWEN_SPLIT), "isolated"),
                                                 pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator(CORPUS * 20, trainers.BpeTrainer(vocab_size=400, special_tokens=specials, show_progress=False,
                                                             initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    return tok.to_str()


def tokenizer(model: str, template: str | None):
    from tokenizers import Tokenizer
    from transformers import PreTrainedTokenizerFast

    spec = MODELS[model]
    kw = {k: v for k, v in spec.items() if k != "extra"}
    fast = PreTrainedTokenizerFast(tokenizer_object=Tokenizer.from_str(_tokenizer_json(model)),
                                   additional_special_tokens=spec["extra"], **kw)
    if fast.pad_token is None:
        fast.pad_token = fast.eos_token
    fast.chat_template = template
    return fast


def tok_for(template: str):
    return tokenizer(TEMPLATES[template], template_text(template))


def u(text):
    return {"role": "user", "content": text}


def a(text):
    return {"role": "assistant", "content": text}


SYSTEM = {"role": "system", "content": "You are terse. Answer in French."}
CONVERSATIONS = {
    "multi-turn": [u("Hello there"), a("I am fine, thanks"), u("how are you"), a("Sure")],
    "system": [SYSTEM, u("Hello there"), a("I am fine"), u("thanks"), a("Sure")],
    "unicode": [u("café ✓ 日本語"), a("naïve système 日本語 ✓")],
    "repeats-user": [u("Hello there, how are you"), a("Hello there, how are you"), u("Hello there"), a("Hello there")],
    "leading-newline": [u("Hello there"), a("\nI am fine"), u("how are you"), a("\n\nSure")],
}


def labelled(tok, messages, system=None):
    ex, _trunc, shared = tokenize.tokenize_conversation(tok, messages, 10**6, True, system)
    return ex, [lab != IGNORE for lab in ex.labels], shared


def transformers_mask(tok, messages) -> tuple[list[int], list[bool]]:
    out = tok.apply_chat_template(messages, tokenize=True, return_dict=True, return_assistant_tokens_mask=True)
    return out["input_ids"], [bool(m) for m in out["assistant_masks"]]


def prepared(tok, messages):
    """The conversation as lorapod hands it to the template (the system prompt placed)."""
    return place_system(messages, plan_system(tok, "auto"))


@pytest.mark.parametrize("template", ["llama3_training", "qwen2_5_training", "gemma_training", "phi3_training"])
def test_labels_equal_transformers_assistant_mask_on_training_templates(template):
    tok = tok_for(template)
    for name, conv in CONVERSATIONS.items():
        msgs = prepared(tok, conv)
        ex, mask, _ = labelled(tok, msgs)
        ids, ref = transformers_mask(tok, msgs)
        assert ex.input_ids == ids, name
        assert mask == ref, (template, name)


@pytest.mark.parametrize("template", ["llama3", "gemma", "phi3"])
def test_per_turn_spans_on_plain_templates_equal_the_generation_markers(template):
    """Without markers (the templates models ship), per-turn rendering must label exactly what the
    marker-carrying training variant labels: Phi-3's eos suffix is the case that used to be refused."""
    plain, training = tok_for(template), tok_for(f"{template}_training")
    for name, conv in CONVERSATIONS.items():
        msgs = prepared(plain, conv)
        ex, mask, _ = labelled(plain, msgs)
        ids, ref = transformers_mask(training, msgs)
        assert ex.input_ids == ids, name  # both render the same text
        assert mask == ref, (template, name)


def test_qwen_plain_template_differs_from_training_variant_only_by_the_header_newline():
    """qwen2_5_training puts the newline after '<|im_start|>assistant' inside the generation block
    (a prompt token, not generated); lorapod's per-turn spans start after it. A reply that starts
    with a newline shares that token (Qwen's vocabulary merges '\\n\\n'): it is labelled, and counted."""
    plain, training = tok_for("qwen2_5"), tok_for("qwen2_5_training")
    for name, conv in CONVERSATIONS.items():
        ex, mask, shared = labelled(plain, conv)
        ids, ref = transformers_mask(training, conv)
        assert ex.input_ids == ids
        differ = [t for t, (x, y) in enumerate(zip(mask, ref, strict=True)) if x != y]
        header_newlines = [t for t in range(1, len(ids)) if plain.decode(ids[t]) == "\n"
                           and plain.decode(ids[max(0, t - 4):t]).endswith("assistant")]
        replies = [m["content"] for m in conv if m["role"] == "assistant"]
        assert differ == header_newlines and all(not ref[t] or not mask[t] for t in differ), name
        assert len(differ) == sum(not r.startswith("\n") for r in replies), name
        assert shared == sum(r.startswith("\n") for r in replies), name


@pytest.mark.parametrize("template", ["llama3_1", "qwen2_5", "gemma", "phi3"])
def test_labelled_text_is_exactly_the_replies_with_their_end_markers(template):
    tok = tok_for(template)
    end = {"llama3_1": "<|eot_id|>", "qwen2_5": "<|im_end|>\n", "gemma": "<end_of_turn>\n", "phi3": "<|end|>\n"}[template]
    trim = template in ("llama3_1", "gemma")  # these templates strip the content
    for name, conv in CONVERSATIONS.items():
        msgs = prepared(tok, conv)
        ex, mask, shared = labelled(tok, msgs)
        got = tok.decode([i for i, m in zip(ex.input_ids, mask, strict=True) if m])
        replies = [m["content"].strip() if trim else m["content"] for m in msgs if m["role"] == "assistant"]
        # a straddling token (a reply starting with a newline) brings the header's newline with it
        lead = ["\n" if shared and r.startswith("\n") else "" for r in replies]
        want = "".join(x + r + end for x, r in zip(lead, replies, strict=True)) + ("<|endoftext|>" * (template == "phi3"))
        assert got == want, (template, name)


def test_system_prompt_placement_is_probed_from_the_template():
    assert system_placement(tok_for("qwen2_5")) == "keeps"
    assert system_placement(tok_for("llama3_1")) == "keeps"
    assert system_placement(tok_for("phi3")) == "keeps"
    assert system_placement(tok_for("gemma")) == "rejects"
    assert system_placement(tokenizer("mistral", MISTRAL_V03_RULE)) == "last_user"


def test_gemma_system_prompt_is_folded_into_the_first_user_turn_or_refused_on_request():
    tok = tok_for("gemma")
    conv = CONVERSATIONS["system"]
    with pytest.raises(TemplateRejected, match="System role not supported"):
        assistant_spans(tok, conv)
    plan = plan_system(tok, "auto")
    assert plan.mode == "first_user" and "Gemma" in plan.explanation
    text, _ = assistant_spans(tok, place_system(conv, plan))
    assert "<start_of_turn>user\nYou are terse. Answer in French.\n\nHello there<end_of_turn>" in text
    with pytest.raises(TemplateRejected, match=r"data\.system_prompt"):
        labelled(tok, conv, plan_system(tok, "keep"))


def test_mistral_system_prompt_keeps_its_placement_in_front_of_the_last_user_turn():
    tok = tokenizer("mistral", MISTRAL_V03_RULE)
    conv = CONVERSATIONS["system"]
    assert SYSTEM["content"] not in tok.apply_chat_template(conv, tokenize=False)  # what used to train silently
    plan = plan_system(tok, "auto")
    assert plan.mode == "last_user" and "last reply" in plan.explanation
    ex, mask, _ = labelled(tok, conv, plan)
    text = tok.decode(ex.input_ids)
    assert "[INST] Hello there[/INST] I am fine</s>[INST] You are terse. Answer in French.\n\nthanks[/INST] Sure</s>" in text
    assert tok.decode([i for i, m in zip(ex.input_ids, mask, strict=True) if m]) == " I am fine</s> Sure</s>"
    first = plan_system(tok, "first_user")
    assert "[INST] You are terse. Answer in French.\n\nHello there[/INST]" in tok.decode(labelled(tok, conv, first)[0].input_ids)


@pytest.mark.parametrize("template", ["llama3_1", "qwen2_5", "gemma_training", "phi3"])
def test_truncation_and_packing_keep_labels_aligned(template):
    tok = tok_for(template)
    convs = [prepared(tok, c) for c in CONVERSATIONS.values()]
    full, _ = tokenize.tokenize_all(tok, convs, 10**6)
    cut = min(len(e) for e in full) + 3
    examples, stats = tokenize.tokenize_all(tok, convs, cut)
    assert stats.truncated == sum(len(e) > cut for e in full)
    for short, long in zip(examples, [e for e in full if e.labels[:cut].count(IGNORE) < cut], strict=False):
        assert short.input_ids == long.input_ids[:cut] and short.labels == long.labels[:cut]
    rows = llm_data.pack(examples, 2 * cut)
    assert sorted(i for r in rows for i in r.examples) == list(range(len(examples)))
    assert all(r.length <= 2 * cut for r in rows)
    batch = llm_data.collate(rows, examples, tok.pad_token_id)
    # every label survives packing, at the position of its example's token
    assert batch.n_labels == sum(e.n_labels for e in examples)
    for b, row in enumerate(rows):
        at = 0
        for idx in row.examples:
            n = len(examples[idx])
            assert batch.labels[b, at:at + n].tolist() == examples[idx].labels
            at += n


def test_a_conversation_the_template_refuses_names_its_line(tmp_path):
    """Gemma raises on a conversation that starts with the assistant: a per-line finding in data
    check (not a traceback), and the same line at train time."""
    from lorapod.data.chat import check_chat

    folder = tmp_path / "gemma"
    tok_for("gemma").save_pretrained(folder)
    lines = [{"messages": [u("Hello there"), a("Sure")]}, {"messages": [a("Hello"), u("how are you"), a("fine")]},
             {"messages": [SYSTEM, u("Hello there"), a("Sure")]}]
    p = tmp_path / "c.jsonl"
    p.write_text("".join(json.dumps(x) + "\n" for x in lines))
    report = check_chat(p, model=str(folder))
    by_code = {f.code: f for f in report.findings}
    assert by_code["chat-template-error"].line == 2
    assert "Conversation roles must alternate" in by_code["chat-template-error"].message
    assert by_code["chat-system-folded"].line == 3 and by_code["chat-system-folded"].severity == "info"
    assert report.summary["usable"] == 2
    keep = check_chat(p, model=str(folder), system_prompt="keep")
    assert [f.line for f in keep.findings if f.code == "chat-system-rejected"] == [3]
    tok = tok_for("gemma")
    convs = [x["messages"] for x in lines]
    with pytest.raises(DataError, match=r"c\.jsonl line 2: the model's chat template refuses"):
        tokenize.tokenize_all(tok, convs, 512, True, plan_system(tok, "auto"), ["c.jsonl line 1", "c.jsonl line 2",
                                                                               "c.jsonl line 3"])
    examples, stats = tokenize.tokenize_all(tok, convs, 512, True, plan_system(tok, "auto"), None, skip_bad=True)
    assert len(examples) == 2 and stats.rejected == 1


def test_data_check_warns_about_a_token_shared_by_prompt_and_reply(tmp_path):
    from lorapod.data.chat import check_chat

    folder = tmp_path / "qwen"
    tok_for("qwen2_5").save_pretrained(folder)
    p = tmp_path / "c.jsonl"
    p.write_text(json.dumps({"messages": [u("Hello there"), a("ok")]}) + "\n"
                 + json.dumps({"messages": CONVERSATIONS["leading-newline"]}) + "\n")
    report = check_chat(p, model=str(folder))
    shared = [f for f in report.findings if f.code == "chat-shared-boundary-token"]
    assert len(shared) == 1 and shared[0].line == 2 and shared[0].severity == "warning"

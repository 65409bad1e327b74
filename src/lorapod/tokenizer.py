"""The one tokenizer loader: ``lorapod data check --model``, the planner and the LLM engine all call it.

A model can be named four ways, and each resolves to a folder that ``AutoTokenizer`` reads:

- a local folder (``./models/llama``), read as is;
- a hub id (``meta-llama/Llama-3.1-8B-Instruct``): only the tokenizer files are fetched (never
  the weights), from the Hugging Face cache first; ``HF_TOKEN`` is honoured for gated models,
  ``HF_ENDPOINT`` for a mirror, and ``HF_HUB_OFFLINE=1`` (or ``LORAPOD_OFFLINE=1``) keeps it to
  the cache (all read when called, not when imported);
- a catalog alias (``llama-3.1-8b``): mapped to the catalog's hub id, then as above;
- a built-in ``lorapod:`` id (``lorapod:tiny-llama``, the demo's random model): ``lorapod.builtin``
  builds it once on disk.

Two loaders that disagree were the problem this replaces: ``data check`` refused the hub ids the
engine accepted, so the data could not be checked with the tokenizer it would train with.
"""

from __future__ import annotations

import os
from pathlib import Path

from lorapod import builtin
from lorapod.catalog.models import close_hub_ids, hub_id, is_builtin
from lorapod.errors import ModelLoadError, require
from lorapod.home import hub_unreachable, offline

#: Where a model folder is given instead, in each command that loads a tokenizer.
LOCAL_HINT = "point model.id at a local folder (--set model.id=PATH; `data check` takes --model PATH)"

# What AutoTokenizer may need, and nothing with weights in it (config.json tells it the model
# type when tokenizer_config.json lacks tokenizer_class).
TOKENIZER_FILES = [
    "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "added_tokens.json",
    "tokenizer.model", "*.tiktoken", "vocab.json", "vocab.txt", "merges.txt", "spiece.model",
    "chat_template.jinja", "chat_template.json", "config.json", "generation_config.json",
]


def resolve(model_id: str, revision: str | None = None) -> tuple[str, str]:
    """(local folder holding the tokenizer files, how it was found), fetching tokenizer files only."""
    if is_builtin(model_id):
        return builtin.resolve(model_id), "built-in"
    p = Path(model_id).expanduser()
    if p.is_dir():
        return str(p), "local folder"
    if p.exists() or model_id.startswith((".", "/", "~")):
        raise ModelLoadError(f"'{model_id}' is not a model folder", hint="point it at a folder holding tokenizer.json "
                             "and tokenizer_config.json, or give a hub id (org/name)")
    repo, how = model_id, "hub"
    if "/" not in model_id:
        alias = hub_id(model_id)
        if alias is None:
            raise ModelLoadError(f"'{model_id}' is neither a local folder, a hub id (org/name) nor a catalog alias",
                                 hint="give a folder, a hub id such as Qwen/Qwen2.5-0.5B-Instruct, or run "
                                 "`lorapod plan --help` for the catalog names")
        repo, how = alias, f"catalog alias of {alias}"
    return _fetch(repo, revision), how


def _fetch(repo: str, revision: str | None) -> str:
    hub = require("huggingface_hub", "llm", "Loading a tokenizer from the Hugging Face hub")
    from huggingface_hub import errors as hf_errors

    local_only = offline()
    unreachable = None if local_only else hub_unreachable()  # seconds, not ~25 s of retries per file
    try:
        return hub.snapshot_download(repo, revision=revision, allow_patterns=TOKENIZER_FILES,
                                     local_files_only=local_only or bool(unreachable),
                                     token=os.environ.get("HF_TOKEN") or None,
                                     endpoint=os.environ.get("HF_ENDPOINT") or None)
    except hf_errors.GatedRepoError as exc:
        raise ModelLoadError(f"{repo} is gated: the hub refused its tokenizer files without access",
                             hint="accept the licence on the model's hub page, then set HF_TOKEN "
                             "(or run `huggingface-cli login`)") from exc
    except hf_errors.RepositoryNotFoundError as exc:
        close = " or ".join(close_hub_ids(repo))
        raise ModelLoadError(f"no model {repo} on the hub (or it is private)",
                             hint=f"check the spelling{f' (did you mean {close}?)' if close else ''}; "
                                  "private models need HF_TOKEN") from exc
    except hf_errors.RevisionNotFoundError as exc:
        raise ModelLoadError(f"{repo} has no revision {revision!r}", hint="check model.revision") from exc
    except (hf_errors.LocalEntryNotFoundError, OSError, ValueError) as exc:
        close = close_hub_ids(repo)
        spelled = f"check the spelling (did you mean {' or '.join(close)}?); " if close else ""
        if local_only:
            raise ModelLoadError(
                f"offline (HF_HUB_OFFLINE/LORAPOD_OFFLINE is set) and the tokenizer of {repo} is not in the "
                "Hugging Face cache",
                hint=f"{spelled}on a machine with internet run `huggingface-cli download {repo} --include "
                f"'tokenizer*' '*.json'` and copy the cache here, or {LOCAL_HINT}",
            ) from exc
        if unreachable:
            raise ModelLoadError(
                f"the Hugging Face hub cannot be reached ({unreachable}) and the tokenizer of {repo} is not in "
                "its cache",
                hint=f"{spelled}{LOCAL_HINT}, or run where the hub can be reached",
            ) from exc
        raise ModelLoadError(
            f"cannot fetch the tokenizer of {repo} ({type(exc).__name__}): the hub did not answer and it is "
            "not in the Hugging Face cache",
            hint=f"{spelled}check the network, or {LOCAL_HINT}",
        ) from exc


def load_tokenizer(model_id: str, revision: str | None = None, trust_remote_code: bool = False):
    """A fast tokenizer with a pad token, from a folder, hub id, catalog alias or built-in name."""
    transformers = require("transformers", "llm", "Loading the model's tokenizer")
    folder, how = resolve(model_id, revision)
    try:
        tok = transformers.AutoTokenizer.from_pretrained(folder, trust_remote_code=trust_remote_code,
                                                         local_files_only=True)
    except Exception as exc:  # transformers raises OSError, ValueError, KeyError... by case
        raise ModelLoadError(
            f"cannot load a tokenizer for '{model_id}' ({how}: {folder}): {type(exc).__name__}: {exc}",
            hint="the folder needs tokenizer.json (or its model type's tokenizer files) and tokenizer_config.json",
        ) from exc
    if not getattr(tok, "is_fast", False):
        raise ModelLoadError(
            f"the tokenizer of '{model_id}' is a slow (Python) tokenizer; lorapod needs a fast one to map labels "
            "to assistant turns",
            hint="install `tokenizers` and make sure the model folder has tokenizer.json",
        )
    if tok.pad_token_id is None:
        tok.pad_token = tok.eos_token or tok.unk_token
    return tok

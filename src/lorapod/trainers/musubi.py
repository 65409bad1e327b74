"""kohya-ss/musubi-tuner: Wan2.1 LoRAs (text-to-video and image-to-video) the guide's way.

A dataset TOML (``image_dataset`` for a folder of images, ``video_dataset`` with
``target_frames`` of the form N*4+1 for clips), the two pre-cache steps
(``wan_cache_latents.py``, ``wan_cache_text_encoder_outputs.py``), then ``wan_train_network.py``
with the fp8 base, ``networks.lora_wan``, shift timestep sampling with ``--discrete_flow_shift``
and block swap when VRAM is short. Outputs use sd-scripts' naming (recorded in the contract).
The saved LoRA is already in the ``lora_unet_*`` layout ComfyUI loads; musubi's
``convert_lora.py --target other`` (diffusers naming) is not run, since it is not in the
recorded interface.
"""

from __future__ import annotations

from pathlib import Path

from lorapod.errors import LorapodError
from lorapod.trainers import tomlw
from lorapod.trainers.base import Layout, Trainer, precision, prompts_of, safe_name
from lorapod.trainers.job import Command, TrainerJob
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


class MusubiTuner(KohyaOutputs, Trainer):
    name = "musubi-tuner"
    title = "kohya musubi-tuner"
    families = ("wan21",)
    contract = "kohya_musubi_tuner.json"
    repo = "https://github.com/kohya-ss/musubi-tuner.git"
    commit = "30c658c4f4b0bf05038b3346eff9670259b10fc7"
    install = ("-e", ".")
    torch = "torch>=2.5"

    def resume(self, job: TrainerJob, checkpoint: Path) -> None:
        """musubi-tuner's ``--resume`` restores the state but starts its loop at step 0 and epoch 0
        (training/trainer_base.py: ``global_step = 0``, "TODO skip until initial step"), so it
        would train ``max_train_steps`` more: lorapod asks for the steps left, and counts on."""
        super().resume(job, checkpoint)
        argv = job.commands[-1].argv
        if "--max_train_steps" in argv:
            i = argv.index("--max_train_steps") + 1
            argv[i] = str(max(1, int(argv[i]) - job.step_offset))
            job.total_offset = job.step_offset

    def refuse(self, spec) -> list[str]:
        r = super().refuse(spec)
        if r:
            return r
        m, d, t = spec.method, spec.data, spec.train
        if m.type == "qlora":
            r.append("musubi-tuner has no 4-bit base: use method.type lora with model.dtype fp8")
        if m.target_modules != "all-linear":
            r.append("networks.lora_wan targets the DiT's attention and MLP layers: method.target_modules must be all-linear")
        if m.rslora or m.train_text_encoder:
            r.append("networks.lora_wan has no rslora and never trains the text encoder: "
                     "method.rslora and method.train_text_encoder must be false")
        if not (d.cache_latents and d.cache_text_encoder_outputs):
            r.append("musubi-tuner trains only from cached latents and text-encoder outputs: "
                     "data.cache_latents and data.cache_text_encoder_outputs must be true")
        if t.timestep_sampling == "logit_normal":
            r.append("use train.timestep_sampling shift (musubi's --timestep_sampling shift + --discrete_flow_shift) or uniform")
        if d.shuffle_captions or d.flip or d.caption_dropout:
            r.append("musubi-tuner's dataset has no caption shuffle, flip or caption dropout: "
                     "data.shuffle_captions, data.flip and data.caption_dropout must be off")
        if wan_task(spec) not in DIT_FILES:
            r.append(f"no Wan2.1 weights known for {spec.model.id}")
        if isinstance(spec.samples.prompts, str):
            r.append("give samples.prompts as a list (musubi's prompt file is written from it)")
        if d.fps is not None and d.fps != TARGET_FPS_WAN:
            r.append(f"musubi-tuner resamples Wan2.1 clips to {TARGET_FPS_WAN:g} fps only (VideoDataset.TARGET_FPS_WAN): "
                     f"data.fps {TARGET_FPS_WAN:g}, or null to use every frame")
        for p in spec.data_paths():
            clips, stills = media(p)
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
        task = wan_task(spec)
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
        prepare = [hf_download(layout, DIT_REPO, DIT_FILES[task]), hf_download(layout, wan_repo(spec), VAE_FILE),
                   hf_download(layout, wan_repo(spec), T5_FILE)]
        dit, vae, t5 = f"{models}/{DIT_FILES[task]}", f"{models}/{VAE_FILE}", f"{models}/{T5_FILE}"
        py = layout.python
        cache_lat = [py, f"{layout.src}/{SRC}/wan_cache_latents.py", "--dataset_config", toml, "--vae", vae]
        if task.startswith("i2v"):
            prepare.append(hf_download(layout, "Wan-AI/Wan2.1-I2V-14B-720P", CLIP_FILE))
            cache_lat += ["--clip", f"{models}/{CLIP_FILE}"]
        prepare += [
            Command("cache latents", cache_lat, "prepare", cwd=layout.src, script="wan_cache_latents.py"),
            Command("cache text-encoder outputs", [py, f"{layout.src}/{SRC}/wan_cache_text_encoder_outputs.py",
                                                   "--dataset_config", toml, "--t5", t5, "--batch_size", "16"],
                    "prepare", cwd=layout.src, script="wan_cache_text_encoder_outputs.py"),
        ]
        prec = precision(spec)
        a = ["--task", task, "--dit", dit, "--dataset_config", toml, "--sdpa", "--mixed_precision",
             "no" if prec == "fp32" else prec]
        if spec.model.dtype == "fp8":
            a.append("--fp8_base")
        a += ["--network_module", "networks.lora_wan", "--network_dim", str(m.r), "--network_alpha", _num(m.alpha)]
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
            a += ["--sample_prompts", f"{layout.job}/prompts.txt", "--vae", vae, "--t5", t5]
            if spec.samples.every_steps:
                a += ["--sample_every_n_steps", str(spec.samples.every_steps)]
            if spec.samples.every_epochs:
                a += ["--sample_every_n_epochs", str(spec.samples.every_epochs)]
        accel = [py, "-m", "accelerate.commands.launch", "--num_cpu_threads_per_process", "1",
                 "--mixed_precision", "no" if prec == "fp32" else prec]
        train = Command("train", [*accel, f"{layout.src}/{SRC}/wan_train_network.py", *a], "train", cwd=layout.src,
                        script="wan_train_network.py")
        return TrainerJob(self.name, files, self.setup_commands(layout, py), [*prepare, train], layout.out, name, notes)


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

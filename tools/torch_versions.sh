#!/usr/bin/env bash
# CI stage: the engine's CPU-runnable tests under the floor torch and the newest torch, each a real
# install of that release (docs/performance.md, "torch versions"; the floor is
# lorapod.compute.bootstrap.ENGINE_MIN_TORCH and why it is that is written there).
#
# Each version gets its own virtualenv, .venv-torch-<version>/, holding torch and the libraries its
# wheel requires (on Linux, PyPI's torch is the CUDA build: its nvidia-* wheels come with it and
# import on a machine without a GPU). Everything else (transformers, peft, pytest ...) is the main
# .venv's, seen through a .pth file placed after the env's own site-packages, so the env's torch
# shadows .venv's. A venv whose torch is already the wanted one is reused; pip's cache keeps the
# downloads between runs on the same machine (a fresh machine downloads them: see the doc).
#
# Then bench/gpu_check.py --smoke under the libraries of the GPU machine this project is lent
# (transformers 5.17, huggingface_hub 1.33; /work/.library/device/KINDS.md), the same way: a venv with
# those two, the rest from .venv.
#
# Usage: tools/torch_versions.sh [VERSION ...]   (default: the floor and the newest, below)
set -euo pipefail
cd "$(dirname "$0")/.."
# The wheels are kept between runs on one machine, in a folder of their own (pip's HTTP cache is
# shared with everything else on the machine and may be purged): a fresh machine downloads them
# again (the sizes and times: docs/performance.md, "torch versions").
wheels="${LORAPOD_CI_WHEELS:-$HOME/.cache/lorapod-ci/wheels}"
mkdir -p "$wheels"

# the floor as this checkout says it (src first: .venv's lorapod may be another checkout's)
FLOOR="$(PYTHONPATH=src .venv/bin/python -c 'from lorapod.compute.bootstrap import ENGINE_MIN_TORCH as f; print(f)')"
NEWEST="${LORAPOD_NEWEST_TORCH:-2.14.1}"
versions=("$@")
if [ ${#versions[@]} -eq 0 ]; then versions=("${FLOOR}.0" "$NEWEST"); fi

# The engine's tests that run on a CPU and touch what differs between torch releases: device and
# precision choices (TF32 flags), attention paths (varlen_attn, SDPA, masks), packing, the OOM
# handler, checkpoints, fp8 layers, and one real LLM and one image training run.
TESTS=(
  tests/test_engine_cuda_choices.py
  tests/test_engine_llm_attention.py
  tests/test_engine_packed_attention.py
  tests/test_engine_llm_packing.py
  tests/test_engine_oom.py
  tests/test_engine_diffusion_fp8.py
  tests/test_engine_torch_versions.py
)

base_site="$(.venv/bin/python -c 'import site; print(site.getsitepackages()[0])')"
for v in "${versions[@]}"; do
  env=".venv-torch-$v"
  t0=$(date +%s)
  have="$("$env/bin/python" -c 'import importlib.metadata as m; print(m.version("torch"))' 2>/dev/null || true)"
  if [ "${have%%+*}" != "$v" ]; then
    rm -rf "$env"
    python3 -m venv "$env"
    "$env/bin/python" -m pip download -q --disable-pip-version-check --progress-bar off -d "$wheels" "torch==$v"
    "$env/bin/python" -m pip install -q --disable-pip-version-check --progress-bar off --no-index \
      --find-links "$wheels" "torch==$v"
  fi
  env_site="$("$env/bin/python" -c 'import site; print(site.getsitepackages()[0])')"
  echo "$base_site" > "$env_site/zz_lorapod_base.pth"
  t1=$(date +%s)
  echo "torch $v: environment ready in $((t1 - t0)) s ($(du -sh "$env" | cut -f1) on disk)"
  LORAPOD_EXPECT_TORCH="$v" "$env/bin/python" -m pytest -q -p no:cacheprovider -n 2 "${TESTS[@]}"
  echo "torch $v: tests in $(( $(date +%s) - t1 )) s"
done

# The lent GPU's transformers and huggingface_hub (without their dependencies: the rest is .venv's).
hf=".venv-hf-5.17"
t0=$(date +%s)
if [ "$("$hf/bin/python" -c 'import transformers as t; print(t.__version__)' 2>/dev/null || true)" != "5.17.0" ]; then
  rm -rf "$hf"
  python3 -m venv "$hf"
  "$hf/bin/python" -m pip install -q --disable-pip-version-check --no-deps transformers==5.17.0 huggingface_hub==1.33.0
fi
echo "$base_site" > "$("$hf/bin/python" -c 'import site; print(site.getsitepackages()[0])')/zz_lorapod_base.pth"
"$hf/bin/python" -m pytest -q -p no:cacheprovider tests/test_bench_gpu_check.py
echo "transformers 5.17: gpu_check --smoke in $(( $(date +%s) - t0 )) s"

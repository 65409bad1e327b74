"""Build ``.whl/``: the wheels bench/gpu_check.py needs on the GPU machine this project is lent, which
has no network and lacks them (its image: torch 2.11 + CUDA 13, transformers 5.17, huggingface_hub
1.33, accelerate 1.15, peft; no pydantic, diffusers, trl or bitsandbytes; /work/.library/device/KINDS.md).

    python tools/gpu_wheels.py            # downloads into .whl/ (git-ignored), checks the 64 MiB carry

The wheels are for CPython 3.12 on manylinux x86_64 (the lent image's Python), pinned at the versions
lorapod's CI runs. transformers is not carried: 5.25 needs huggingface_hub >= 2.4 and checks it at
import; the image's 5.17 runs the engine (CI runs gpu_check --smoke under 5.17, tools/torch_versions.sh).
bitsandbytes' wheel holds one library per CUDA (43 MB): only the CUDA 13 ones (cuda130, cuda132) and
the CPU one are kept, and its RECORD is rewritten to match, so pip installs it as it is. The folder
plus the repository's tracked files must stay under the 64 MiB a call carries; the total is printed
and checked. docs/performance.md has the call that installs them on the machine.
"""

from __future__ import annotations

import csv
import io
import subprocess
import sys
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DEST = ROOT / ".whl"
CARRY_LIMIT = 64 * 2**20

WHEELS = (
    "pydantic==2.14.4", "pydantic_core==2.50.5", "annotated_types==0.8.0", "typing_inspection==0.4.5",
    "typing_extensions==4.16.0", "diffusers==0.42.1", "importlib_metadata==10.2.0", "peft==0.21.2",
    "bitsandbytes==0.50.2", "trl==1.16.0", "datasets==5.2.0", "dill==0.4.1", "multiprocess==0.70.19",
)
PLATFORMS = ("manylinux_2_28_x86_64", "manylinux_2_24_x86_64", "manylinux_2_17_x86_64", "manylinux2014_x86_64")
#: bitsandbytes libraries kept: torch 2.11's CUDA 13 and the CPU fallback it loads when no GPU is seen
BNB_KEEP = ("libbitsandbytes_cuda130.so", "libbitsandbytes_cuda132.so", "libbitsandbytes_cpu.so")


def download() -> None:
    DEST.mkdir(exist_ok=True)
    plat = [x for p in PLATFORMS for x in ("--platform", p)]
    cmd = [sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary=:all:", "--python-version",
           "3.12", "--implementation", "cp", *plat, "-d", str(DEST), *WHEELS]
    subprocess.run(cmd, check=True)


def slim_bitsandbytes() -> None:
    """Keep only :data:`BNB_KEEP` of the CUDA libraries; RECORD lists exactly what remains."""
    for wheel in DEST.glob("bitsandbytes-*.whl"):
        with zipfile.ZipFile(wheel) as z:
            names = z.namelist()
            drop = {n for n in names if n.startswith("bitsandbytes/libbitsandbytes_") and Path(n).name not in BNB_KEEP}
            if not drop:
                continue
            files = {n: z.read(n) for n in names if n not in drop}
        record = next(n for n in files if n.endswith(".dist-info/RECORD"))
        rows = [r for r in csv.reader(io.StringIO(files[record].decode())) if r and r[0] not in drop]
        out = io.StringIO()
        csv.writer(out, lineterminator="\n").writerows(rows)
        files[record] = out.getvalue().encode()
        tmp = wheel.with_suffix(".tmp")
        with zipfile.ZipFile(tmp, "w", zipfile.ZIP_DEFLATED) as z:
            for n, data in files.items():
                z.writestr(n, data)
        tmp.replace(wheel)


def carried_bytes() -> int:
    tracked = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True).stdout
    total = sum((ROOT / f).stat().st_size for f in tracked.decode().split("\0") if f and (ROOT / f).is_file())
    return total + sum(p.stat().st_size for p in DEST.glob("*.whl"))


def main() -> int:
    download()
    slim_bitsandbytes()
    wheels = sorted(DEST.glob("*.whl"))
    size = carried_bytes()
    print(f"{len(wheels)} wheels in {DEST} ({sum(p.stat().st_size for p in wheels) / 2**20:.1f} MiB); "
          f"with the tracked tree {size / 2**20:.1f} MiB of the {CARRY_LIMIT / 2**20:.0f} MiB a call carries")
    if size > CARRY_LIMIT:
        print("too large to carry", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())

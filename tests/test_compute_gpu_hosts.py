"""A job on a GPU instance never trains on its CPU (review N4). The instance's driver is read before
anything is installed; the image's torch is kept only when it computes on that GPU; a torch that is
installed is the controller's version built for the driver's CUDA, from torch's index; and a job
whose torch still cannot use the GPU is not started: one line says why and the instance is destroyed.

The loopback hosts (tests/host_profiles.py) carry NVIDIA's ``nvidia-smi`` as a 12.4, 12.8 or 13.0
driver prints it; their torch is this machine's CPU build, which really cannot use a GPU, as PyPI's
CUDA 13 torch cannot on a 12.x driver."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
import torch

from lorapod.compute.bootstrap import Lock, env_request, torch_build_for
from lorapod.compute.hostfacts import cuda_of_driver, parse_gpus
from lorapod.compute.remote import NoGpuForTorch, check_gpu_torch, with_device
from lorapod.engine.device import pick_device
from lorapod.errors import HardwareError
from lorapod.store.ledger import Ledger

from .host_profiles import DRIVERS
from .test_compute_host_profiles import demo_run, events, profile_host  # noqa: F401  (the fixture, by name)

#: What ``nvidia-smi`` prints on an RTX 4090 host with the 570 driver (banner's first box and the
#: CSV query), as the start probe's markers carry it.
SMI_570 = (b"LPGPU NVIDIA GeForce RTX 4090, 570.133.20, 24564 MiB\n"
           b"LPCUDA CUDA Version: 12.8\n")


def test_the_driver_and_its_cuda_are_read_from_nvidia_smi():
    gpus = parse_gpus(b"login banner\n" + SMI_570)
    assert gpus.names == ("NVIDIA GeForce RTX 4090",) and gpus.driver == "570.133.20" and gpus.cuda == "12.8"
    assert gpus.describe() == "1 x NVIDIA GeForce RTX 4090, NVIDIA driver 570.133.20 (runs CUDA up to 12.8)"
    # no banner (an old nvidia-smi): NVIDIA's driver table gives the CUDA
    assert parse_gpus(b"LPGPU NVIDIA H100 80GB HBM3, 580.65.06, 81559 MiB\n").cuda == "13.0"
    assert (cuda_of_driver("550.144.03"), cuda_of_driver("535.183.01"), cuda_of_driver("470.1")) == ("12.4", "12.2",
                                                                                                     None)
    assert parse_gpus(b"").names == () and parse_gpus(b"LPGPU x; rm -rf /, nonsense\n").names == ()


@pytest.mark.parametrize("torch_version,driver,build", [
    ("2.13.0", "13.0", "cu130"), ("2.13.0", "12.8", "cu128"), ("2.13.0", "12.9", "cu128"),
    ("2.13.0", "12.4", "cu126"),  # CUDA 12 minor version compatibility (>= 525 drivers); the probe confirms
    ("2.8.0", "12.9", "cu129"), ("2.7.0", "12.8", "cu128"), ("2.7.0", "12.4", "cu118"), ("2.6.0", "12.4", "cu124"),
    ("2.13.0", "11.8", None),  # no 11.x build since 2.8: refused before anything is installed
])
def test_the_torch_build_for_a_driver(torch_version, driver, build):
    assert torch_build_for(torch_version, driver) == build


def test_the_environment_request_asks_for_the_drivers_build_from_torchs_index(monkeypatch):
    lock = Lock("llm", ("transformers==5.25.0",), "2.7", "torch==2.13.0")
    monkeypatch.delenv("LORAPOD_TORCH_INDEX", raising=False)
    cpu = env_request(lock, "/py", "/w")
    assert cpu["torch_pin"] == "torch==2.13.0" and "torch_index" not in cpu and cpu["digest"] == lock.digest
    gpu = env_request(lock, "/py", "/w", "12.8")
    assert gpu["torch_pin"] == "torch==2.13.0+cu128"
    assert gpu["torch_index"] == "https://download.pytorch.org/whl/cu128" and gpu["cuda_driver"] == "12.8"
    assert gpu["digest"] == f"{lock.digest}-cu128"  # a volume shared by hosts with other drivers keeps both
    monkeypatch.setenv("LORAPOD_TORCH_INDEX", "https://mirror.example/whl/")
    assert env_request(lock, "/py", "/w", "12.4")["torch_index"] == "https://mirror.example/whl/cu126"


def test_the_start_probe_refuses_a_torch_that_cannot_compute_on_the_gpu():
    gpus = parse_gpus(SMI_570)
    said = json.dumps({"ok": False, "torch": "2.13.0", "cuda": "13.0", "why": "torch.cuda.is_available() is False"})
    with pytest.raises(NoGpuForTorch) as err:
        check_gpu_torch(gpus, f"LPCUDAOK {said}\n".encode(), "/venv/bin/python")
    assert err.value.message.startswith("the job's torch 2.13.0 (built for CUDA 13.0) cannot use the instance's GPU "
                                        "(1 x NVIDIA GeForce RTX 4090, NVIDIA driver 570.133.20")
    assert "the instance is destroyed" in err.value.message and "\n" not in err.value.message
    with pytest.raises(NoGpuForTorch, match="the probe printed nothing"):
        check_gpu_torch(gpus, b"", "/py")
    check_gpu_torch(gpus, b'LPCUDAOK {"ok": true, "torch": "2.13.0+cu128"}\n', "/py")


def test_remote_jobs_run_with_an_explicit_device():
    assert with_device(["/py", "-m", "lorapod", "train", "spec.yaml", "--run-dir", "run"], "cuda") == \
        ["/py", "-m", "lorapod", "train", "spec.yaml", "--run-dir", "run", "--device", "cuda"]
    torchrun = ["/py", "-m", "torch.distributed.run", "--nproc-per-node", "2", "-m", "lorapod", "train", "s.yaml"]
    assert with_device(torchrun, "cuda")[-2:] == ["--device", "cuda"]
    assert with_device(["/py", "my_trainer.py", "s.yaml"], "cuda") == ["/py", "my_trainer.py", "s.yaml"]


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a torch that cannot use a GPU")
def test_the_engine_never_falls_back_to_the_cpu_when_told_cuda():
    with pytest.raises(HardwareError, match=r"--device cuda: torch .* cannot use a GPU here"):
        pick_device("cuda")


# ----------------------------------------------------------------------------- loopback GPU hosts


class TorchIndex(BaseHTTPRequestHandler):
    """A package index that has nothing (404), recording what was asked of it."""

    asked: list[str] = []

    def do_GET(self) -> None:
        type(self).asked.append(self.path)
        self.send_response(404)
        self.end_headers()

    def log_message(self, *a) -> None:
        pass


@pytest.fixture
def torch_index(monkeypatch):
    TorchIndex.asked = []
    server = ThreadingHTTPServer(("127.0.0.1", 0), TorchIndex)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{server.server_address[1]}"
    monkeypatch.setenv("LORAPOD_TORCH_INDEX", url + "/whl")
    yield url
    server.shutdown()


def _destroyed(proc, sshd) -> str:
    assert proc.returncode == 1, proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr
    (job,) = Ledger().jobs()
    assert job.state == "failed"
    assert Ledger().instances(live_only=True) == []
    assert [p.name for p in sshd.work_root.iterdir() if not p.name.startswith(".")] == []
    return " ".join(proc.stderr.split())


@pytest.mark.slow
@pytest.mark.parametrize("profile,driver", [("gpu-cuda-12.4-driver", "12.4"), ("gpu-cuda-13.0-driver", "13.0")])
def test_a_gpu_host_whose_torch_cannot_see_the_gpu_is_destroyed_before_the_job_starts(profile_host, tmp_path,  # noqa: F811
                                                                                     profile, driver):
    """--deps none: the image's interpreter as it is, so nothing is installed and the start probe decides."""
    sshd, _host = profile_host(profile)
    proc = demo_run(sshd, tmp_path / "runs", "--deps", "none")
    said = _destroyed(proc, sshd)
    drv = DRIVERS[driver]
    assert (f"cannot use the instance's GPU (1 x {drv.gpu}, NVIDIA driver {drv.version} (runs CUDA up to "
            f"{driver})): torch.cuda.is_available() is False; the job would train on its CPU") in said, said
    log = events({"run_dir": Ledger().jobs()[0].run_dir})
    assert f"NVIDIA driver {drv.version}" in log and "job started" not in log


@pytest.mark.slow
def test_an_image_torch_that_cannot_use_the_gpu_is_replaced_by_the_drivers_build(profile_host, tmp_path,  # noqa: F811
                                                                                torch_index, monkeypatch):
    """The 12.8 host: envsetup runs the GPU probe under the image's torch (False), then installs
    torch==<this machine's version>+cu128 from torch's index for that build (here a loopback index
    with nothing on it: the run fails naming it, and the instance is destroyed)."""
    monkeypatch.setenv("PIP_CONFIG_FILE", "/dev/null")
    sshd, _host = profile_host("gpu-cuda-12.8-driver")
    proc = demo_run(sshd, tmp_path / "runs")
    said = _destroyed(proc, sshd)
    version = torch.__version__.split("+")[0]
    assert f"could not install torch=={version}+cu128 from {torch_index}/whl/cu128" in said, said
    assert "/whl/cu128/torch/" in TorchIndex.asked, TorchIndex.asked
    env_log = (tmp_path / "runs").rglob("env.log")
    text = "".join(p.read_text() for p in env_log)
    assert "cannot use this GPU (torch.cuda.is_available() is False)" in text, text[-2000:]


@pytest.mark.slow
def test_an_image_without_torch_gets_the_drivers_build(profile_host, tmp_path, torch_index, monkeypatch):  # noqa: F811
    monkeypatch.setenv("PIP_CONFIG_FILE", "/dev/null")
    sshd, host = profile_host("gpu-image-without-torch")
    proc = demo_run(sshd, tmp_path / "runs", "--python", host.image_python)
    said = _destroyed(proc, sshd)
    assert f"could not install torch=={torch.__version__.split('+')[0]}+cu128 from {torch_index}/whl/cu128" in said
    assert "/whl/cu128/torch/" in TorchIndex.asked

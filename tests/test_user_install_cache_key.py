"""The Horovod wheel cache of install/user-env.sh is keyed by Python and by the CUDA and NCCL build
(issue 47, item 8): a cp310 wheel found for a 3.11 install failed ("not a supported wheel") and left
a venv without Horovod. `--print-cache-key` runs only the script's detection and key: here under
two interpreters (stand-ins that answer the version question) and two stand-in CUDA toolkits
(an `nvcc` that prints its release, an NCCL home with nccl.h and libnccl.so). Nothing is installed."""
import subprocess
from pathlib import Path

import pytest

pytestmark = pytest.mark.fast

SCRIPT = Path(__file__).resolve().parents[1] / "install" / "user-env.sh"


def _exe(path, text):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("#!/bin/sh\n" + text)
    path.chmod(0o755)
    return str(path)


def _cuda(root, release, nccl):
    """A CUDA home whose nvcc reports `release` and an NCCL home of version `nccl` (a.b.c)."""
    _exe(root / "cuda" / "bin" / "nvcc", f'echo "Cuda compilation tools, release {release}, V{release}.140"\n')
    major, minor, patch = nccl.split(".")
    (root / "nccl" / "include").mkdir(parents=True)
    (root / "nccl" / "include" / "nccl.h").write_text(
        f"#define NCCL_MAJOR {major}\n#define NCCL_MINOR {minor}\n#define NCCL_PATCH {patch}\n")
    (root / "nccl" / "lib").mkdir()
    (root / "nccl" / "lib" / "libnccl.so").write_text("")
    return {"CUDA_HOME": str(root / "cuda"), "NCCL_HOME": str(root / "nccl"), "RECSYS_HOROVOD_GPU": "1"}


def _key(tmp_path, version, env=None):
    python = _exe(tmp_path / f"py{version}" / "python3", f'echo {version}\n')
    base = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "RECSYS_WHEEL_CACHE": "/cache", "RECSYS_HOROVOD_GPU": "0"}
    res = subprocess.run(["bash", str(SCRIPT), "--python", python, "--print-cache-key"], env={**base, **(env or {})},
                         capture_output=True, text=True, timeout=60)
    assert res.returncode == 0, res.stderr
    return res.stdout.strip()


def test_the_wheel_cache_key_names_python_cuda_and_nccl(tmp_path):
    cp310, cp311 = _key(tmp_path, "3.10"), _key(tmp_path, "3.11")
    assert cp310.startswith("/cache/tf2.15.1-cp310") and cp311.startswith("/cache/tf2.15.1-cp311")
    cuda122 = _key(tmp_path, "3.11", _cuda(tmp_path / "a", "12.2", "2.18.5"))
    cuda124 = _key(tmp_path, "3.11", _cuda(tmp_path / "b", "12.4", "2.21.5"))
    assert cuda122.startswith("/cache/tf2.15.1-cp311-nccl-cuda12.2-nccl2.18.5-")
    assert cuda124.startswith("/cache/tf2.15.1-cp311-nccl-cuda12.4-nccl2.21.5-")
    assert len({cp310, cp311, cuda122, cuda124}) == 4

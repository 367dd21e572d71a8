"""Where a golden record came from: device, driver, toolchain, portattn commit, date."""

from __future__ import annotations

import datetime
import shutil
import subprocess
from pathlib import Path
from typing import Any

import torch

REPO_ROOT = Path(__file__).resolve().parents[3]  # portattn/tools/golden/ -> the checkout


def toolchain_key() -> str:
    """The key golden output hashes are stored under: the Triton version that made them."""
    import triton

    return f"triton-{triton.__version__}"


def _run(cmd: list[str], cwd: Path | None = None) -> str | None:
    if shutil.which(cmd[0]) is None:
        return None
    try:
        done = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.SubprocessError):
        return None
    return done.stdout.strip() if done.returncode == 0 else None


def git_commit() -> str | None:
    """``git rev-parse HEAD`` of the checkout portattn runs from (``+dirty`` with local
    changes), or None outside a git checkout."""
    commit = _run(["git", "rev-parse", "HEAD"], REPO_ROOT)
    if not commit:
        return None
    status = _run(["git", "status", "--porcelain", "--untracked-files=no"], REPO_ROOT)
    return commit + ("+dirty" if status else "")


def device_name(device: torch.device) -> str:
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    return f"{device.type} (Triton interpreter)"


def drivers(device: torch.device) -> list[str]:
    """CUDA runtime and NVIDIA driver, or the ROCm version (what is known here)."""
    if device.type != "cuda":
        return []
    found = []
    if torch.version.hip is not None:
        found.append(f"rocm {torch.version.hip}")
        return found
    if torch.version.cuda:
        found.append(f"cuda {torch.version.cuda}")
    smi = _run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"])
    if smi:
        found.append(f"nvidia driver {smi.splitlines()[0].strip()}")
    return found


def today() -> str:
    return datetime.datetime.now(datetime.timezone.utc).date().isoformat()


def provenance(device: torch.device) -> dict[str, Any]:
    """The provenance block of a refresh on ``device``."""
    import portattn

    record: dict[str, Any] = {
        "devices": [device_name(device)],
        "drivers": drivers(device),
        "torch": [torch.__version__],
        "portattn": portattn.__version__,
        "date": today(),
    }
    commit = git_commit()
    if commit:
        record["commit"] = commit
    return record

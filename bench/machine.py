"""The machine a benchmark ran on, recorded next to every figure it reports."""

from __future__ import annotations

import os
import platform
from pathlib import Path


def cpu_model() -> str:
    """CPU model name from /proc/cpuinfo, else the platform's processor string."""
    try:
        lines = Path("/proc/cpuinfo").read_text().splitlines()
    except OSError:
        lines = []
    return next((line.split(":", 1)[1].strip() for line in lines if line.startswith("model name")), platform.processor() or "unknown")


def machine_info() -> dict[str, object]:
    """Cores, CPU model, Python and torch versions, and the load average when the run started."""
    info: dict[str, object] = {"cores": os.cpu_count(), "cpu": cpu_model(), "python": platform.python_version()}
    try:
        import torch

        info.update(torch=torch.__version__, torch_threads=torch.get_num_threads())
    except ImportError:
        pass
    if hasattr(os, "getloadavg"):
        info["load_average_1m"] = round(os.getloadavg()[0], 2)
    return info

"""Resident-memory readings for the CPU benchmarks (Linux ``/proc``; ``ru_maxrss`` elsewhere)."""

from __future__ import annotations

import ctypes
import gc
import resource
from pathlib import Path

import torch


def proc_status_mb(field: str) -> float:
    """``VmRSS`` (current) or ``VmHWM`` (high-water mark) of this process, in MB."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) / 1024
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def reset_peak_rss() -> float:
    """Release freed heap to the OS, reset the RSS high-water mark, return current RSS (MB)."""
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
        Path("/proc/self/clear_refs").write_text("5")
    except OSError:
        pass
    return proc_status_mb("VmRSS")


def start_peak(device: str) -> float:
    """Collect garbage and reset the peak counter of ``device``; return the baseline (MB):
    ``memory_allocated`` on CUDA, resident set size on CPU."""
    gc.collect()
    if device.startswith("cuda"):
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        return torch.cuda.memory_allocated() / 2**20
    return reset_peak_rss()


def peak_mb(device: str) -> float:
    """The peak since :func:`start_peak` (MB, same measure as its baseline)."""
    if device.startswith("cuda"):
        torch.cuda.synchronize()
        return torch.cuda.max_memory_allocated() / 2**20
    return proc_status_mb("VmHWM")

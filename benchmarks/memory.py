"""Resident-memory readings for the CPU benchmarks (Linux ``/proc``; ``ru_maxrss`` elsewhere)."""

from __future__ import annotations

import ctypes
import resource
from pathlib import Path


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

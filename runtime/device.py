"""Is a CUDA GPU usable here? Asked once per process; the answer says why not."""

from __future__ import annotations

import functools


@functools.cache
def cuda_status() -> tuple[bool, str]:
    """``(usable, reason)``. Usable means cupy imports and sees at least one device."""
    try:
        import cupy
    except ImportError as exc:
        return False, f"cupy is not installed ({exc}); install vbatch[cuda12] or vbatch[cuda13]"
    try:
        count = cupy.cuda.runtime.getDeviceCount()
    except cupy.cuda.runtime.CUDARuntimeError as exc:
        return False, f"the CUDA runtime found no usable device ({exc})"
    if count < 1:
        return False, "the CUDA runtime reports no device"
    props = cupy.cuda.runtime.getDeviceProperties(cupy.cuda.Device().id)
    name = props["name"].decode() if isinstance(props["name"], bytes) else props["name"]
    return True, f"{name} (sm_{props['major']}{props['minor']})"


def resolve_device(device: str) -> str:
    """``"auto"`` -> ``"cuda"`` when a GPU is usable, else ``"cpu"``; checks an explicit choice."""
    if device not in ("auto", "cpu", "cuda"):
        raise ValueError(f"device must be 'auto', 'cpu' or 'cuda', got {device!r}")
    if device == "cpu":
        return "cpu"
    usable, why = cuda_status()
    if device == "auto":
        return "cuda" if usable else "cpu"
    if not usable:
        raise RuntimeError(f"device='cuda' was asked for, but {why}")
    return "cuda"

"""Measured defaults: ``python -m vbatch tune`` times the planner's choices on this machine and
keeps the fastest, which every :class:`~vbatch.Runtime` of the same machine, backend and
kernels then takes as its defaults.

What is tuned is each kernel family's ``TUNE`` on the backend (``kernels/<family>_<backend>.py``):
knobs, each an option name or a tuple of names set together, with their candidate values, and
``TUNE_WORKLOADS``, the batches they are timed on, every candidate's calls interleaved with the
others'. Knobs go in order, each with the ones before it at their chosen values (coordinate
descent). A candidate's score is the geometric mean over the workloads of its median time over
that of the value in force, which stays unless a candidate beats it by more than ``MARGIN``.

Every workload is timed in both layouts of a packed batch, column-major ("F") and row-major
("C"), each layout's options tuned on its own: a layout's defaults may differ
(``layout_defaults``), and a choice measured on one layout is not the other's.

The file (``Config.tune_file``; default ``~/.cache/vbatch/tune.json``) maps a key to the
chosen options, per family, dtype and layout, and the timings behind them. The key names the backend
and device (:meth:`Backend.tune_key`) and a hash of every kernel source (the ``.cu`` files,
their headers and the kernel modules): an entry made for other kernels is not used. A runtime
takes, per option, the config's value, else the file's, else the kernel module's default.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import time
from pathlib import Path

import numpy as np

# A candidate must beat the value in force by more than this to replace it: medians of one plan
# move between calls by more than rounding (docs/decisions.md#host-tune-margin).
MARGIN = 0.03
DEFAULT_FILE = Path("~/.cache/vbatch/tune.json")
FAMILIES = ("potrf",)  # the families whose modules declare TUNE (the batched Cholesky's)
ORDERS = ("F", "C")  # the layouts tuned, each on its own
# The entry's layout: options per family, dtype and order. An entry without it (options per
# family and dtype, measured on column-major batches alone) is not used.
FORMAT = 2

_HASH: dict = {}
_FILES: dict = {}


def source_hash() -> str:
    """A hash of every kernel source (``kernels/*.cu``, ``*.cuh``, ``*_cpu.py``, ``*_cuda.py``
    and the preamble's generator), computed once a process."""
    if "h" not in _HASH:
        here = Path(__file__).resolve().parent.parent / "kernels"
        h = hashlib.sha256()
        names = sorted(p for p in here.iterdir()
                       if p.suffix in (".cu", ".cuh") or p.name.endswith(("_cpu.py", "_cuda.py"))
                       or p.name == "cuda_build.py")
        for p in names:
            h.update(p.name.encode())
            h.update(p.read_bytes())
        _HASH["h"] = h.hexdigest()[:16]
    return _HASH["h"]


def file_path(tune_file: str | None) -> Path:
    """The tune file: ``tune_file`` (``Config.tune_file``), else the default."""
    return Path(tune_file or DEFAULT_FILE).expanduser()


def _read(path: Path) -> dict:
    """The file's entries (``{}`` when there is none or it cannot be read), memoized by the
    file's modification time: every Runtime reads it."""
    try:
        stamp = path.stat().st_mtime_ns
    except OSError:
        return {}
    hit = _FILES.get(path)
    if hit is not None and hit[0] == stamp:
        return hit[1]
    try:
        data = json.loads(path.read_text())
        data = data if isinstance(data, dict) else {}
    except (OSError, ValueError):
        data = {}
    _FILES[path] = (stamp, data)
    return data


def entry_key(backend) -> str:
    return f"{backend.tune_key()} kernels {source_hash()}"


def tuned_options(backend, config) -> dict:
    """``{(family, dtype name, order): {option: value}}`` from the file for this backend and
    these kernels, or ``{}`` (no file, no entry, an entry of a ``--quick`` run or of another
    format, or ``config.tuned`` off)."""
    if not config.tuned:
        return {}
    data = _read(file_path(config.tune_file))
    if not data:  # the common case: no file; no device query, no hashing
        return {}
    entry = data.get(entry_key(backend))
    if not isinstance(entry, dict) or entry.get("quick") or entry.get("format") != FORMAT:
        return {}
    out = {}
    for fam, per_dtype in entry.get("options", {}).items():
        for dt, per_order in per_dtype.items():
            for order, opts in per_order.items():
                out[(fam, dt, order)] = dict(opts)
    return out


# ----------------------------------------------------------------------------- measuring
def _batch(rt, dist: str, k: int, nmax: int, dtype, seed: int, order: str):
    """A packed batch of SPD matrices in ``order`` on the runtime's device (generated there on
    CUDA)."""
    from vbatch.core.batch import PackedBatch, tight_offsets
    from vbatch.ops.generate import sizes, spd_packed

    n = sizes(dist, k, nmax, np.random.default_rng(seed))
    if rt.device == "cuda":
        import cupy

        from vbatch.kernels.cuda import spd_fill

        ld = np.maximum(n, 1)
        off = tight_offsets(n, ld)
        data = cupy.empty(int((ld * n).sum()), dtype)
        return spd_fill(PackedBatch.from_buffer(data, n, off, ld, order), seed)
    return spd_packed(n, dtype, np.random.default_rng(seed), order)


def _race(runtimes: dict, batches: list, reps: int) -> dict:
    """``{candidate: [median ms of rt.cholesky(batch) per batch]}``, the candidates' calls
    interleaved (round after round, each candidate once a round), so that a drift of the
    machine's state falls on every candidate alike; after three warm-up calls each (plans, graph
    captures, pools)."""
    for rt in runtimes.values():
        for b in batches:
            for _ in range(3):
                rt.cholesky(b).result()
    ts = {c: [[] for _ in batches] for c in runtimes}
    for _ in range(reps):
        for c, rt in runtimes.items():
            for i, b in enumerate(batches):
                t = time.perf_counter()
                rt.cholesky(b).result()
                ts[c][i].append(time.perf_counter() - t)
    return {c: [float(np.median(x) * 1e3) for x in per] for c, per in ts.items()}


def tune(device: str = "auto", dtypes=("float64", "float32"), quick: bool = False,
         reps: int = 5, path: str | None = None, log=print) -> dict:
    """Measure every knob of every family in :data:`FAMILIES` on ``device``, write the chosen
    options into the file (``path``, else the default) and return its entry. ``quick``: tiny
    workloads, one timed call each (checks the machinery, not the machine: runtimes do not
    take such an entry)."""
    from vbatch.core.errors import InputError
    from vbatch.runtime.config import Config
    from vbatch.runtime.runtime import Runtime

    probe = Runtime(device, tuned=False)
    backend = probe.backend
    chosen: dict = {}
    timings: dict = {}
    for fam in FAMILIES:
        mod = backend._op(fam)
        # each knob as (names, candidates), a candidate a tuple of values, one per name
        knobs = [((names,) if isinstance(names, str) else tuple(names),
                  [c if isinstance(c, tuple) else (c,) for c in candidates])
                 for names, candidates in getattr(mod, "TUNE", ())]
        work = getattr(mod, "TUNE_WORKLOADS", ())
        if quick:
            work = (("uniform", 24, 40), ("skewed", 24, 80))
            reps = 1
        for dt, order in ((dt, order) for dt in dtypes for order in ORDERS):
            dtype = np.dtype(dt)
            opts = {name: value for name, value in probe.plan_options(dtype, fam, order).items()
                    if name in Config.PLANNER}
            batches = [(f"{d} k={k} Nmax={m}", _batch(probe, d, k, m, dtype, 1 + i, order))
                       for i, (d, k, m) in enumerate(work)]
            log(f"{backend.name} {fam} {dt} {order}: {', '.join(w for w, _ in batches)}")
            for names, candidates in knobs:
                now = tuple(opts[nm] for nm in names)
                cands = list(dict.fromkeys([now] + candidates))
                runtimes = {}
                for c in cands:
                    try:  # a candidate the backend refuses with these options is skipped
                        rt = Runtime(device, tuned=False, **{**opts, **dict(zip(names, c))})
                        rt.plan_options(dtype, fam)  # where the backend checks them
                        runtimes[c] = rt
                    except InputError as exc:
                        log(f"    {'/'.join(names)} = {c}: {exc}")
                cands = [c for c in cands if c in runtimes]
                ms = _race(runtimes, [b for _, b in batches], reps)
                score = {c: math.exp(np.mean(np.log(np.asarray(ms[c]) / np.asarray(ms[now]))))
                         for c in cands}
                best = min(cands, key=lambda c: score[c])
                if score[best] > 1.0 - MARGIN:
                    best = now
                opts.update(zip(names, best))
                label = "/".join(names)
                for c in cands:
                    mark = "*" if c == best else " "
                    log(f"  {mark} {label} = {'/'.join(map(str, c)):<12} "
                        + " ".join(f"{t:9.3f}" for t in ms[c]) + f"   x{score[c]:.3f}")
                timings.setdefault(fam, {}).setdefault(dt, {}).setdefault(order, {})[label] = {
                    "/".join(map(str, c)): ms[c] for c in cands}
            chosen.setdefault(fam, {}).setdefault(dt, {})[order] = {
                nm: opts[nm] for names, _ in knobs for nm in names}
    entry = {"format": FORMAT, "options": chosen, "timings": timings, "reps": reps,
             "quick": quick, "date": time.strftime("%Y-%m-%d %H:%M:%S")}
    out = file_path(path)
    data = dict(_read(out))
    data[entry_key(backend)] = entry
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(out.name + f".{os.getpid()}.tmp")
    tmp.write_text(json.dumps(data, indent=1, sort_keys=True))
    os.replace(tmp, out)  # readers never see half a file
    return entry


def describe(entry: dict) -> str:
    """The chosen options of an entry, one line per family, dtype and layout."""
    lines = []
    for fam, per in entry.get("options", {}).items():
        for dt, per_order in per.items():
            for order, opts in per_order.items():
                lines.append(f"{fam} {dt} {order}: "
                             + ", ".join(f"{k}={v}" for k, v in opts.items()))
    return "\n".join(lines)

"""Where one call's time goes: every launch of its plan on a timeline.

    python -m vbatch trace --op cholesky --nmax 512 --device cuda --out run
    # run.json: a Chrome/Perfetto trace (chrome://tracing, ui.perfetto.dev)
    # run.png: a Gantt chart of the same, one row per stream

:func:`trace` runs a submission twice on a runtime of the same options: once to warm up (kernels
compiled, plan and device tables built), then once traced, launch by launch. On CUDA that call
runs without the plan's CUDA graph (a graph's launches cannot be timed one by one), each launch
on its own stream between two events, so a launch's GPU time is its own kernel's; on the CPU each
launch is timed on the host, where it runs. Every launch of the plan is one event in the device's
row of the trace (``pid`` 1, ``tid`` the stream), named by its launch kind and carrying its group,
task kind, task count, rows, flops and kernel; on CUDA the host's issuing of each launch is a
second row (``pid`` 0). Times count from the call's first event (CUDA) or first launch (CPU).

Every launch also gets its **floor**: the least time its tasks could take on this device with
their operands in device memory (a launch whose operands sit in L2, as a small batch's or a
trsm's right after its update may, can beat it), ``max(elements moved x itemsize / bandwidth,
flops / peak)``, from each task kind's ``flops`` and
``traffic`` (:mod:`vbatch.core.kinds`) and the device's copy bandwidth and GEMM peak
(:func:`ceilings`, measured once per process unless given). A launch group issued as several
launches (a separated POTRF panel: update, then trsm) has one floor, for its tasks' whole work,
shared evenly by its launches (an event's ``gflop`` and ``mbyte`` are the whole group's, and
``first_of_group`` marks the one that counts them); the event's ``path`` names them all
(``update+trsm``).
:meth:`Trace.by_kind` sums time and floor per path: which kernels are how far from what their
work costs.
"""

from __future__ import annotations

import json
import threading
from dataclasses import dataclass
from typing import Any

import numpy as np

from vbatch.scheduler.plan import Plan

_LOCK = threading.Lock()  # one traced call at a time per process: the backend's hook is shared
_CEILINGS: dict = {}  # "cpu" or "cuda:<id>" -> ceilings(device), measured once per process


def ceilings(device: str) -> dict:
    """The device's copy bandwidth (``bw``: bytes read plus written per second, a 1 GiB copy on
    CUDA, 128 MiB on the CPU) and GEMM peak per dtype (``peak``: {"float64": flop/s,
    "float32": ...}, an 8192-order product on CUDA (cuBLAS), 2048 on the CPU (numpy's BLAS)),
    each the best of five, measured on first use and kept for the process (per GPU: the
    current one's)."""
    key = device
    if device == "cuda":
        import cupy as xp

        key = f"cuda:{xp.cuda.runtime.getDevice()}"
    hit = _CEILINGS.get(key)
    if hit is not None:
        return hit
    import time

    if device == "cuda":
        sync = xp.cuda.runtime.deviceSynchronize
        words, order = 1024**3 // 8, 8192
    else:
        xp, sync, words, order = np, (lambda: None), 128 * 1024**2 // 8, 2048

    def best(fn) -> float:
        fn()
        sync()
        ts = []
        for _ in range(5):
            t0 = time.perf_counter()
            fn()
            sync()
            ts.append(time.perf_counter() - t0)
        return min(ts)

    def copy_bw() -> float:  # its buffers freed on return
        a = xp.ones(words, dtype=np.float64)
        b = xp.empty_like(a)
        return 2 * a.nbytes / best(lambda: xp.copyto(b, a))

    out = {"bw": copy_bw(), "peak": {}}
    rng = xp.random.default_rng(0)
    for dt in ("float64", "float32"):
        x = rng.standard_normal((order, order)).astype(dt)
        out["peak"][dt] = 2.0 * order**3 / best(lambda x=x: x @ x)
    _CEILINGS[key] = out
    return out


@dataclass
class Trace:
    """One traced call: its plan, one row per launch (``events``: dicts with ``launch``,
    ``kind``, ``stream``, ``start_us``, ``dur_us``, ``host_start_us``, ``host_dur_us``,
    ``kernel``), the device, and the call's result."""

    plan: Plan
    events: list
    device: str
    result: Any
    ceil: dict | None = None  # the ceilings the floors were computed with

    def by_kind(self) -> list[dict]:
        """Per path (the launch kinds of a group, ``fused`` or ``update+trsm``), most time
        first: ``kind`` (the path), ``launches``, ``tasks`` (the groups' tasks, once),
        ``us`` (GPU time of its launches, each timed alone), ``floor_us`` and ``gflop`` (the
        groups' work, once)."""
        out: dict = {}
        for e in self.events:
            k = out.setdefault(e["path"], {"kind": e["path"], "launches": 0, "tasks": 0,
                                           "us": 0.0, "floor_us": 0.0, "gflop": 0.0})
            k["launches"] += 1
            k["us"] += e["dur_us"]
            k["floor_us"] += e["floor_us"]
            if e["first_of_group"]:
                k["tasks"] += e["count"]
                k["gflop"] += e["gflop"]
        return sorted(out.values(), key=lambda k: -k["us"])

    def chrome(self, meta: dict | None = None) -> dict:
        """The trace in the Chrome trace-event format (a JSON object)."""
        dev_name = "GPU" if self.device == "cuda" else "CPU backend"
        out = [{"name": "process_name", "ph": "M", "pid": 1, "args": {"name": dev_name}}]
        streams = sorted({e["stream"] for e in self.events})
        for s in streams:
            out.append({"name": "thread_name", "ph": "M", "pid": 1, "tid": s,
                        "args": {"name": f"stream {s}"}})
        if self.device == "cuda":
            out.append({"name": "process_name", "ph": "M", "pid": 0,
                        "args": {"name": "host (issuing launches)"}})
        for e in self.events:
            args = {k: e[k] for k in ("launch", "group", "task_kind", "count", "rows_min",
                                      "rows_max", "gflop", "mbyte", "floor_us", "path",
                                      "kernel", "family")}
            out.append({"name": e["kind"], "cat": e["family"], "ph": "X", "pid": 1,
                        "tid": e["stream"], "ts": e["start_us"], "dur": e["dur_us"],
                        "args": args})
            if self.device == "cuda":
                out.append({"name": f"issue {e['kind']}", "cat": "host", "ph": "X", "pid": 0,
                            "tid": 0, "ts": e["host_start_us"], "dur": e["host_dur_us"],
                            "args": {"launch": e["launch"]}})
        other = {"device": self.device, "launches": len(self.plan.launches),
                 "plan": self.plan.summary(), "ceilings": self.ceil,
                 "by_kind": self.by_kind()}
        other.update(meta or {})
        return {"traceEvents": out, "displayTimeUnit": "ms", "otherData": other}

    def write(self, prefix: str, meta: dict | None = None, png: bool = True) -> list[str]:
        """Write ``prefix.json`` (and ``prefix.png`` unless ``png=False``); the paths."""
        paths = [f"{prefix}.json"]
        with open(paths[0], "w") as f:
            json.dump(self.chrome(meta), f, indent=1)
        if png:
            paths.append(f"{prefix}.png")
            self.gantt(paths[1])
        return paths

    def gantt(self, path: str) -> None:
        """A Gantt chart: one row per stream, a bar per launch, coloured by launch kind."""
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        kinds = sorted({e["kind"] for e in self.events})
        colors = {k: plt.get_cmap("tab10")(i % 10) for i, k in enumerate(kinds)}
        streams = sorted({e["stream"] for e in self.events}) or [0]
        fig, ax = plt.subplots(figsize=(12, 1.2 + 0.6 * len(streams)))
        for e in self.events:
            ax.barh(streams.index(e["stream"]), max(e["dur_us"], 1e-3) / 1e3,
                    left=e["start_us"] / 1e3, color=colors[e["kind"]], edgecolor="white",
                    linewidth=0.3)
        ax.set_yticks(range(len(streams)), [f"stream {s}" for s in streams])
        ax.invert_yaxis()
        ax.set_xlabel("ms from the call's start")
        ax.set_title(f"{self.plan.summary()} ({self.device})", fontsize=9)
        handles = [plt.Rectangle((0, 0), 1, 1, color=colors[k]) for k in kinds]
        ax.legend(handles, kinds, loc="upper right", fontsize=8)
        fig.tight_layout()
        fig.savefig(path, dpi=110)
        plt.close(fig)


def trace(rt, op: str, ceil: dict | None = None, **fields: Any) -> Trace:
    """Run ``op`` (a registered operation's name, as :meth:`Runtime.submit` takes it; POTRF is
    ``"potrf"`` with ``batch=``) once to warm up and once traced, on a runtime with ``rt``'s
    options (CUDA graphs off). ``ceil``: the ceilings for the floors (as :func:`ceilings`
    returns; measured when None). Returns the :class:`Trace`."""
    from vbatch.runtime.runtime import Runtime

    traced = Runtime(rt.device, config=rt.config.model_copy(update={"cuda_graphs": False}))
    backend = traced.backend
    with _LOCK:
        traced.submit(op, **fields).result()  # compiles, plans, builds device tables
        records: list = []
        backend.tracer = records
        try:
            result = traced.submit(op, **fields).result()
        finally:
            backend.tracer = None
        plan = traced.plan_for(op, **fields)
    ceil = ceil if ceil is not None else ceilings(traced.device)
    events = _events(plan, records, traced.device, _dtype_of(fields), ceil)
    return Trace(plan, events, traced.device, result, ceil)


def _dtype_of(fields: dict) -> np.dtype:
    """The call's data type: its first floating operand's (a batch, an array or a list of
    arrays; integer arguments such as ``npiv`` are not data)."""
    for v in fields.values():
        if isinstance(v, (list, tuple)) and v:
            v = v[0]
        dt = getattr(v, "dtype", None)
        if dt is not None and np.issubdtype(np.dtype(dt), np.floating):
            return np.dtype(dt)
    return np.dtype(np.float64)


def _events(plan: Plan, records: list, device: str, dtype: np.dtype, ceil: dict) -> list:
    t = plan.tasks
    if not records:
        return []
    h_base = records[0].host[0]
    base = records[0].base
    gpu = device == "cuda" and base is not None
    if gpu:
        import cupy

        records[-1].events[1].synchronize()
    # float32 batches against the float32 peak; anything else against float64's
    peak_key = dtype.name if dtype.name in ceil["peak"] else "float64"
    siblings: dict = {}  # group -> its launches' kinds, in plan order
    for lc in plan.launches:
        siblings.setdefault(lc.group, []).append(lc.kind)
    seen: set = set()
    out = []
    for r in records:
        lc = r.launch
        sl = slice(lc.lo, lc.hi)
        kd = plan.kinds[int(t.kind[lc.lo])]
        shape = (t.args[sl], t.rows[sl], t.cols[sl], t.width[sl])
        flops = float(np.sum(kd.flops(*shape)))
        moved = float(np.sum(kd.traffic(*shape))) * dtype.itemsize if kd.traffic else 0.0
        share = len(siblings[lc.group])
        floor = max(moved / ceil["bw"], flops / ceil["peak"][peak_key]) * 1e6 / share
        first = lc.group not in seen
        seen.add(lc.group)
        h0, h1 = r.host
        if gpu:
            start = cupy.cuda.get_elapsed_time(base, r.events[0]) * 1e3
            dur = cupy.cuda.get_elapsed_time(r.events[0], r.events[1]) * 1e3
        else:
            start, dur = (h0 - h_base) * 1e6, (h1 - h0) * 1e6
        rows = t.rows[sl]
        out.append({
            "launch": int(lc.index), "group": int(lc.group), "kind": lc.kind,
            "task_kind": lc.task_kind, "family": lc.family, "count": int(lc.count),
            "stream": int(r.stream), "rows_min": int(rows.min()), "rows_max": int(rows.max()),
            "gflop": flops / 1e9, "mbyte": moved / 1e6, "floor_us": floor,
            "path": "+".join(siblings[lc.group]), "first_of_group": first, "kernel": r.kernel,
            "start_us": float(start), "dur_us": float(dur), "host_start_us": (h0 - h_base) * 1e6,
            "host_dur_us": (h1 - h0) * 1e6,
        })
    return out

"""A local Dask cluster of one worker per GPU (or CPU workers), and waiting for it."""

from __future__ import annotations

import os
import time
from typing import Any




def local_cluster(n_workers: int | None = None, device: str = "auto", **kw: Any):
    """A cluster on this machine: one worker process per GPU, each seeing only its own GPU
    (dask-cuda's ``LocalCUDACluster`` where it is installed, else one ``Nanny`` per GPU with
    ``CUDA_VISIBLE_DEVICES`` set), or ``n_workers`` single-threaded CPU processes (default 2)."""
    from vbatch import cuda_status

    gpus = 0
    if device in ("auto", "cuda") and cuda_status()[0]:
        import cupy

        gpus = cupy.cuda.runtime.getDeviceCount()
    if gpus:
        n = n_workers or gpus
        try:
            from dask_cuda import LocalCUDACluster

            return LocalCUDACluster(CUDA_VISIBLE_DEVICES=list(range(n)), **kw)
        except ImportError:
            pass
        from distributed import Nanny, Scheduler, SpecCluster

        visible = os.environ.get("CUDA_VISIBLE_DEVICES")
        ids = visible.split(",") if visible else [str(i) for i in range(gpus)]
        workers = {f"gpu{i}": {"cls": Nanny, "options": {
            "nthreads": 1, "env": {"CUDA_VISIBLE_DEVICES": ids[i % len(ids)]}}}
            for i in range(n)}
        return SpecCluster(workers=workers, scheduler={"cls": Scheduler, "options": {
            "dashboard_address": None}}, **kw)
    from distributed import LocalCluster

    return LocalCluster(n_workers=n_workers or 2, threads_per_worker=1, processes=True,
                        dashboard_address=None, **kw)


def workers_of(client) -> list:
    """The addresses of the workers connected to ``client``'s scheduler, asked of it now, in
    order. (``Client.scheduler_info()`` fetches them, then reads a record that the client's
    own periodic refresh may have replaced meanwhile by one without workers: a runtime made
    then found none, as one CI run of the tests did.)"""
    return sorted(client.sync(client.scheduler.identity)["workers"])


def wait_for_workers(client, n: int, timeout: float = 60.0) -> None:
    """Block until ``n`` workers are connected (a cluster starts its processes in the
    background)."""
    t0 = time.monotonic()
    while len(workers_of(client)) < n:
        if time.monotonic() - t0 > timeout:
            raise TimeoutError(f"{n} workers did not connect within {timeout} s")
        time.sleep(0.05)

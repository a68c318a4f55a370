"""vbatch.distributed: one batch over many GPUs (or many CPU processes) through Dask.

    >>> from dask.distributed import Client
    >>> import vbatch.distributed as vd
    >>> client = Client(vd.local_cluster())            # one worker per GPU (or 2 CPU workers)
    >>> drt = vd.Runtime(client)
    >>> chol = drt.cholesky(mats)                     # sharded by flops, a shard a worker
    >>> x = drt.potrs(chol, rhs, after=[chol]).result()  # factors never left the workers

:class:`Runtime` has the methods of :class:`vbatch.Runtime` (every op, ``submit``, ``after=``,
``wait``). A submission is validated here, whole, before any work (errors name the problem in
the caller's numbering). Its problems are split over the workers by their flops, largest first,
each to the least loaded worker (LPT), so that the workers finish together. Each worker runs its
shard as one submission of its own ``vbatch.Runtime`` (one per worker process; on a GPU worker,
the CUDA backend on the GPU that ``CUDA_VISIBLE_DEVICES`` gives it), through the runtime's keeper
on that worker (a Dask actor the client calls directly, not through the scheduler), which holds
the shard's result.

A :class:`Future`'s ``result()`` gathers the shards and gives the outputs back in the caller's
order and form (a list for a list, with the caller's kind of array). Its outputs can also stay on
the workers: a distributed future given as an operand of a later op (``potrs(chol, b)``), or
:meth:`Future.output`, is read where it lies, shard by shard, without moving the data.

Failures: a worker that dies mid-batch loses nothing. The client keeps each shard's record (its
operands and the shards it reads), so a shard whose worker dies runs again on another, and a
shard result lost with its worker is recomputed from that lineage when something still needs
it. A shard larger than its
device's memory (``chunk_bytes``) streams through that device in chunks.

The folder is ``cluster/`` and not ``distributed/`` because the repository root is on
``sys.path`` when the tests run from a checkout (``python -m pytest``), where a ``distributed/``
folder would hide Dask's own ``distributed`` package. Installed, it is ``vbatch.distributed``.
Dask is the ``distributed`` extra (``pip install "vbatch[distributed]"``), imported when a
:class:`Runtime` or a cluster is made, not with vbatch.
"""

from vbatch.distributed.future import DistributedBatch, Future
from vbatch.distributed.local import local_cluster, wait_for_workers
from vbatch.distributed.runtime import Runtime
from vbatch.distributed.sharding import problem_cost, shard_by_cost

__all__ = ["Runtime", "Future", "DistributedBatch", "local_cluster", "wait_for_workers",
           "shard_by_cost", "problem_cost"]

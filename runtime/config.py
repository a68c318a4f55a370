"""One validated configuration per :class:`~vbatch.Runtime`, from one channel.

Everything that changes how a runtime plans or runs is a field of :class:`Config`, checked when
the runtime is made. Each field's value comes from, in this order of precedence:

1. the arguments: ``Runtime(device, nb=16)``, then the fields a ``config=`` object sets itself;
2. the environment: ``VBATCH_<FIELD>`` (``VBATCH_NB=16``, ``VBATCH_POLICY=ssde``,
   ``VBATCH_TUNED=0``, ``VBATCH_KERNEL_OPTIONS='{"blas_nb": 32}'`` as JSON; ``none`` unsets
   an optional one), read when the runtime is made;
3. for the planner's options left unset, the tune file (``tune_file``, default
   ``~/.cache/vbatch/tune.json``: what ``python -m vbatch tune`` measured on this machine);
4. the backend's default for the operation, dtype and layout (``Runtime.plan_options``).

``Runtime.plan_options`` shows the result, read-only. The test suite clears the environment's
``VBATCH_*`` options and points ``VBATCH_TUNE_FILE`` at an empty place (tests/conftest.py).
"""

from __future__ import annotations

import json
import os
from typing import Any, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from vbatch.core.errors import InputError, validated


class Config(BaseModel):
    """Planner options, and how the CUDA backend runs a plan.

    * ``nb``: panel width of blocked factorizations.
    * ``policy``: ``"dsse"`` (different starts, same end) or ``"ssde"``.
    * ``fused_max_rows``: the crossover: panels of at most this many rows run fused.
    * ``block``, ``block_above``: a Cholesky problem that factors more than ``block_above``
      columns (and more than ``block``) takes them ``block`` at a time, each block column
      brought up to date by one GEMM first (``block`` 0: never; a multiple of ``nb``).
    * ``block_few``, ``block_few_above``: a batch in which at most ``block_few`` problems
      factor more than half of ``t = max(block, block_few_above)`` columns blocks those past
      t, whatever ``block_above`` (``block_few`` 0: never): their late panel steps would run
      nearly alone, too few blocks to fill the device. CUDA's defaults: two per
      multiprocessor, t = 224 in float64 and 384 in float32.
    * ``streams``: CUDA streams that independent chains of launches may use.
    * ``tree_max``: the multifrontal factor (``vbatch.sparse``): a front whose subtree's fronts
      all have at most this many rows (at most 128) is factored, Schur complement and
      extend-add included, by one task of a launch per size class, not by a chain of launches
      per tree level (0: never).
    * ``cuda_graphs``: run each plan as one CUDA graph, captured on its second call
      (``False``: launch by launch, for profiling single kernels).
    * ``fp64_update``: the float64 panel update on CUDA: ``"fma"`` or ``"mma"`` (FP64 tensor
      cores; measured no faster, docs/decisions.md#potrf-fp64-update-fma).
    * ``fp64_gemm``: the float64 GEMM tiles of the BLAS ops (GEMM, SYRK, the joins of TRSM
      and TRMM) on CUDA: ``"mma"`` (FP64 tensor cores) or ``"fma"``.
    * ``tuned``: take the planner options ``python -m vbatch tune`` measured on this machine
      (from ``tune_file``, default ``~/.cache/vbatch/tune.json``) where this config leaves
      them unset; :mod:`vbatch.runtime.tune`.
    * ``coalesce_us``: coalesce compatible submissions that arrive within this many
      microseconds into one launch group (``None``: off, every submission is its own);
      :mod:`vbatch.runtime.coalesce`.
    * ``coalesce_max_n``: only submissions whose problems are all at most this large coalesce
      (a larger problem fills the device by itself).
    * ``coalesce_max_k``: a bucket that holds this many problems is submitted at once.
    * ``kernel_options``: the kernel families' own planner options beyond the fields above, by
      name (the BLAS ops' ``blas_nb``, ``blas_whole_rhs``; the fronts' ``tree_split``,
      ``tree_shapes``, ``sweep_split``, ...: each family's ``plan_defaults`` lists them); a
      name no family of this backend has is refused.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    nb: int | None = Field(default=None, ge=1, le=1024)
    policy: Literal["dsse", "ssde"] = "dsse"
    fused_max_rows: int | None = Field(default=None, ge=0)
    block: int | None = Field(default=None, ge=0)
    block_above: int | None = Field(default=None, ge=0)
    block_few: int | None = Field(default=None, ge=0)
    block_few_above: int | None = Field(default=None, ge=0)
    streams: int | None = Field(default=None, ge=1, le=64)
    tree_max: int | None = Field(default=None, ge=0, le=128)
    cuda_graphs: bool = True
    fp64_update: Literal["fma", "mma"] = "fma"
    fp64_gemm: Literal["fma", "mma"] = "mma"
    tuned: bool = True
    tune_file: str | None = None
    coalesce_us: float | None = Field(default=None, gt=0, le=6e7)
    coalesce_max_n: int = Field(default=512, ge=0)
    coalesce_max_k: int = Field(default=16384, ge=1)
    kernel_options: dict[str, Any] = Field(default_factory=dict)

    PLANNER: ClassVar[tuple[str, ...]] = ("nb", "fused_max_rows", "streams", "block",
                                             "block_above", "block_few", "block_few_above",
                                             "tree_max")

    @classmethod
    def resolve(cls, config: "Config | None" = None, environ: Any = None,
                **options: Any) -> "Config":
        """The configuration of a runtime made with ``config`` and ``options`` (the module's
        precedence: arguments, then ``VBATCH_<FIELD>`` of ``environ``, default the process's
        environment, then the defaults). A bad environment value is named with its variable."""
        environ = os.environ if environ is None else environ
        given = {} if config is None else {k: getattr(config, k) for k in config.model_fields_set}
        given.update(options)
        from_env: dict = {}
        for name in cls.model_fields:
            var = f"VBATCH_{name.upper()}"
            if name in given or var not in environ:
                continue
            raw = environ[var]
            try:
                value = json.loads(raw) if name == "kernel_options" else (
                    None if raw.strip().lower() in ("", "none") else raw)
                cls(**{name: value})
            except (ValueError, ValidationError) as exc:
                why = exc.errors()[0]["msg"] if isinstance(exc, ValidationError) else str(exc)
                raise InputError([(None, f"{var}={raw!r}: {why}")],
                                 what="runtime options (environment)") from None
            from_env[name] = value
        return validated(cls, what="runtime options", **{**from_env, **given})

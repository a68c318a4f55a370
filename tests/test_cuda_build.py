"""The CUDA kernel selection and build, without cupy: every kernel a plan can launch is one that
``python -m vbatch compile`` and CI's nvcc check build."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from vbatch.kernels import blas_cuda as blas
from vbatch.kernels import cuda_build as build
from vbatch.kernels import frontal_cuda as frontal
from vbatch.kernels import potrf_cuda as sel
from vbatch.scheduler import plan_cholesky

ROOT = Path(__file__).resolve().parent.parent
KERNELS = Path(sel.__file__).parent


def _plans(seed: int, count: int):
    """Random plans over everything the CUDA backend accepts: nb, crossover, policy, partial,
    blocking."""
    rng = np.random.default_rng(seed)
    for _ in range(count):
        k = int(rng.integers(1, 40))
        # Mostly small sizes (fused panels of every height), some up to 2100 (separated
        # updates with every row tile, multi-tile trsm and schur).
        n = np.where(rng.random(k) < 0.7, rng.integers(0, 300, k), rng.integers(0, 2101, k))
        npiv = None if rng.random() < 0.5 else rng.integers(0, n + 1)
        yield plan_cholesky(n, npiv, nb=int(rng.choice(sel.NB_SUPPORTED)),
                            policy=str(rng.choice(["dsse", "ssde"])),
                            fused_max_rows=int(rng.choice([0, 64, sel.FUSED_ROWS_MAX])),
                            block=int(rng.choice([0, 64, 96, 128, 256])),
                            block_above=int(rng.choice([0, 256, 512])))


def test_every_selected_kernel_is_in_kernel_names():
    from vbatch.runtime.config import Config

    names = set(build.kernel_names())
    fused_threads, kinds, small = set(), set(), 0
    for plan in _plans(seed=0, count=60):
        for dtype in sel.DTYPES:
            for order in sel.ORDERS:
                for update in sel.FP64_UPDATES:
                    for lc in plan.launches:
                        if lc.family == blas.OP:  # a blocked plan's block updates
                            s = blas.selection(lc, plan, dtype, {"a": order, "l": order},
                                               Config())
                            assert s.name in names and lc.kind == blas.GEMM, s.name
                            kinds.add(lc.kind)
                            continue
                        s = sel.select(lc, plan.nb, dtype, order, update)
                        assert s.name in names, (s.name, lc, plan.nb, dtype, order, update)
                        kinds.add(lc.kind)
                        if s.name.startswith("vb::small_step"):
                            # A warp per panel of at most 32 rows, several to a block.
                            assert lc.kind == "fused" and lc.rows[1] <= sel.SMALL_ROWS
                            # its register code holds the launch's widest panel
                            lo, hi = sel.small_widths(build.ctype(dtype), lc.width)
                            assert lo <= hi and hi >= lc.width and s.name.endswith(f"{lo},{hi}>")
                            assert s.grid[0] * s.block[0] // 32 >= lc.count
                            small += 1
                        elif lc.kind == "fused":
                            fused_threads.add(s.block[0])
                            assert s.block[0] >= lc.rows[1]
                        if lc.kind == "fused":
                            # Row tiles in dynamic shared memory for 16-byte elements only
                            # (potrf.cu: dynamic_tiles), two a warp.
                            isz = np.dtype(dtype).itemsize
                            tiles = order == "C" and isz == 16
                            assert s.smem == tiles * sel.row_smem(s.block[0] // 32, isz)
    # The random plans did reach every fused block size and every kind of launch.
    assert fused_threads == set(sel.FUSED_THREADS) and small
    assert kinds == {"fused", "update", "trsm", "schur", blas.GEMM}


def _blas_plans(dtype):
    """CUDA-option plans of every blas op, on sizes around both DMMA tiles."""
    rng = np.random.default_rng(3)
    n = np.array([0, 1, 31, 33, 64, 65, 127, 128, 255, 256, 257, 300])
    k = rng.integers(0, 300, len(n))

    def mats(m, c):
        return [np.zeros((a, b), dtype) for a, b in zip(m, c)]

    cases = [("gemm", dict(a=mats(n, k), b=mats(k, n[::-1]))),
             ("syrk", dict(a=mats(n, k), c=mats(n, n))),
             ("syr2k", dict(a=mats(k, n), b=mats(k, n), trans=True)),
             ("trsm", dict(a=mats(n, n), b=mats(n, k))),
             ("trmm", dict(a=mats(n, n), b=mats(k, n), side="right", trans_a=True)),
             ("posv", dict(a=mats(n, n), b=mats(n, k))),
             ("symm", dict(a=mats(n, n), b=mats(n, k))),  # (its symmetric copy)
             # few right-hand sides: whole-triangle solves, every column count
             ("potrs", dict(l=mats(n, n), b=mats(n, rng.integers(0, 17, len(n))))),
             ("trsm", dict(a=mats(n, n), b=mats(n, np.minimum(n, 3)), trans_a=True))]
    if np.dtype(dtype).kind == "c":  # (POSV's factorization takes real types only so far)
        cases = [c for c in cases if c[0] != "posv"]
        cases += [("herk", dict(a=mats(n, k), c=mats(n, n))),
                  ("her2k", dict(a=mats(k, n), b=mats(k, n), trans=True)),
                  ("hemm", dict(a=mats(n, n), b=mats(n, k))),
                  ("trsm", dict(a=mats(n, n), b=mats(n, k), trans_a="C"))]
    for name, fields in cases:
        yield _plan(name, dtype, **fields)


def _plan(name, dtype=np.float32, options=(), **fields):
    """The plan of one op on ``fields``, with the CUDA kernels' planner options (``options``
    over their defaults)."""
    from vbatch.core.errors import validated
    from vbatch.ops.op import OPS
    from vbatch.scheduler import make_plan

    op = OPS[name]
    opts = {}
    for fam in op.families:
        opts.update(build.launchers()[fam].plan_defaults(dtype))
    opts.update(options)
    graph = op.graph(validated(op.request, **fields), opts)
    return make_plan(graph, op=name, policy="dsse", streams=opts.get("streams", 1),
                     buffers=op.names, **{k: v for k, v in opts.items() if k != "streams"})


def test_a_block_past_the_grid_is_named_at_submit():
    # A diagonal block takes a grid row per 32 right-hand sides: 65,535 of them fit, one more
    # does not (the copy's tiles, which TRSM no longer launches, are not its bound).
    from vbatch import InputError

    ok = 32 * blas.MAX_GRID_Y
    t = [np.ones((1, 1), np.float32)] * 2
    blas.check_plan(_plan("trsm", a=t, b=[np.zeros((1, ok), np.float32)] * 2))
    with pytest.raises(InputError, match=r"problem 1: a 1 x 2097152 block needs 65536 blocks"):
        blas.check_plan(_plan("trsm", a=t, b=[np.zeros((1, 1), np.float32),
                                            np.zeros((1, ok + 32), np.float32)]))
    blas.check_plan(_plan("trsm", a=[np.eye(32, dtype=np.float32)],
                          b=[np.zeros((32, ok), np.float32)]))
    with pytest.raises(InputError, match=r"problem 0: a 32 x 2097152 block needs 65536 blocks"):
        blas.check_plan(_plan("trsm", a=[np.eye(32, dtype=np.float32)],
                              b=[np.zeros((32, ok + 32), np.float32)]))
    # A GEMM's grid is one-dimensional: any width.
    blas.check_plan(_plan("gemm", a=[np.zeros((1, 1), np.float32)],
                          b=[np.zeros((1, ok + 32), np.float32)]))


@pytest.mark.parametrize("rows,cols,kernel", [
    (8, 40, "vb::blas_diag_cols<float,4,8,"),     # the launch's widest block: 8 rows
    (17, 16, "vb::blas_diag_cols<float,4,24,"),
    (32, 70, "vb::blas_diag_cols<float,4,32,"),
])
def test_which_diagonal_kernel_a_launch_takes(rows, cols, kernel):
    from vbatch.runtime.config import Config

    plan = _plan("trsm", np.float32, a=[np.eye(m, dtype=np.float32) for m in (1, rows)],
                 b=[np.zeros((m, cols), np.float32) for m in (1, rows)])
    (lc,) = [lc for lc in plan.launches if lc.kind == "blas.trsm"]
    sel = blas.selection(lc, plan, np.float32, {b: "F" for b in plan.buffers}, Config())
    assert sel.name.startswith(kernel)


def test_every_selected_blas_kernel_is_in_kernel_names():
    from vbatch.runtime.config import Config

    names = set(build.kernel_names())
    seen = set()
    for dtype in blas.DTYPES:
        for plan in _blas_plans(dtype):
            for order in ("F", "C"):
                layouts = {b: order for b in plan.buffers}
                for gemm in ("mma", "fma"):
                    for lc in plan.launches:
                        if lc.family != blas.OP:
                            continue
                        s = blas.selection(lc, plan, dtype, layouts, Config(fp64_gemm=gemm))
                        assert s.name in names, (s.name, plan.op, dtype, order, gemm)
                        assert s.smem <= 227 * 1024
                        seen.add(s.name.split("<")[0])
    assert seen == set(blas.TEMPLATES)
    # The large DMMA tile is reached (tasks of 256 and up), and only float64 uses DMMA.
    tiles = {blas.mma_tile(m, n) for m, n in ((300, 300), (300, 64), (64, 64), (32, 1))}
    assert tiles == set(blas.MMA_TILES)
    assert not any("mma" in x for x in blas.kernel_names(("float32",)))
    assert not any("simt" in x for x in blas.kernel_names(("float64",)))
    assert not any("mma" in x or "simt" in x
                   for x in blas.kernel_names(("complex128", "complex64")))


def test_cuda_blocking_defaults_per_dtype_and_layout():
    """What the CUDA backend's plan_defaults gives POTRF (Backend.plan_defaults with the
    module's layout_defaults; no GPU needed): column-major float64 (96, 256), float32 (64, 512);
    row-major float64 (128, 512), float32 as column-major; an unknown layout the column-major
    ones. block_few: two
    problems per multiprocessor of the device."""
    from vbatch.kernels.backend import Backend

    class Kernels:  # what Backend.plan_defaults asks of its backend
        def _op(self, op):
            return sel

        def device_info(self):
            return {"sms": 132}

    got = {(dt, order): Backend.plan_defaults(Kernels(), "potrf", np.dtype(dt), order)
           for dt in ("float64", "float32") for order in ("F", "C", None)}
    pairs = {k: (v["block"], v["block_above"]) for k, v in got.items()}
    assert pairs == {("float64", "F"): (96, 256), ("float64", "C"): (128, 512),
                     ("float64", None): (96, 256), ("float32", "F"): (64, 512),
                     ("float32", "C"): (64, 512), ("float32", None): (64, 512)}
    for v in got.values():  # the rest is the layout's own business: the same everywhere
        assert v["block_few"] == 264
        own = ("block", "block_above", "block_few", "block_few_above")
        assert {k: x for k, x in v.items() if k not in own} == {
            k: x for k, x in sel.plan_defaults(np.float64).items() if k not in own}
    assert {dt: got[(dt, "F")]["block_few_above"] for dt in ("float64", "float32")} == {
        "float64": 224, "float32": 384}
    # A device that says nothing of itself gets no block_few.
    assert Backend.plan_defaults(type("K", (), {"_op": lambda self, op: sel,
                                                "device_info": lambda self: {}})(),
                                 "potrf", np.dtype("float64"), "F")["block_few"] == 0


def test_the_sparse_factor_keeps_block_few_off_on_cuda():
    """The frontal op's families merge potrf's defaults (with block_few from the device) before
    frontal's own, which turn it off (not measured on fronts): Runtime._options' order."""
    from vbatch.kernels.backend import Backend
    from vbatch.ops.frontal import FRONTAL_OP

    mods = build.launchers()

    class Kernels:
        def _op(self, op):
            return mods[op]

        def device_info(self):
            return {"sms": 132}

    assert FRONTAL_OP.families[-1] == "frontal"
    for dt in ("float64", "float32"):
        hit: dict = {}
        for fam in FRONTAL_OP.families:
            hit.update(Backend.plan_defaults(Kernels(), fam, np.dtype(dt), "F"))
        assert hit["block_few"] == 0 and hit["block"] == hit["block_above"] == 256


def test_fused_thread_counts_between_the_powers_of_two_are_compiled():
    names = build.kernel_names()
    for nt in (96, 160, 192, 224):
        for T, R in (("double", "false"), ("float", "true")):
            assert f"vb::fused_step<{T},32,{nt},{R}>" in names


def test_the_kernels_take_the_dtypes_the_runtime_takes():
    """The dtypes of the kernel families together are those every backend takes
    (Backend.dtypes); each op takes those all of its families take (dtypes_for)."""
    from vbatch.kernels.backend import Backend

    assert set(build.DTYPES) == {d.name for d in Backend.dtypes}
    assert set(build.DTYPES) == {d for m in build.launchers().values() for d in m.DTYPES}


def test_kernel_names_is_the_whole_set_once():
    names = build.kernel_names()
    assert len(names) == len(set(names))
    # Per dtype and order: 7 fused, 3 update, trsm for each nb; 3 update_mma in float64;
    # then schur and small_step, one per register width up to the type's SMALL_NBMIN and one
    # for every width from it (float64: 8, 16, 24, 32 alone; the others 8 and 16 alone, 16-32);
    # per dtype, copy, put and spd_fill (no spd_fill for the complex types: it makes real SPD
    # batches).
    per_nb = {"float64": 7 + 3 + 3 + 1, "float32": 7 + 3 + 1, "complex128": 7 + 3 + 1,
              "complex64": 7 + 3 + 1}
    nbs = len(sel.NB_SUPPORTED)
    smalls = {"float64": 4, "float32": 3, "complex128": 3, "complex64": 3}
    want = sum(2 * (nbs * per_nb[dt] + 1 + smalls[dt]) for dt in sel.DTYPES) \
        + 2 * len(build.DTYPES) + len(build.REAL)
    # The blas family, per dtype (no order or panel width: its kernels read layouts at run
    # time): two GEMM tiles, the diagonal kernel per unrolled width (solve and product), the
    # copy, the whole-triangle solve per column count with X in global memory, and in shared
    # memory for the dtypes that use it; in float64 also the DMMA GEMM tiles, in float32 the
    # SIMT ones, one per orientation of A and B.
    want += len(blas.DTYPES) * (len(blas.GEMM_TILES) + 2 * len(blas.DIAG_COLS_NBS) + 1
                                + len(blas.TRSV_COLS)) \
        + len(blas.TRSV_XS_DTYPES) * len(blas.TRSV_COLS) \
        + 4 * len(blas.MMA_TILES) + 4 * len(blas.SIMT_TILES)
    # The frontal family (vbatch.sparse): per dtype and order, the extend-add, the solve's
    # two sweeps for each width of a pass, the small subtrees' two, its moves in and out and
    # the factor's tree kernel for each size class;
    # per dtype, the counters' reset.
    from vbatch.ops.frontal import TREE_CLASSES

    want += len(frontal.DTYPES) * (2 * (1 + 2 * len(frontal.RHS_PASSES) + 2 + 2
                                        + len(TREE_CLASSES)) + 1)
    # The getrf family, per dtype, order and pivoting: the factor kernel per thread count (the
    # panel in shared memory or not), the warp factor per width bucket, and the rows kernel
    # (that order's) per panel width; the register-row block factor per width bucket and warp
    # count (real types, both orders); per dtype and order, the solve's swap.
    from vbatch.kernels import getrf_cuda as getrf

    nbs = len(getrf.NB_SUPPORTED)
    want += len(getrf.DTYPES) * 2 * (2 * (2 * len(getrf.FACTOR_THREADS)
                                          + len(getrf.WARP_WIDTHS) + nbs) + 1) \
        + len(getrf.REGS_DTYPES) * 2 * 2 * len(getrf.WARP_WIDTHS) * len(getrf.REGS_WARPS)
    assert len(names) == want
    assert set(build.kernel_names(["float32"], [8], ["C"])) <= set(names)


def test_a_fused_panel_taller_than_the_largest_block_is_refused():
    assert sel.fused_threads(sel.FUSED_ROWS_MAX) == sel.FUSED_ROWS_MAX
    with pytest.raises(ValueError, match="taller than the fused kernel's largest block"):
        sel.fused_threads(sel.FUSED_ROWS_MAX + 1)


def test_the_generated_unit_includes_every_source_and_names_every_kernel():
    # Every .cu file beside the launchers is compiled by CI's nvcc check, behind the generated
    # preamble and the shared prologue header.
    src = build.instantiation_source()
    assert src.index(f"#define VB_TASK_COLS {build.TASK_COLS}") \
        < src.index('#include "vbatched.cuh"') < src.index('#include "pipeline.cuh"')
    for s in sorted(p.name for p in KERNELS.glob("*.cu")):
        assert f'#include "{s}"' in src
    taken = re.findall(r"\(void\*\)&(\S+),", src)
    assert taken == build.kernel_names()
    assert {build.source_of(n) for n in taken} == set(build.sources())


def test_every_launch_kind_has_a_kernel_on_both_backends():
    """One table of launch kinds (vbatch/core/kinds.py): the CUDA launcher of each op selects a
    kernel for every launch kind its op's kinds issue, and the CPU backend has the op's
    module."""
    from vbatch.kernels.backend import kernel_modules
    from vbatch.core.kinds import KINDS, LAUNCH_KINDS

    cpu = kernel_modules("_cpu")
    for op in {k.op for k in KINDS.values()}:
        assert op in build.launchers() and op in cpu, op
    assert set(LAUNCH_KINDS) >= {"fused", "update", "trsm", "schur"}


def test_the_selection_module_imports_without_cupy():
    code = ("import sys; sys.modules['cupy'] = None; import vbatch.runtime.cli; "
            "import vbatch.kernels.cuda_build as b; print(len(b.kernel_names()))")
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT,
                       timeout=120)
    assert p.returncode == 0 and int(p.stdout) == len(build.kernel_names()), p.stderr


def _readelf_kernels(cubin: Path) -> set[str]:
    """The kernels a cubin defines, as binutils read them, spelled as kernel_names spells them."""
    elf = subprocess.run(["readelf", "-sW", str(cubin)], capture_output=True, text=True,
                         check=True).stdout
    mangled = [ln.split()[-1] for ln in elf.splitlines() if " FUNC " in ln and " GLOBAL " in ln]
    plain = subprocess.run(["c++filt"], input="\n".join(mangled), capture_output=True, text=True,
                           check=True).stdout
    # "void vb::fused_step<double, 8, 96, false>(unsigned long long const*, ...)"
    return {re.sub(r"^void |\(.*$", "", ln).replace(" ", "") for ln in plain.splitlines() if ln}


def test_small_step_takes_the_narrowest_width_that_holds_a_launch():
    # float64 runs each width alone; the others alone up to 16 columns, then 16 to 32
    assert [sel.small_widths("double", w) for w in (1, 8, 9, 17, 25, 32)] == [
        (8, 8), (8, 8), (16, 16), (24, 24), (32, 32), (32, 32)]
    assert [sel.small_widths("float", w) for w in (8, 16, 17, 32)] == [
        (8, 8), (16, 16), (16, 32), (16, 32)]
    with pytest.raises(ValueError, match="at most 32 columns"):
        sel.small_widths("double", 33)


def test_a_kernel_symbol_reads_back_as_its_name():
    assert build.kernel_of("_ZN2vb10small_stepIfLi4ELb0ELi16ELi32EEEvPKyPKlPKiPKiiiii") \
        == "vb::small_step<float,4,false,16,32>"
    assert build.kernel_of("_ZN2vb13blas_gemm_mmaILi64ELi64ELi32ELi3ELb1ELb1ELi3EEEvPKy") \
        == "vb::blas_gemm_mma<64,64,32,3,true,true,3>"
    assert build.kernel_of("_ZN2vb13copy_matricesIdEEvPKliiii") == "vb::copy_matrices<double>"
    assert build.kernel_of("_ZN2vb13copy_matricesINS_2cxIfEEEEvPKxPT_iii") \
        == "vb::copy_matrices<vb::cx<float>>"
    assert build.kernel_of("_ZN2vb9blas_trsvINS_2cxIdEELi4ELb0EEEvPKyPKxPKiS8_iiii") \
        == "vb::blas_trsv<vb::cx<double>,4,false>"
    assert build.unit_of("vb::blas_trsv<vb::cx<double>,4,false>") == "blas_trsv_complex128"
    assert build.kernel_of("_ZN2vb1fILin5ELj7EEEvv") == "vb::f<-5,7>"
    # Not a kernel template of namespace vb: a plain function, another namespace, a device
    # helper's internal symbol.
    for other in ("_ZN2vb4copyEPdi", "_ZN3foo10small_stepIfLi4EEEvv",
                  "$__internal_0_$__cuda_sm20_div_s64", "_ZN2vb10small_stepIPdEEvv", "main"):
        assert build.kernel_of(other) is None, other


def test_every_kernel_has_a_unit_of_one_source():
    names = build.kernel_names()
    groups = build.units(names)
    assert sorted(n for ns in groups.values() for n in ns) == sorted(names)
    for unit, members in groups.items():
        assert len({build.source_of(n) for n in members}) == 1, unit
        src = build.instantiation_source(members)
        assert src.count('#include "') == len(build.HEADERS) + 1, unit
    assert build.unit_of("vb::fused_step<double,8,96,false>") == "fused_step_double"
    assert build.unit_of("vb::update_mma<16,32,true>") == "update_mma"


def _index(folder: Path, sources=None, archs=("sm_80", "sm_90", "sm_100", "sm_120")):
    name = build.copy_name("float64")
    src = build.source_of(name)
    idx = {"format": build.FORMAT, "archs": list(archs),
           "sources": sources or {src: build.source_hash(src)},
           "kernels": {name: [build.unit_of(name), "_ZN2vb13copy_matricesIdEEvv"]}}
    (folder / build.INDEX).write_text(json.dumps(idx))
    return name


def test_a_device_takes_the_cubin_of_its_architecture(tmp_path):
    name = _index(tmp_path)
    b = build.Binaries.read(tmp_path)
    want = {"80": "sm_80", "86": "sm_80", "89": "sm_80", "90": "sm_90", "100": "sm_100",
            "103": "sm_100", "120": "sm_120", "121": "sm_120", "75": None, "110": None}
    assert {cc: b.arch_for(cc) for cc in want} == want
    assert b.find(name, "90") == (tmp_path / f"{build.unit_of(name)}.sm_90.cubin",
                                  "_ZN2vb13copy_matricesIdEEvv")
    # No cubin for this device, or for this kernel.
    assert b.find(name, "75") is None
    assert b.find(build.copy_name("float32"), "90") is None


def test_a_cubin_of_another_source_is_not_used(tmp_path):
    name = _index(tmp_path, sources={"copy.cu": "0" * 64})
    assert build.Binaries.read(tmp_path).find(name, "90") is None


def test_an_index_that_cannot_be_read_is_no_index(tmp_path):
    assert build.Binaries.read(tmp_path) is None
    (tmp_path / build.INDEX).write_text("{not json")
    assert build.Binaries.read(tmp_path) is None
    (tmp_path / build.INDEX).write_text(json.dumps({"format": build.FORMAT + 1}))
    assert build.Binaries.read(tmp_path) is None


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc is not on PATH")
def test_a_build_indexes_the_kernels_its_cubins_define(tmp_path):
    names = [build.copy_name("float64"), build.spd_fill_name("float32")]
    runs = build.build_binaries(tmp_path, ["sm_80"], names, jobs=2)
    assert all(r.returncode == 0 for _, r in runs), [r.stderr for _, r in runs]
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(
        [build.INDEX] + [f"{build.unit_of(n)}.sm_80.cubin" for n in names])
    b = build.Binaries.read(tmp_path)
    assert b.archs == ("sm_80",) and sorted(b.kernels) == sorted(names)
    for n in names:
        cubin, symbol = b.find(n, "86")
        assert symbol in build.elf_functions(cubin.read_bytes())
        assert build.kernel_of(symbol) == n
        if shutil.which("readelf") and shutil.which("c++filt"):
            assert _readelf_kernels(cubin) == {n}
    # A second build replaces the first's cubins and index.
    runs = build.build_binaries(tmp_path, ["sm_90"], names[:1], jobs=2)
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(
        [build.INDEX, f"{build.unit_of(names[0])}.sm_90.cubin"])

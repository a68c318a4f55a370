"""The packed form: layout, views, packing a list once."""

from __future__ import annotations

import numpy as np
import pydantic
import pytest

import vbatch
from vbatch import PackedBatch
from vbatch.ops.generate import DISTRIBUTIONS, sizes, spd_packed


@pytest.mark.parametrize("order", ["F", "C"])
def test_pack_round_trip(order):
    rng = np.random.default_rng(0)
    mats = [rng.standard_normal((n, n)) for n in (0, 1, 7, 8, 9, 3)]
    b = vbatch.pack(mats, order=order)
    assert b.k == 6 and b.order == order and b.data.size == sum(m.size for m in mats)
    for m, v in zip(mats, b.unpack()):
        assert np.array_equal(m, v)
    assert b.offset.tolist() == [0, 0, 1, 50, 114, 195]


@pytest.mark.parametrize("order", ["F", "C"])
@pytest.mark.parametrize("shapes", [[(8, 8)] * 5, [(2, 3)] * 4, [(3, 4), (5, 2), (1, 1), (6, 6)],
                                    [(3, 4), (0, 2), (2, 2)], [(0, 0)] * 2, [(1, 5), (5, 1)]],
                         ids=["square", "one-shape", "mixed", "empty-rows", "all-empty", "thin"])
def test_pack_places_every_array_whatever_its_own_layout(order, shapes):
    # One shape (stacked), mixed shapes (concatenated) and a layout with space no matrix fills
    # (placed one by one); C-ordered, Fortran-ordered and strided inputs.
    rng = np.random.default_rng(3)
    mats = [rng.standard_normal(s) for s in shapes]
    for given in (mats, [np.asfortranarray(m) for m in mats],
                  [np.repeat(m, 2, axis=0)[::2] for m in mats]):
        b = vbatch.pack(given, order=order)
        for i, m in enumerate(mats):
            assert b.matrix(i).shape == m.shape and np.array_equal(b.matrix(i), m), i


@pytest.mark.filterwarnings("ignore::PendingDeprecationWarning")  # (np.matrix's own)
def test_pack_takes_matrix_subclasses_and_large_mixed_shapes():
    # np.matrix stays 2-D when flattened; matrices past _PACK_SMALL on average are flattened
    # as concatenate copies them (row-major, not ravelled first), whatever their own layout.
    mats = [np.matrix(np.arange(4.0).reshape(2, 2)), np.matrix(np.arange(9.0).reshape(3, 3))]
    big = [np.random.default_rng(4).standard_normal((r, c)) for r, c in ((40, 40), (3, 7),
                                                                          (25, 30))]
    for given in (mats, big, [np.asfortranarray(m) for m in big],
                  [np.repeat(m, 2, axis=1)[:, ::2] for m in big], [m.T for m in big]):
        for order in "FC":
            b = vbatch.pack(given, order=order)
            for i, m in enumerate(given):
                assert np.array_equal(b.matrix(i), np.asarray(m)), (order, i)


def test_a_part_of_a_validated_list_is_that_subset_validated():
    """MatrixList.part (a distributed call's shard) describes its arrays as validating them
    would, without reading them again; its sizes are read-only, as a validated list's."""
    from vbatch.core.batch import MatrixList

    rng = np.random.default_rng(2)
    mats = [rng.standard_normal((int(m), int(n))) for m, n in rng.integers(0, 9, (12, 2))]
    whole = MatrixList(mats=mats)
    for index in (np.array([3, 0, 7]), np.arange(12), np.array([], np.int64)):
        part, want = whole.part(index), MatrixList(mats=[mats[i] for i in index.tolist()])
        assert all(a is b for a, b in zip(part.mats, want.mats)) and part.k == want.k
        for f in ("m", "n"):
            assert np.array_equal(getattr(part, f), getattr(want, f))
            assert not getattr(part, f).flags.writeable
        assert (part.kind, part.dtype, part.addr, part.vector) == (want.kind, want.dtype,
                                                                   want.addr, want.vector)
        packed = vbatch.pack(part, order="F")
        for i, j in enumerate(index.tolist()):
            assert np.array_equal(packed.matrix(i), mats[j])


def test_packed_views_write_through_and_respect_ld():
    data = np.arange(30, dtype=np.float64)
    b = PackedBatch.from_buffer(data, n=[2, 3], offset=[0, 10], ld=[4, 5], order="F")
    assert b.matrix(0).tolist() == [[0, 4], [1, 5]]
    assert b.matrix(1).tolist() == [[10, 15, 20], [11, 16, 21], [12, 17, 22]]
    c = PackedBatch.from_buffer(data, n=[2], offset=[3], ld=[4], order="C")
    assert c.matrix(0).tolist() == [[3, 4], [7, 8]]
    b.matrix(1)[0, 0] = -1
    assert data[10] == -1


def test_metadata_is_frozen():
    b = vbatch.pack([np.eye(2), np.eye(3)])
    with pytest.raises(ValueError):
        b.n[0] = 5
    with pytest.raises(pydantic.ValidationError, match="frozen"):
        b.order = "F"


def test_a_pickled_batch_is_its_data_and_layout_without_its_cache():
    # (what vbatch.distributed sends back from a CPU worker: a factored batch, its cache
    # holding that process's plans, weak references among them)
    import pickle

    mats = [np.eye(3) * 4.0, np.ones((2, 5)), np.zeros((0, 0))]
    for order in ("F", "C"):
        b = vbatch.pack(mats, order=order)
        res = vbatch.Runtime("cpu").gemm(b, vbatch.pack([m.T for m in mats], order=order))
        out = res.result()
        assert out.cache(), "the call left no plan in the output's cache"
        c = pickle.loads(pickle.dumps(out))
        assert "_vb_cache" not in c.__dict__ and out.cache()
        assert c.order == order and c.n.tolist() == out.n.tolist()
        assert c.m.tolist() == out.m.tolist() and np.array_equal(c.data, out.data)
        for i, m in enumerate(mats):
            assert np.allclose(c.matrix(i), m @ m.T)


def test_from_buffer_accepts_a_contiguous_block():
    data = np.zeros((4, 8))
    b = PackedBatch.from_buffer(data, n=[4, 4], order="C")
    assert b.data.ndim == 1 and b.offset.tolist() == [0, 16]


def test_h_matrix_diagonal_blocks_in_one_dense_array():
    """Diagonal leaves of one big matrix: offsets into it, ld = its order, no copy."""
    rng = np.random.default_rng(1)
    big_n, cuts = 60, [0, 13, 14, 40, 60]
    r = rng.standard_normal((big_n, big_n))
    big = np.asfortranarray(r @ r.T + big_n * np.eye(big_n))
    starts, ns = np.array(cuts[:-1]), np.diff(cuts)
    b = PackedBatch.from_buffer(big.reshape(-1, order="F"), ns, starts * (big_n + 1), [big_n] * 4)
    res = vbatch.Runtime("cpu", nb=8).cholesky(b).result()
    for i, (s, n) in enumerate(zip(starts, ns)):
        blk = big[s : s + n, s : s + n]
        assert np.allclose(res.factors.matrix(i), np.linalg.cholesky(blk))


@pytest.mark.parametrize("dist", DISTRIBUTIONS)
def test_size_distributions(dist):
    rng = np.random.default_rng(0)
    s = sizes(dist, 2000, 512, rng)
    assert s.dtype == np.int64 and s.min() >= 1 and s.max() <= 512
    if dist == "skewed":
        assert np.count_nonzero(s == 512) == 20 and np.count_nonzero(s > 51) == 20
    if dist == "gauss":
        assert abs(np.median(s) - 256) < 15


def test_spd_packed_is_spd_in_both_orders():
    for order in ("F", "C"):
        b = spd_packed([0, 1, 9], np.float32, np.random.default_rng(2), order=order)
        for i in (1, 2):
            m = b.matrix(i).astype(np.float64)
            assert np.allclose(m, m.T) and np.linalg.eigvalsh(m).min() > 0


def _device_list(m, n, ptr, rs, cs, dtype=np.float64):
    """A device list's description as the CUDA backend reads it: sizes, addresses (bytes) and
    strides (elements); no arrays (in_place_layout reads none)."""
    from vbatch.core.batch import MatrixList

    addr = np.array([ptr, rs, cs], dtype=np.int64)
    return MatrixList.model_construct(mats=[None] * len(m), kind="cupy", dtype=np.dtype(dtype),
                                      m=np.asarray(m), n=np.asarray(n), addr=addr)


def test_a_device_list_lies_in_one_layout_where_its_arrays_are():
    from vbatch.core.batch import in_place_layout

    # column-major 3 x 3 and 2 x 4 (leading dimension 5), out of address order
    base, off, ld, order, span = in_place_layout(
        _device_list([3, 2], [3, 4], [1400, 1000], [1, 1], [3, 5]))
    assert (base, off.tolist(), ld.tolist(), order, span) == (1000, [50, 0], [3, 5], "F", 59)
    # row-major; an empty matrix (address 0) and a single row occupy what they hold
    base, off, ld, order, span = in_place_layout(
        _device_list([2, 0, 1], [4, 0, 6], [2000, 0, 1000], [4, 1, 6], [1, 1, 1]))
    assert (base, off.tolist(), ld.tolist(), order, span) == (1000, [125, 0, 0], [4, 1, 6],
                                                             "C", 133)
    # float32: offsets in its own elements
    assert in_place_layout(_device_list([2], [2], [1004], [1], [2], np.float32))[1].tolist() \
        == [0]


@pytest.mark.parametrize("case", ["overlap", "inside", "twice", "misaligned", "no unit stride",
                                  "short leading dimension", "negative stride", "mixed orders",
                                  "all empty", "zero stride"])
def test_a_device_list_that_cannot_be_written_where_it_lies_is_copied(case):
    from vbatch.core.batch import in_place_layout

    m, n, ptr, rs, cs = {
        "overlap": ([3, 3], [3, 3], [1000, 1064], [1, 1], [3, 3]),
        "inside": ([4, 1], [4, 1], [1000, 1008], [1, 1], [4, 1]),  # one inside another's extent
        "twice": ([2, 2], [2, 2], [1000, 1000], [1, 1], [2, 2]),
        "misaligned": ([2, 2], [2, 2], [1000, 1204], [1, 1], [2, 2]),
        "no unit stride": ([2, 2], [2, 2], [1000, 2000], [2, 1], [4, 2]),  # every other row
        "short leading dimension": ([3], [3], [1000], [1], [2]),
        "negative stride": ([3], [3], [1000], [1], [-3]),
        "mixed orders": ([2, 2], [3, 3], [1000, 2000], [1, 3], [2, 1]),
        "all empty": ([0, 0], [0, 3], [0, 0], [1, 1], [1, 1]),
        "zero stride": ([3], [3], [1000], [1], [0]),  # (a broadcast: every column one)
    }[case]
    assert in_place_layout(_device_list(m, n, ptr, rs, cs)) is None


def test_a_one_by_one_matrix_takes_any_strides_and_float32_its_own_alignment():
    from vbatch.core.batch import in_place_layout

    assert in_place_layout(_device_list([1, 2], [1, 2], [1000, 1008], [77, 1], [-5, 2]))[1] \
        .tolist() == [0, 1]
    assert in_place_layout(_device_list([2], [2], [1002], [1], [2], np.float32)) is None


def test_operands_that_share_memory_are_found():
    from vbatch.core.batch import extents, overlaps

    mine = extents(_device_list([3, 2], [3, 2], [1000, 2000], [1, 1], [3, 2]))
    assert [r.tolist() for r in mine] == [[1000, 2000], [1072, 2032]]
    # column-major 3 x 3 at 1000: bytes [1000, 1072)
    for ptr, meets in ((1072, False), (1064, True), (900, False), (2024, True), (2032, False)):
        other = extents(_device_list([1], [1], [ptr], [1], [1]))
        assert overlaps(mine, other) is meets, ptr
    # a range that spans one of mine from before it to after it
    assert overlaps(mine, (np.array([990]), np.array([1100])))
    assert overlaps(mine, mine) and not overlaps(mine, (np.array([], np.int64),) * 2)
    # a negative stride reaches below its address
    back = extents(_device_list([1], [3], [1100], [1], [-3]))
    assert [r.tolist() for r in back] == [[1052], [1108]]
    assert extents([np.zeros(3)]) is None  # (not a device operand)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_device_list_sizes_and_strides_from_cheap_reads(dtype):
    """A cupy list's sizes come from ``len`` and ``size``, and a contiguous array's strides from
    its flags (core.batch._shapes and addresses): they must be its shapes, and a nonempty
    array's strides along every axis of more than one element, for every kind of 2-D array:
    both orders, empty ones of either dimension, one row or column (both flags), padded,
    stepped, transposed and reversed views. A list of C-ordered arrays alone reads one flag,
    a mixed one both."""
    import cupy

    from vbatch.core.batch import _shapes, addresses, list_signature

    base = cupy.arange(400, dtype=dtype).reshape(20, 20)
    mixed = [cupy.zeros((3, 4), dtype), cupy.zeros((3, 4), dtype, order="F"),
             cupy.zeros((0, 5), dtype), cupy.zeros((5, 0), dtype, order="F"),
             cupy.zeros((0, 0), dtype), cupy.zeros((1, 1), dtype), cupy.zeros((1, 6), dtype),
             cupy.zeros((6, 1), dtype, order="F"), base[2:7, 3:9], base[::2, ::3],
             base.T[1:5, :], base[::-1, :][:4, :4], base[:, 2:3], base[3:4, ::2],
             cupy.asfortranarray(base)[1:6, 2:5]]
    plain = [cupy.zeros((n, n + 1), dtype) for n in (0, 1, 2, 7)]
    isz = np.dtype(dtype).itemsize
    for mats in (mixed, plain, mixed[1:2]):
        mn = _shapes(mats, True)
        assert mn.tolist() == [list(a.shape) for a in mats]
        assert list_signature(mats)[2] == np.array([a.shape for a in mats], np.int64).tobytes()
        addr = addresses(mats, isz, mn[:, 0], mn[:, 1])
        for i, a in enumerate(mats):
            assert addr[0, i] == a.data.ptr
            for axis in (0, 1):
                if a.size and a.shape[axis] > 1:
                    assert addr[1 + axis, i] == a.strides[axis] // isz, (i, axis)


def test_an_empty_matrix_does_not_choose_a_device_lists_order():
    """packed_order reads each array's unit strides; an empty array's strides (derived, not
    read, for a cupy list: core.batch.addresses) must not change the order the others ask for:
    a list orders as it would without its empty arrays. Described here with addresses given,
    as a device list's are."""
    import itertools

    from vbatch.core.batch import MatrixList

    def order(shapes, strides):
        m, n = (np.array([s[i] for s in shapes]) for i in (0, 1))
        addr = np.array([[800 * i for i in range(len(shapes))],
                         [s[0] for s in strides], [s[1] for s in strides]], np.int64)
        return MatrixList.model_construct(mats=[None] * len(shapes), kind="cupy",
                                          dtype=np.dtype(np.float64), m=m, n=n,
                                          addr=addr).packed_order

    lives = {"F": ([(3, 4), (4, 2)], [(1, 3), (1, 4)]), "C": ([(3, 4), (4, 2)], [(4, 1), (2, 1)]),
             "column": ([(3, 1)], [(1, 1)]), "row": ([(1, 5)], [(5, 1)])}
    empties = [(0, 4), (5, 0), (0, 0)]
    choices = [(1, 1), (0, 0), (4, 1), (1, 5)]
    for name, (shapes, strides) in lives.items():
        want = order(shapes, strides)
        for e, st in itertools.product(empties, choices):
            assert order(shapes + [e], strides + [st]) == want, (name, e, st)

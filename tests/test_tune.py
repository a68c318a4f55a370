"""``python -m vbatch tune`` and the defaults it leaves: the file's entry for this backend and
these kernels sets what a Runtime is not told (on the CPU backend; the machinery is the same
on CUDA, whose knobs are the crossover and the blocking)."""

from __future__ import annotations

import json

import numpy as np
import pytest

from vbatch import Runtime
from vbatch.kernels import potrf_cpu
from vbatch.ops.generate import spd_packed
from vbatch.runtime import cli
from vbatch.runtime.tune import FORMAT, entry_key, tune, tuned_options


def _write(path, key, options, quick=False, format=FORMAT):
    path.write_text(json.dumps({key: {"options": options, "quick": quick, "format": format}}))


def test_a_runtime_takes_the_entry_for_its_backend_and_kernels(tmp_path):
    f = tmp_path / "tune.json"
    plain = Runtime("cpu", tuned=False)
    key = entry_key(plain.backend)
    default = potrf_cpu.plan_defaults("float64")["nb"]
    _write(f, key, {"potrf": {"float64": {"F": {"nb": 128}, "C": {"nb": 256}}}})
    rt = Runtime("cpu", tune_file=str(f))
    assert rt.plan_options("float64")["nb"] == 128  # (a layout not said: column-major's)
    assert rt.plan_options("float64", order="F")["nb"] == 128
    assert rt.plan_options("float64", order="C")["nb"] == 256  # each layout its own
    assert rt.plan_options("float32")["nb"] == default  # no entry for float32
    assert rt.plan_options("float64", "posv", "C")["nb"] == 256  # every op of the family
    for order, nb in (("F", 128), ("C", 256)):  # what a call on a batch of that layout plans
        batch = spd_packed([40, 3], np.float64, np.random.default_rng(0), order)
        assert rt.plan(batch).opts["nb"] == nb
    assert Runtime("cpu", tune_file=str(f), nb=256).plan_options("float64")["nb"] == 256
    assert Runtime("cpu", tune_file=str(f), tuned=False).plan_options("float64")["nb"] == default
    # Measured on other kernels (another hash), by a quick run, or written in another format
    # (options per dtype alone, measured on column-major batches): not taken.
    _write(f, key.rsplit(" ", 1)[0] + " 0123456789abcdef",
           {"potrf": {"float64": {"F": {"nb": 128}}}})
    assert Runtime("cpu", tune_file=str(f)).plan_options("float64")["nb"] == default
    _write(f, key, {"potrf": {"float64": {"F": {"nb": 128}}}}, quick=True)
    assert Runtime("cpu", tune_file=str(f)).plan_options("float64")["nb"] == default
    _write(f, key, {"potrf": {"float64": {"nb": 128}}}, format=None)
    assert Runtime("cpu", tune_file=str(f)).plan_options("float64")["nb"] == default
    # A missing or unreadable file is no entry.
    f.write_text("{not json")
    assert tuned_options(plain.backend, Runtime("cpu", tune_file=str(f)).config) == {}
    assert Runtime("cpu", tune_file=str(tmp_path / "none.json")).plan_options("float64")["nb"] \
        == default


def test_tune_measures_every_candidate_and_writes_its_choice(tmp_path):
    f = tmp_path / "sub" / "tune.json"
    lines = []
    entry = tune("cpu", ("float64",), quick=True, path=str(f), log=lines.append)
    candidates = {potrf_cpu.plan_defaults("float64")["nb"], *potrf_cpu.TUNE[0][1]}
    for order in ("F", "C"):  # each layout timed and chosen on its own
        assert entry["options"]["potrf"]["float64"][order]["nb"] in candidates
        timed = entry["timings"]["potrf"]["float64"][order]["nb"]
        assert {int(c) for c in timed} == candidates
        assert all(len(ms) == 2 and all(t > 0 for t in ms) for ms in timed.values())
    saved = json.loads(f.read_text())
    assert saved[entry_key(Runtime("cpu", tuned=False).backend)]["options"] == entry["options"]
    assert sum(line.lstrip().startswith("*") for line in lines) == 2  # one choice a layout
    assert any("float64 C:" in line for line in lines)


def test_tune_command(tmp_path, capsys):
    f = tmp_path / "tune.json"
    assert cli.main(["tune", "--device", "cpu", "--quick", "--dtype", "float32",
                     "--file", str(f)]) == 0
    out = capsys.readouterr().out
    assert "potrf float32 F: nb=" in out and "potrf float32 C: nb=" in out and f.exists()
    with pytest.raises(SystemExit) as e:
        cli.main(["tune", "--reps", "0"])
    assert e.value.code == 2


def test_a_candidate_the_backend_refuses_is_skipped(tmp_path, monkeypatch):
    # With nb = 32, a block of 48 is not whole panels: the backend refuses it, tune goes on.
    monkeypatch.setattr(potrf_cpu, "TUNE", (("nb", (32,)), (("block", "block_above"),
                                                          ((0, 0), (48, 0), (64, 0)))))
    monkeypatch.setattr(potrf_cpu, "plan_defaults",
                        lambda dtype: {"nb": 32, "fused_max_rows": 10**9, "streams": 1,
                                       "block": 0, "block_above": 0})
    lines = []
    entry = tune("cpu", ("float64",), quick=True, path=str(tmp_path / "t.json"),
                 log=lines.append)
    assert entry["options"]["potrf"]["float64"]["F"]["block"] in (0, 64)
    assert set(entry["timings"]["potrf"]["float64"]["F"]["block/block_above"]) == {"0/0", "64/0"}
    assert any("block must be 0 or a multiple of nb = 32" in ln for ln in lines)

"""`python -m vbatch`: the demo is the main job, so it is tested as a user runs it."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from vbatch.runtime.cli import main
from vbatch.runtime.device import cuda_status

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def run(*args, env_path=None):
    """``python -m vbatch args``; ``env_path`` replaces PATH (where nvcc is looked up)."""
    env = None if env_path is None else {**os.environ, "PATH": env_path}
    return subprocess.run(
        [sys.executable, "-m", "vbatch", *args], capture_output=True, text=True, cwd=ROOT,
        timeout=300, env=env,
    )


@pytest.mark.parametrize("dist", ["uniform", "gauss", "skewed"])
@pytest.mark.parametrize("dtype", ["float64", "float32"])
def test_demo_passes_and_reports(dist, dtype):
    p = run("demo", "--count", "150", "--nmax", "70", "--dist", dist, "--dtype", dtype,
            "--device", "cpu", "--nb", "16", "--repeat", "1")
    assert p.returncode == 0, p.stdout + p.stderr
    out = p.stdout
    for word in ("150 SPD matrices", "sizes", "launches", "groups", "GFLOP/s", "worst", "ok"):
        assert word in out, out
    assert "FAILED" not in out


def test_demo_fails_on_a_non_spd_matrix_and_isolates_it():
    p = run("demo", "--count", "60", "--nmax", "40", "--device", "cpu", "--nonspd", "2",
            "--repeat", "1", "--policy", "ssde")
    assert p.returncode == 1, p.stdout + p.stderr
    assert "2 not positive definite" in p.stdout and "matches the planted pivots" in p.stdout


# Each bad command line, and a word its one-line error must contain.
BAD_ARGS = [
    (["demo", "--dist", "zipf"], "invalid choice: 'zipf'"),
    (["demo", "--nb", "0", "--device", "cpu"], "--nb: must be >= 1"),
    (["demo", "--nb", "2000", "--device", "cpu"], "nb"),
    (["plan", "--nb", "2000", "--device", "cpu"], "nb"),
    (["demo", "--nonspd", "-1", "--device", "cpu"], "--nonspd: must be >= 0"),
    (["demo", "--count", "5", "--nonspd", "6", "--device", "cpu"], "--nonspd: must be <= --count"),
    (["demo", "--repeat", "0", "--device", "cpu"], "--repeat: must be >= 1"),
    (["demo", "--count", "-1", "--device", "cpu"], "--count: must be >= 0"),
    (["plan", "--nmax", "0", "--device", "cpu"], "--nmax: must be >= 1"),
    (["demo", "--count", "ten", "--device", "cpu"], "--count: expected an integer"),
    (["demo", "--seed", "-1", "--device", "cpu"], "--seed: must be >= 0"),
    (["plan", "--limit", "-1", "--device", "cpu"], "--limit: must be >= 0"),
    (["compile", "--dtype", "float16"], "invalid choice: 'float16'"),
    # (the Cholesky commands take real types, its generator's; compile takes every kernel's)
    (["demo", "--dtype", "complex128", "--device", "cpu"], "invalid choice: 'complex128'"),
    (["tune", "--dtype", "complex64", "--device", "cpu"], "invalid choice: 'complex64'"),
    (["compile", "--nb", "64"], "invalid choice: 64"),
    (["compile", "--order", "X"], "invalid choice: 'X'"),
    (["compile", "--jobs", "0"], "--jobs: must be >= 1"),
    (["compile", "--arch", "sm_90"], "only with --nvcc"),
    (["compile", "--nvcc", "--arch", "compute_90"], "--arch: expected a GPU architecture"),
    (["frobnicate"], "invalid choice: 'frobnicate'"),
    ([], "required"),
]


def assert_usage_error(p, word):
    """Exit status 2, one line on stderr that names the program and the problem, no traceback."""
    err = p.stderr.splitlines()
    assert p.returncode == 2, p.stdout + p.stderr
    assert len(err) == 1, p.stderr
    assert err[0].startswith("python -m vbatch") and ": error: " in err[0], err[0]
    assert word in err[0], err[0]
    assert "Traceback" not in p.stdout + p.stderr


@pytest.mark.parametrize("args, word", BAD_ARGS, ids=[" ".join(a) or "none" for a, _ in BAD_ARGS])
def test_bad_arguments_give_one_line_and_exit_2(args, word):
    assert_usage_error(run(*args), word)


@pytest.mark.skipif(cuda_status()[0], reason="checks the no-GPU message")
@pytest.mark.parametrize("cmd", ["demo", "plan"])
def test_device_cuda_without_a_gpu_is_a_usage_error(cmd):
    assert_usage_error(run(cmd, "--device", "cuda"), "device='cuda' was asked for, but")


@pytest.mark.gpu
def test_an_nb_the_cuda_backend_cannot_run_is_a_usage_error():
    assert_usage_error(run("demo", "--device", "cuda", "--nb", "4"), "supports nb in")


@pytest.mark.skipif(cuda_status()[0], reason="checks the no-GPU message")
def test_compile_without_cupy_or_a_gpu_is_a_usage_error():
    assert_usage_error(run("compile"), "--nvcc compiles with nvcc instead")


def test_compile_nvcc_without_nvcc_is_a_usage_error(tmp_path):
    assert_usage_error(run("compile", "--nvcc", env_path=str(tmp_path)), "nvcc is not on PATH")


def test_compile_nvcc_to_a_file_is_a_usage_error(tmp_path):
    (tmp_path / "f").write_text("")
    assert_usage_error(run("compile", "--nvcc", "--out", str(tmp_path / "f")),
                       "--out: cannot make folder")


def test_compile_nvcc_into_a_read_only_package_is_a_usage_error(tmp_path, monkeypatch, capsys):
    import os

    from vbatch.runtime import cli

    fake = tmp_path / "nvcc"
    fake.write_text("#!/bin/sh\nexit 0\n")
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", str(tmp_path))
    real = os.access
    # (nothing writable; nvcc still found: shutil.which asks for execute access)
    monkeypatch.setattr(os, "access", lambda path, mode: mode != os.W_OK and real(path, mode))
    with pytest.raises(SystemExit) as exc:
        cli.main(["compile", "--nvcc", "--arch", "sm_90"])
    assert exc.value.code == 2
    assert "is not writable; name another with --out" in capsys.readouterr().err


def test_compile_nvcc_reports_a_failed_nvcc_and_exits_1(tmp_path):
    fake = tmp_path / "nvcc"
    fake.write_text("#!/bin/sh\necho 'error: planted failure' >&2\nexit 1\n")
    fake.chmod(0o755)
    p = run("compile", "--nvcc", "--arch", "sm_90", "--dtype", "float32", "--out",
            str(tmp_path / "out"), env_path=str(tmp_path))
    from vbatch.kernels import cuda_build as build

    runs = len(build.units(build.kernel_names(["float32"])))
    assert p.returncode == 1, p.stdout + p.stderr
    assert "error: planted failure" in p.stderr
    assert f"nvcc failed in {runs} of {runs} runs" in p.stderr
    assert "fused_step_float.sm_90.cubin" in p.stderr
    assert not (tmp_path / "out" / build.INDEX).exists()  # (no index of a failed build)


@pytest.mark.gpu
@pytest.mark.slow
def test_compile_through_nvrtc():
    p = run("compile", "--dtype", "float32", "--nb", "8", "--order", "C", "--jobs", "4")
    assert p.returncode == 0, p.stdout + p.stderr
    assert p.stdout.startswith("compiled "), p.stdout


@pytest.mark.parametrize("cmd", [[], ["demo"], ["plan"], ["compile"]])
def test_help_is_plain_text(cmd):
    p = run(*cmd, "--help")
    assert p.returncode == 0, p.stderr
    assert p.stdout.startswith(f"usage: python -m vbatch {' '.join(cmd)}".rstrip()), p.stdout
    assert "``" not in p.stdout, p.stdout


def test_the_console_script_calls_itself_vbatch(capsys):
    # pyproject's [project.scripts] entry calls main() with no arguments.
    with pytest.raises(SystemExit) as exc:
        main(["demo", "--repeat", "0"])
    assert exc.value.code == 2
    assert capsys.readouterr().err == "vbatch demo: error: argument --repeat: must be >= 1, got 0\n"
    with pytest.raises(SystemExit):
        main(["--help"])
    assert capsys.readouterr().out.startswith("usage: vbatch [-h]")


def test_the_installed_console_script():
    script = Path(sys.executable).with_name("vbatch")
    if not script.exists():
        pytest.skip(f"no console script beside {sys.executable} (package not pip-installed)")
    p = subprocess.run([str(script), "plan", "--nmax", "0"], capture_output=True, text=True,
                       timeout=60)
    assert p.returncode == 2
    assert p.stderr == "vbatch plan: error: argument --nmax: must be >= 1, got 0\n", p.stderr


def test_plan_prints_a_table():
    p = run("plan", "--count", "30", "--nmax", "90", "--nb", "16", "--device", "cpu",
            "--limit", "5")
    assert p.returncode == 0, p.stderr
    lines = p.stdout.splitlines()
    assert lines[0].startswith("dsse plan, nb=16: 30 of 30 problems")
    assert lines[1].split()[:4] == ["#", "grp", "step", "strm"]


def test_the_usage_line_names_every_command(capsys):
    """Run bare, the CLI's usage line and error list every command, tune included."""
    with pytest.raises(SystemExit) as exc:
        main([])
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert "{demo,plan,trace,compile,tune}" in err, err


def test_a_missing_optional_package_names_the_feature_and_the_extra():
    """Without numba (or pymetis), what needs it says which vbatch feature that is and which
    extra to install, not the name of an internal function."""
    from vbatch.core import jit

    def _canon_lower():
        pass

    _canon_lower.__module__ = "vbatch.sparse.analysis"
    with pytest.raises(ImportError) as exc:
        jit.needs("numba")(_canon_lower)()
    msg = str(exc.value)
    assert msg == "vbatch.sparse needs numba, which is not installed: pip install " \
                  "'vbatch[sparse]'", msg

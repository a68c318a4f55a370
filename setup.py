"""The build: setuptools, configured by pyproject.toml, and the CUDA kernels compiled into the
package where nvcc is present (``python -m vbatch compile --nvcc``: a cubin per kernel template,
type and architecture, in vbatch/kernels/bin), so that a fresh install's first call loads them
instead of compiling through NVRTC.

``VBATCH_CUDA_ARCHS`` names the architectures (by default those of
``vbatch.kernels.cuda_build.ARCHS`` that this nvcc knows; a failure then installs without
kernels, a failure for named ones stops the build); ``none`` builds none. An editable install
builds none: its kernels compile from the sources being edited.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py


def _archs() -> list[str] | None:
    """The architectures to build (None: the defaults), or [] for none."""
    if shutil.which("nvcc") is None:
        return []
    named = os.environ.get("VBATCH_CUDA_ARCHS", "").split()
    return [] if named == ["none"] else named or None


def _core_dependencies() -> list[str]:
    """The package's own dependencies: the compile runs ``python -m vbatch``, which imports
    them, inside the isolated build environment."""
    try:
        import tomllib
    except ImportError:  # Python 3.10
        from setuptools.config.pyprojecttoml import read_configuration

        return read_configuration("pyproject.toml")["project"]["dependencies"]
    with open("pyproject.toml", "rb") as fh:
        return tomllib.load(fh)["project"]["dependencies"]


class BuildWithKernels(build_py):
    def run(self):
        super().run()
        lib = Path(self.build_lib).resolve()
        out = lib / "vbatch" / "kernels" / "bin"
        shutil.rmtree(out, ignore_errors=True)  # (an earlier build's must not ship)
        archs = _archs()
        if self.editable_mode or archs == []:
            return
        cmd = [sys.executable, "-m", "vbatch", "compile", "--nvcc", "--out", str(out),
               "--jobs", str(min(os.cpu_count() or 1, 32))]
        cmd += ["--arch", *archs] if archs else []
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(
            [str(lib)] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]))
        # (from the build folder: the checkout's own folders must not shadow the package)
        if subprocess.run(cmd, env=env, cwd=lib).returncode == 0:
            return
        if archs:  # (named: the build was asked for them)
            sys.exit("vbatch: compiling the CUDA kernels with nvcc failed (above). Set "
                     "VBATCH_CUDA_ARCHS=none to install without them: kernels then compile "
                     "through NVRTC on first use.")
        shutil.rmtree(out, ignore_errors=True)
        print("vbatch: WARNING: compiling the CUDA kernels with nvcc failed (above); installed "
              "without them, so kernels compile through NVRTC on first use", file=sys.stderr)


setup(cmdclass={"build_py": BuildWithKernels},
      setup_requires=_core_dependencies() if _archs() != [] else [])

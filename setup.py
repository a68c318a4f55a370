"""The build: setuptools, configured by pyproject.toml, and the CUDA kernels compiled into the
package where nvcc is present (``python -m vbatch compile --nvcc``: a cubin per kernel template,
type and architecture, in vbatch/kernels/bin), so that a fresh install's first call loads them
instead of compiling through NVRTC.

``VBATCH_CUDA_ARCHS`` names the architectures (by default those of
``vbatch.kernels.cuda_build.ARCHS`` that this nvcc knows); ``none`` builds none. An editable
install builds none: its kernels compile from the sources being edited.
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
        archs = _archs()
        if self.editable_mode or archs == []:
            return
        lib = Path(self.build_lib).resolve()
        cmd = [sys.executable, "-m", "vbatch", "compile", "--nvcc",
               "--out", str(lib / "vbatch" / "kernels" / "bin"), "--jobs", str(os.cpu_count() or 1)]
        cmd += ["--arch", *archs] if archs else []
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(
            [str(lib)] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]))
        # (from the build folder: the checkout's own folders must not shadow the package)
        if subprocess.run(cmd, env=env, cwd=lib).returncode:
            sys.exit("vbatch: compiling the CUDA kernels with nvcc failed (above). Set "
                     "VBATCH_CUDA_ARCHS=none to install without them: kernels then compile "
                     "through NVRTC on first use.")


setup(cmdclass={"build_py": BuildWithKernels},
      setup_requires=_core_dependencies() if _archs() != [] else [])

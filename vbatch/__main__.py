"""``python -m vbatch``: see :mod:`vbatch.runtime.cli`."""

from vbatch.runtime.cli import main

raise SystemExit(main(prog="python -m vbatch"))

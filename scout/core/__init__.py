"""Pure, deterministic core: no I/O, no clock, no threads, no torch, no mpi4py (docs/design.md §1).

Everything here must import with torch and mpi4py absent; ``tests/unit/test_import_purity.py``
proves it in a subprocess that blocks both.
"""

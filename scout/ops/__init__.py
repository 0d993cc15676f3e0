"""Operating scout on a cluster (spec/ops.md, docs/metrics.md): a per-node sidecar process that
serves Prometheus metrics and runs the ``on_report`` hook, the live page of ``scout serve``, and
the Slurm restart path (``scout slurm-requeue``).

Nothing here runs inside a trainer except :mod:`scout.ops.launch` (start the sidecar, write the
rank's small stats file); the sidecar and the page server import neither torch nor the user's
script.
"""

"""`vime submit` and its followers: one Slurm job (or a local twin) that brings up Ray on every
node and runs the runtime driver; `vime status / logs / cancel` follow it.

Nothing here is imported by `vime plan` or `vime compile`; submitit and ray are imported inside
the functions that need them (tests/test_cli.py checks `sys.modules`).
"""

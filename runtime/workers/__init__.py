"""The hosts of the backends and the groups that drive them: a Ray actor per training rank
and per engine (host.py), the groups of them (groups.py) and how they are built (build.py;
actors.py names all three), engines of several DP ranks (dp_engine.py), the engines'
supervisor (supervisor.py) and the choice of a weight-sync path (weight_sync.py). Imports the
backends (by name) and runtime/core/. runtime/README.md has the layers."""

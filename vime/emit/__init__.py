"""Stage 6, emit: pure functions from a plan to text (argument lists, sbatch, TOML, JSON)."""

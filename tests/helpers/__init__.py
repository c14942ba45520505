"""Test-only helpers, imported as ``helpers`` (pyproject.toml puts tests/ on pytest's sys.path).

The random checkpoints that ``blockbatch make-random`` writes are product code
(``blockbatch.random_checkpoint``); the random branch-state tables of the op tests live here
(``helpers.random_branch_state``; ``benchmarks/bench_gpu_step.py`` imports them from here too).
"""

"""Test-only helpers, imported as ``helpers`` (pyproject.toml puts tests/ on pytest's sys.path).

The random checkpoints and branch-state tables that ``blockbatch make-random`` and the benchmarks
also use are product code: ``blockbatch.random_checkpoint`` and ``blockbatch.random_branch_state``.
"""

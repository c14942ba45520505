import os

import pytest
import torch

# One intra-op thread: results do not depend on it (test_threads_do_not_change_results checks 2),
# and OpenMP spin-waits make multi-threaded runs crawl on a busy 2-core machine.
torch.set_num_threads(1)


@pytest.fixture
def make_ckpt(tmp_path):
    """Factory: write a random LLaDA checkpoint under tmp_path and return (path, config)."""
    from blockbatch.random_checkpoint import make_random_checkpoint

    counter = iter(range(10_000))

    def make(**kwargs):
        path = tmp_path / f"ckpt{next(counter)}"
        config = make_random_checkpoint(path, **kwargs)
        return str(path), config

    return make

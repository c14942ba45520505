"""CUDA compile-and-link check (no GPU needed): load the CUDA build of the extension with the CUDA
torch on this CPU machine and verify every op has CPU, CUDA and Meta kernels and runs on CPU.

    python .ci/check_cuda_build.py BUILD_LIB_DIR
"""

import glob
import os
import sys

import torch

OPS = ["forward", "decode", "rms_norm", "add_rms_norm_", "silu_mul", "linear", "rope_", "kv_write_", "packed_attention", "confidence",
       "sparse_probs", "commit_", "rope_kv_write_", "bb_absorb_", "bb_coordinate_", "kv_copy_rows_",
       "moe_experts"]


def main() -> int:
    lib_dir = sys.argv[1]
    so = glob.glob(os.path.join(lib_dir, "blockbatch", "_C*.so"))
    assert len(so) == 1, f"expected one extension in {lib_dir}/blockbatch, found {so}"
    assert torch.version.cuda, "this check needs a CUDA build of torch"
    torch.ops.load_library(so[0])
    for op in OPS:
        # decode's fake kernel is registered in Python (blockbatch/native.py): data-dependent shapes.
        for key in ("CPU", "CUDA") if op == "decode" else ("CPU", "CUDA", "Meta"):
            assert torch._C._dispatch_has_kernel_for_dispatch_key(f"blockbatch::{op}", key), (op, key)
    x = torch.randn(4, 8)
    out = torch.ops.blockbatch.rms_norm(x, torch.ones(8), 1e-5)
    expected = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-5)
    torch.testing.assert_close(out, expected)
    torch.library.opcheck(torch.ops.blockbatch.confidence.default, (torch.randn(3, 20),))
    print(f"CUDA build OK: {so[0]} (torch {torch.__version__}, CUDA {torch.version.cuda}); "
          f"{len(OPS)} ops with CPU and CUDA kernels (and Meta where shapes are static); CPU path runs")
    return 0


if __name__ == "__main__":
    sys.exit(main())

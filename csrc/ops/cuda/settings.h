// The BLOCKBATCH_* settings of the CUDA ops: which kernel variant, split count or mode an op
// uses. Each is read from its environment variable when the op runs (so one process can time
// every choice), with the defaults of settings.cpp; python/blockbatch/settings.py is the table of
// every variable, and tests/tools/test_settings.py checks settings.cpp against it.
#pragma once

namespace blockbatch::cuda_ops {

// Key splits of a tensor-core attention launch: `heuristic`, or BLOCKBATCH_ATTN_SPLITS when set.
int attention_splits(int heuristic);
// The tensor-core attention variant (BLOCKBATCH_ATTN_KERNEL): 1 sync, 2 pipelined, 3 pipelined3.
int attention_variant();
// rope_kv_write_'s 16-byte kernel (BLOCKBATCH_ROPE_KERNEL = vec).
bool rope_vectorized();
// BLOCKBATCH_CUDA_BATCHING: whether the batching scheduler takes a CUDA model (default "graphs"): 0 no,
// 1 eager packed steps, 2 ("graphs") padded packed steps replayed from CUDA graphs.
int cuda_batching();
// BLOCKBATCH_BATCH_INVARIANT: GEMMs in fixed-size row chunks and unsplit attention, so a row's
// logits do not depend on what shares its forward.
bool batch_invariant();
// BLOCKBATCH_MOE_KERNEL = fused: moe_experts runs kernels/cuda/moe.cu (the router's choices stay on
// the device) instead of one GEMM per active expert.
bool moe_fused();

}  // namespace blockbatch::cuda_ops

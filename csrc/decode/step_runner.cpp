#include "decode/step_runner.h"

#include <ATen/ops/from_blob.h>

#include <array>
#include <map>

#include "decode/step.h"  // read_back, pack_readout, unpack_readout

#ifdef BLOCKBATCH_WITH_CUDA
#include <ATen/ops/empty.h>
#include <ATen/cuda/CUDAGraph.h>
#include <c10/cuda/CUDAException.h>
#include <cuda_runtime_api.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>

#include "decode/cuda_streams.h"
#endif

namespace blockbatch {

#ifdef BLOCKBATCH_WITH_CUDA
// All of a request's device work runs on one side stream (graphs cannot be captured on the
// default stream), which first waits for the caller's stream and is drained before the caller
// gets its stream back. Graphs share one memory pool: they replay one after another.
struct StepRunner::Graphs {
  using Key = StepRunner::Key;
  struct Entry {
    int64_t seen = 0;
    std::unique_ptr<at::cuda::CUDAGraph> graph;
    at::Tensor input;              // static device copy of the packed index buffer
    at::Tensor logits, flat;       // graph outputs: the logits and the packed readout
    std::vector<at::Tensor> like;  // dtypes / shapes of the readout tensors
  };
  c10::cuda::CUDAStream stream;
  c10::cuda::CUDAStreamGuard guard;
  decltype(at::cuda::graph_pool_handle()) pool;
  std::map<Key, Entry> entries;

  explicit Graphs(c10::Device device)
      : stream(c10::cuda::getStreamFromPool(false, device.index())),
        guard(wait_then(c10::cuda::getCurrentCUDAStream(device.index()), stream)), pool(at::cuda::graph_pool_handle()) {
  }
  ~Graphs() {
    stream.synchronize();  // no replay may still run when the graphs and their pool are released
    entries.clear();
  }
  // `side` waits for the work queued so far on `caller` (decode/cuda_streams.h).
  static c10::cuda::CUDAStream wait_then(c10::cuda::CUDAStream caller, c10::cuda::CUDAStream side) {
    stream_wait(side, caller);
    return side;
  }
};
#else
struct StepRunner::Graphs {};
#endif

StepRunner::StepRunner(const Network& model, bool use_graphs) : model_(model) {
#ifdef BLOCKBATCH_WITH_CUDA
  if (use_graphs && model.capturable() && model.device().is_cuda()) graphs_ = std::make_unique<Graphs>(model.device());
#else
  (void)use_graphs;
#endif
}

StepRunner::~StepRunner() = default;

StepRunner::Output StepRunner::run(const std::vector<int64_t>& buffer, const Key& key, const Step& step) {
  const at::Tensor host_t =
      at::from_blob(const_cast<int64_t*>(buffer.data()), {static_cast<int64_t>(buffer.size())}, at::kLong);
#ifdef BLOCKBATCH_WITH_CUDA
  if (graphs_) {
    Graphs::Entry& e = graphs_->entries[key];
    e.seen += 1;
    if (!e.graph && e.seen >= 2) {  // the first run of this shape (eager, below) warmed everything up
      // Capture records, it does not run: the input is filled before each replay, below.
      e.input = at::empty({host_t.numel()}, host_t.options().device(model_.device()));
      e.graph = std::make_unique<at::cuda::CUDAGraph>();
      e.graph->capture_begin(graphs_->pool);
      Body body = step(e.input);
      e.logits = body.logits;
      e.like = body.readout;
      e.flat = pack_readout(e.like);
      e.graph->capture_end();
      ++captures_;
    }
    if (e.graph) {
      e.input.copy_(host_t);  // the step's indices into the graph's static input
      e.graph->replay();
      ++replays_;
      return {e.logits, unpack_readout(e.flat.cpu(), e.like)};
    }
  }
#endif
  Body body = step(host_t.to(model_.device(), /*non_blocking=*/false, /*copy=*/true));
  return {body.logits, read_back(body.readout)};
}

}  // namespace blockbatch

// BlockBatch branch bookkeeping (ALGORITHMS.md section 4) on the device holding the canvases:
// what a forward's logits do to each branch it covered (absorb: probability map, threshold
// commit, EOS readiness) and the coordination between forwards (advance, merge, sync, the
// periodic refresh decision). The host only reads back the small state table afterwards.
//
// One source for both backends: every function is a template over an executor `Ex`.
//   SerialExec (below; the CPU ops): plain loops.
//   BlockExec (kernels/cuda/branches.cu): one CUDA thread block; for_each / reduce / count
//   stride over the threads, `once` runs on thread 0, and each ends with __syncthreads().
// So the CPU tests of the decode loop check the very code the GPU runs. Rules for the code here:
// every thread takes the same branches (decisions come from reductions or from memory read
// after a barrier); state is written only inside `once`, or by `for_each` / `count` at the
// element the index owns; a `count` body may write its own element and nothing another index reads.
#pragma once

#include <cmath>
#include <cstdint>

#include "kernels/cpu/kernels.h"  // BLOCKBATCH_HOST_DEVICE

namespace blockbatch::branches {

constexpr int64_t kMaxBranches = 16;  // DecodeOptions caps block_sizes at 16

// Columns of the int64 [B, kFields] branch-state table (rows = branches by ascending block size).
enum Field : int64_t {
  kBlock,  // block size
  kStart,  // current window [start, end); L when done
  kEnd,
  kDecoded,  // tokens committed by its forwards or received by sync
  kDone,
  kSinceRefresh,  // blocks advanced since its last full forward (frontier_clock: frontier tokens)
  kNeedsRefresh,
  kEosReady,   // its window is complete and holds EOS (eos_prob[b] = the probability it gave it)
  kMasks,      // masks left in its window (0 when done)
  kCommitted,  // stats: tokens committed, merged in, copied by sync
  kMerged,
  kCopied,
  kFrontier,  // first masked generated position - lp (G, or first EOS + 1 with eos_cut, when done)
  kFields
};
// int64 [kFlags] written by coordinate.
enum Flag : int64_t { kRefreshWanted, kEarlyExit, kFlags };
// Rows of the int64 [S, kSpanFields] span table: one per branch covered by a forward.
enum SpanField : int64_t {
  kSpanRow,       // branch (canvas row, KV row)
  kSpanLogitRow,  // logits row of position first_pos
  kSpanFirstPos,  // canvas position of that row
  kSpanRows,      // logits rows recorded into the probability map (first_pos ...)
  kSpanFull,      // 1: a full forward (init / refresh): resets the refresh counters
  kSpanFields
};

// Device (or host) pointers of one request's bookkeeping tensors.
struct View {
  int64_t* canvas;    // [B, L]
  int64_t* state;     // [B, kFields]
  double* eos_prob;   // [B]
  int64_t* map_ids;   // [B, L - lp, K]: tokens with probability > floor (-1: none)
  double* map_probs;  // [B, L - lp, K]
  int64_t B, L, lp, K, mask_id, eos_id;

  BLOCKBATCH_HOST_DEVICE int64_t* st(int64_t b) const { return state + b * kFields; }
  BLOCKBATCH_HOST_DEVICE int64_t* row(int64_t b) const { return canvas + b * L; }
  BLOCKBATCH_HOST_DEVICE int64_t entry(int64_t b, int64_t pos) const { return (b * (L - lp) + pos - lp) * K; }
};

// The family rules the bookkeeping reads (decode/ maps FamilyRules::map and gate_inclusive onto
// them). The device ops (bb_absorb_, bb_coordinate_) run the defaults, LLaDA's; Dream's map and
// gate run on the serial executor on the host (decode/policies/blockbatch.cpp, HostBranches).
enum class MapMode : int64_t {
  kReplace,     // a span's rows replace the entries of their positions
  kAccumulate,  // each id is written over its token's slot or into a free one, until the entry is cleared
};

struct AbsorbParams {
  double threshold;
  bool stop_on_eos;
  int64_t rows;  // logits rows of the forward (spans must stay inside them)
};

struct CoordinateParams {
  double merge_gate;
  bool merge, sync;
  int64_t sync_gap, refresh_tokens;
  bool periodic_refresh;
  bool gate_inclusive = false;  // a merge writes a token its map rates >= merge_gate (else >)
  // Dream's window and clock rules (decode/policies/blockbatch.cpp, HostBranches); the defaults are LLaDA's.
  bool eos_cut = false;           // a row's generation ends at its first eos_id (windows, done, decoded)
  bool recount = false;           // decoded = the row's non-mask generated tokens up to the cut (merged ones count)
  bool frontier_clock = false;    // since_refresh grows by the frontier's movement (tokens), not 1 per block
  bool merge_own_window = false;  // a merge scans the destination's window (else its sources'), and a
                                  // destination that received tokens advances (else: once its window is complete)
  bool sync_copies_map = false;   // a sync also copies since_refresh and the map, and counts the tokens it
                                  // changed (else: the leader's lead in decoded)
};

BLOCKBATCH_HOST_DEVICE inline bool passes_gate(double p, const CoordinateParams& c) {
  return c.gate_inclusive ? p >= c.merge_gate : p > c.merge_gate;
}

struct Min {
  template <typename V>
  BLOCKBATCH_HOST_DEVICE V operator()(V a, V b) const {
    return b < a ? b : a;
  }
};
struct Max {
  template <typename V>
  BLOCKBATCH_HOST_DEVICE V operator()(V a, V b) const {
    return a < b ? b : a;
  }
};
struct Sum {
  template <typename V>
  BLOCKBATCH_HOST_DEVICE V operator()(V a, V b) const {
    return a + b;
  }
};
// The most confident candidate; the lowest index on ties (associative and commutative).
struct Best {
  double conf;
  int64_t index;
};
struct BestOp {
  BLOCKBATCH_HOST_DEVICE Best operator()(Best a, Best b) const {
    return (b.conf > a.conf || (b.conf == a.conf && b.index < a.index)) ? b : a;
  }
};

struct SerialExec {
  template <typename F>
  void for_each(int64_t n, F&& f) const {
    for (int64_t i = 0; i < n; ++i) f(i);
  }
  template <typename V, typename F, typename Op>
  V reduce(int64_t n, V init, F&& f, Op op) const {
    V acc = init;
    for (int64_t i = 0; i < n; ++i) acc = op(acc, f(i));
    return acc;
  }
  template <typename F>
  int64_t count(int64_t n, F&& f) const {
    int64_t c = 0;
    for (int64_t i = 0; i < n; ++i) c += f(i) ? 1 : 0;
    return c;
  }
  template <typename F>
  void once(F&& f) const {
    f();
  }
};

// ------------------------------------------------------------------------------ input guards
// The host checks these before a CPU op runs (ops/cpu/branches.cpp names what is wrong); the
// GPU kernels cannot read the device state table without a sync, so they check it here, in the
// shared code, and skip what is out of bounds: nothing is ever written outside the tensors.

// Token counts in the state table stay far from int64 overflow (their sums and differences).
constexpr int64_t kMaxCount = int64_t(1) << 40;
BLOCKBATCH_HOST_DEVICE inline bool counts_ok(const View& v, int64_t b) {
  const int64_t* st = v.st(b);
  const Field fields[] = {kDecoded, kSinceRefresh, kCommitted, kMerged, kCopied};
  for (int i = 0; i < 5; ++i) {
    if (st[fields[i]] < 0 || st[fields[i]] > kMaxCount) return false;
  }
  return true;
}
// Branch b's block size divides the generation (so every window it snaps to stays inside it),
// its window is inside the generation and its counts are in range.
BLOCKBATCH_HOST_DEVICE inline bool window_ok(const View& v, int64_t b) {
  const int64_t* st = v.st(b);
  if (st[kBlock] <= 0 || (v.L - v.lp) % st[kBlock] != 0 || !counts_ok(v, b)) return false;
  if (st[kDone]) return true;  // a done branch's window is never read
  return st[kStart] >= v.lp && st[kStart] <= st[kEnd] && st[kEnd] <= v.L;
}
BLOCKBATCH_HOST_DEVICE inline bool state_ok(const View& v) {
  for (int64_t b = 0; b < v.B; ++b) {
    if (!window_ok(v, b)) return false;
  }
  return true;
}
// Span `sp` names a branch row, lies inside the canvas and the logits, and covers the branch's
// window (rows = the forward's logits rows).
BLOCKBATCH_HOST_DEVICE inline bool span_ok(const View& v, const int64_t* sp, int64_t rows) {
  const int64_t b = sp[kSpanRow], lrow = sp[kSpanLogitRow], pos0 = sp[kSpanFirstPos], n = sp[kSpanRows];
  if (b < 0 || b >= v.B || !window_ok(v, b) || v.st(b)[kDone]) return false;
  const int64_t s = v.st(b)[kStart], e = v.st(b)[kEnd];
  return pos0 >= v.lp && n >= 0 && n <= v.L - pos0 && lrow >= 0 && lrow <= rows && n <= rows - lrow && s >= pos0 &&
         e - pos0 <= rows - lrow;
}

// ------------------------------------------------------------------------------ window helpers

template <typename Ex>
BLOCKBATCH_HOST_DEVICE int64_t masks_in(const Ex& ex, const View& v, int64_t b, int64_t s, int64_t e) {
  const int64_t* x = v.row(b);
  return ex.reduce(e - s, int64_t(0), [&](int64_t i) { return int64_t(x[s + i] == v.mask_id); }, Sum{});
}

// Window = the block of the branch's own size holding its first masked generated position (with
// eos_cut: the first before the row's first EOS, the window's end clipped there). No such mask: done.
// Where row b's generation ends: its first EOS with eos_cut, else L.
template <typename Ex>
BLOCKBATCH_HOST_DEVICE int64_t eos_cut(const Ex& ex, const View& v, int64_t b, const CoordinateParams& p) {
  const int64_t* x = v.row(b);
  return p.eos_cut ? ex.reduce(
                         v.L - v.lp, v.L, [&](int64_t i) { return x[v.lp + i] == v.eos_id ? v.lp + i : v.L; }, Min{})
                   : v.L;
}

template <typename Ex>
BLOCKBATCH_HOST_DEVICE void snap_window(const Ex& ex, const View& v, int64_t b, const CoordinateParams& p) {
  const int64_t* x = v.row(b);
  const int64_t cut = eos_cut(ex, v, b, p);
  const int64_t first =
      ex.reduce(cut - v.lp, v.L, [&](int64_t i) { return x[v.lp + i] == v.mask_id ? v.lp + i : v.L; }, Min{});
  const int64_t upto = cut < v.L ? cut + 1 : v.L;  // the generation, its EOS included
  const int64_t decoded = p.recount ? ex.count(upto - v.lp, [&](int64_t i) { return x[v.lp + i] != v.mask_id; }) : 0;
  ex.once([&] {
    int64_t* st = v.st(b);
    if (p.recount) st[kDecoded] = decoded;
    st[kFrontier] = (first == v.L ? upto : first) - v.lp;
    if (first == v.L) {
      st[kDone] = 1;
      st[kStart] = st[kEnd] = v.L;
    } else {
      st[kStart] = v.lp + (first - v.lp) / st[kBlock] * st[kBlock];
      st[kEnd] = st[kStart] + st[kBlock] < cut ? st[kStart] + st[kBlock] : cut;
    }
  });
}

// Re-snaps after the branch's own commit, seed or merge, and moves its refresh clock.
template <typename Ex>
BLOCKBATCH_HOST_DEVICE void advance(const Ex& ex, const View& v, int64_t b, const CoordinateParams& p) {
  const int64_t from = v.st(b)[kFrontier];
  snap_window(ex, v, b, p);
  ex.once([&] {
    int64_t* st = v.st(b);
    if (p.frontier_clock) st[kSinceRefresh] += st[kFrontier] > from ? st[kFrontier] - from : 0;
    if (st[kDone] || p.frontier_clock) return;
    st[kSinceRefresh] += 1;
    if (p.refresh_tokens > 0 && p.periodic_refresh && st[kSinceRefresh] * st[kBlock] >= p.refresh_tokens) {
      st[kNeedsRefresh] = 1;
    }
  });
}

template <typename Ex>
BLOCKBATCH_HOST_DEVICE void update_masks(const Ex& ex, const View& v, int64_t b) {
  const int64_t m = v.st(b)[kDone] ? 0 : masks_in(ex, v, b, v.st(b)[kStart], v.st(b)[kEnd]);
  ex.once([&] { v.st(b)[kMasks] = m; });
}

// ------------------------------------------------------------------------------------- absorb

// Records `n` rows of `Ks` ids (-1: none) and probabilities as the map entries of branch b's
// positions pos0 ... kReplace (Ks = v.K): each row replaces its entry. kAccumulate: each id goes
// over its token's slot or into a free one; returns whether some entry was full (the host grows
// the map and records again, which rewrites what the first pass wrote).
template <typename Ex>
BLOCKBATCH_HOST_DEVICE bool record_map(const Ex& ex, const View& v, int64_t b, int64_t pos0, int64_t n,
                                       const int64_t* ids, const double* probs, int64_t Ks, MapMode mode) {
  const int64_t K = v.K;
  if (mode == MapMode::kReplace) {
    ex.for_each(n * K, [&](int64_t i) {
      v.map_ids[v.entry(b, pos0 + i / K) + i % K] = ids[i];
      v.map_probs[v.entry(b, pos0 + i / K) + i % K] = probs[i];
    });
    return false;
  }
  return ex.count(n, [&](int64_t i) {
    const int64_t e = v.entry(b, pos0 + i);
    bool full = false;
    for (int64_t k = 0; k < Ks; ++k) {
      const int64_t id = ids[i * Ks + k];
      if (id < 0) continue;
      int64_t at = 0;  // occupied slots are a prefix of the entry
      while (at < K && v.map_ids[e + at] != id && v.map_ids[e + at] >= 0) ++at;
      full = full || at == K;
      if (at == K) continue;
      v.map_ids[e + at] = id;
      v.map_probs[e + at] = probs[i * Ks + k];
    }
    return full;
  }) != 0;
}

// Softmax probability (float64) of `token` in logits row `row`; logit(row, j) reads one logit
// as double (the backend converts its storage type).
template <typename Ex, typename Logit>
BLOCKBATCH_HOST_DEVICE double softmax_at(const Ex& ex, const Logit& logit, int64_t row, int64_t vocab, int64_t token) {
  const double m = ex.reduce(vocab, static_cast<double>(-INFINITY), [&](int64_t j) { return logit(row, j); }, Max{});
  const double s = ex.reduce(vocab, 0.0, [&](int64_t j) { return exp(logit(row, j) - m); }, Sum{});
  return exp(logit(row, token) - m) / s;
}

// Span `sp` of a forward: record its probability rows, commit by threshold inside the branch's
// window from the window's proposals (token / conf per logits row), update the counters, and on a
// block step mark the branch EOS-ready when its window is complete and holds EOS.
template <typename Ex, typename Logit>
BLOCKBATCH_HOST_DEVICE void absorb_span(const Ex& ex, const View& v, const int64_t* sp, const int64_t* token,
                                        const double* conf, const int64_t* ids, const double* probs, const Logit& logit,
                                        int64_t vocab, const AbsorbParams& p) {
  if (!span_ok(v, sp, p.rows)) return;  // every thread reads the same state: all return together
  const int64_t b = sp[kSpanRow], lrow = sp[kSpanLogitRow], pos0 = sp[kSpanFirstPos];
  record_map(ex, v, b, pos0, sp[kSpanRows], ids + lrow * v.K, probs + lrow * v.K, v.K, MapMode::kReplace);
  const int64_t s = v.st(b)[kStart], n = v.st(b)[kEnd] - s, wrow = lrow + s - pos0;
  int64_t* x = v.row(b) + s;
  const Best best = ex.reduce(
      n, Best{-INFINITY, n},
      [&](int64_t i) { return x[i] == v.mask_id ? Best{conf[wrow + i], i} : Best{-INFINITY, n}; }, BestOp{});
  // Every candidate with conf >= tau, plus the most confident one (none when no candidate).
  const int64_t k = best.index == n ? 0 : ex.count(n, [&](int64_t i) {
    if (x[i] != v.mask_id || !(conf[wrow + i] >= p.threshold || i == best.index)) return false;
    x[i] = token[wrow + i];
    return true;
  });
  const int64_t left = masks_in(ex, v, b, s, s + n);
  const bool full = sp[kSpanFull] != 0;
  ex.once([&] {
    int64_t* st = v.st(b);
    st[kDecoded] += k;
    st[kCommitted] += k;
    st[kMasks] = left;
    if (full) st[kSinceRefresh] = st[kNeedsRefresh] = 0;
  });
  if (full || !p.stop_on_eos || left != 0 || v.eos_id < 0 || v.eos_id >= vocab) return;
  const int64_t first = ex.reduce(n, n, [&](int64_t i) { return x[i] == v.eos_id ? i : n; }, Min{});
  if (first == n) return;
  const double prob = softmax_at(ex, logit, wrow + first, vocab, v.eos_id);
  ex.once([&] {
    v.st(b)[kEosReady] = 1;
    v.eos_prob[b] = prob;
  });
}

// --------------------------------------------------------------------------------- coordinate

// Most decoded, done branches included; the first (smallest block size) on ties. Every thread
// computes it alike from the state table.
BLOCKBATCH_HOST_DEVICE inline int64_t leader(const View& v) {
  int64_t best = 0;
  for (int64_t b = 1; b < v.B; ++b) {
    if (v.st(b)[kDecoded] > v.st(best)[kDecoded]) best = b;
  }
  return best;
}

// Probability the destination's map gives `token` (a real id) at `pos`: 0 when absent.
BLOCKBATCH_HOST_DEVICE inline double map_prob(const View& v, int64_t dst, int64_t pos, int64_t token) {
  const int64_t e = v.entry(dst, pos);
  for (int64_t k = 0; k < v.K; ++k) {
    if (v.map_ids[e + k] == token) return v.map_probs[e + k];
  }
  return 0.0;
}
// Whether the map holds any token at `pos` (ids are padded with -1 anywhere in the entry).
BLOCKBATCH_HOST_DEVICE inline bool map_empty(const View& v, int64_t dst, int64_t pos) {
  const int64_t e = v.entry(dst, pos);
  for (int64_t k = 0; k < v.K; ++k) {
    if (v.map_ids[e + k] >= 0) return false;
  }
  return true;
}

// Whether rows a and c hold different tokens at one of the first n generated positions where both
// hold one (merge compatibility; n < G: compared up to EOS cuts).
template <typename Ex>
BLOCKBATCH_HOST_DEVICE bool clash(const Ex& ex, const View& v, int64_t a, int64_t c, int64_t n) {
  const int64_t *x = v.row(a) + v.lp, *y = v.row(c) + v.lp;
  return ex.reduce(
             n, int64_t(0), [&](int64_t q) { return int64_t(x[q] != v.mask_id && y[q] != v.mask_id && x[q] != y[q]); },
             Max{}) != 0;
}

// Confidence-gated merging (ALGORITHMS.md 4, step 4).
template <typename Ex>
BLOCKBATCH_HOST_DEVICE void merge_step(const Ex& ex, const View& v, const CoordinateParams& p) {
  int64_t order[kMaxBranches];
  int64_t n = 0;
  for (int64_t b = 0; b < v.B; ++b) {  // active, by window end descending (stable insertion)
    if (v.st(b)[kDone]) continue;
    int64_t j = n++;
    for (; j > 0 && v.st(order[j - 1])[kEnd] < v.st(b)[kEnd]; --j) order[j] = order[j - 1];
    order[j] = b;
  }
  for (int64_t i = 0; i < n; ++i) {
    const int64_t dst = order[i], dcut = eos_cut(ex, v, dst, p);
    int64_t src[kMaxBranches], scut[kMaxBranches];  // kept sources and their EOS cuts
    int64_t ns = 0;
    for (int64_t j = i + 1; j < n; ++j) {  // compared up to both EOS cuts, EOS included
      const int64_t c = eos_cut(ex, v, order[j], p), m = dcut < c ? dcut : c;
      if (!clash(ex, v, dst, order[j], (m < v.L ? m + 1 : v.L) - v.lp)) src[ns] = order[j], scut[ns++] = c;
    }
    if (ns == 0) continue;
    int64_t* x = v.row(dst);
    const int64_t ds = v.st(dst)[kStart], de = v.st(dst)[kEnd] < dcut ? v.st(dst)[kEnd] : dcut;
    const int64_t filled = ex.count(v.L - v.lp, [&](int64_t q) {
      const int64_t pos = v.lp + q;
      bool covered = p.merge_own_window && ds <= pos && pos < de;
      for (int64_t j = 0; j < ns && !p.merge_own_window; ++j) {
        covered = covered || (v.st(src[j])[kStart] <= pos && pos < v.st(src[j])[kEnd]);
      }
      if (!covered || x[pos] != v.mask_id || map_empty(v, dst, pos)) return false;
      int64_t best_tok = v.mask_id;
      double best_p = 0.0;
      for (int64_t j = 0; j < ns; ++j) {
        if (pos > scut[j]) continue;  // past the source's EOS
        const int64_t tok = v.row(src[j])[pos];
        if (tok == v.mask_id) continue;
        const double pr = map_prob(v, dst, pos, tok);
        if (pr > best_p) {
          best_tok = tok;
          best_p = pr;
        }
      }
      if (!passes_gate(best_p, p) || best_tok == v.mask_id) return false;
      x[pos] = best_tok;
      return true;
    });
    ex.once([&] { v.st(dst)[kMerged] += filled; });
    if (filled && (p.merge_own_window || masks_in(ex, v, dst, v.st(dst)[kStart], v.st(dst)[kEnd]) == 0)) {
      advance(ex, v, dst, p);
    }
  }
}

// Leader sync (step 5): lagging branches copy the leader's canvas row (sync_src[b] = leader: the
// caller copies the KV row), take its `decoded` and `done`, and re-snap with their own block size.
template <typename Ex>
BLOCKBATCH_HOST_DEVICE void sync_step(const Ex& ex, const View& v, int64_t* sync_src, const CoordinateParams& p) {
  const int64_t lead = leader(v);
  for (int64_t b = 0; b < v.B; ++b) {
    if (b == lead || v.st(b)[kDone] || v.st(lead)[kDecoded] - v.st(b)[kDecoded] <= p.sync_gap) continue;
    const int64_t* from = v.row(lead);
    int64_t* to = v.row(b);
    const int64_t changed =
        p.sync_copies_map ? ex.count(v.L, [&](int64_t t) { return to[t] != from[t] && from[t] != v.mask_id; }) : 0;
    ex.for_each(v.L, [&](int64_t t) { to[t] = from[t]; });
    const int64_t ms = v.entry(lead, v.lp), md = v.entry(b, v.lp);
    ex.for_each(p.sync_copies_map ? (v.L - v.lp) * v.K : 0, [&](int64_t i) {
      v.map_ids[md + i] = v.map_ids[ms + i];
      v.map_probs[md + i] = v.map_probs[ms + i];
    });
    ex.once([&] {
      int64_t *st = v.st(b), *ld = v.st(lead);
      st[kCopied] += p.sync_copies_map ? changed : ld[kDecoded] > st[kDecoded] ? ld[kDecoded] - st[kDecoded] : 0;
      if (p.sync_copies_map) st[kSinceRefresh] = ld[kSinceRefresh];
      st[kDecoded] = ld[kDecoded];
      st[kDone] = ld[kDone];
      sync_src[b] = lead;
    });
    snap_window(ex, v, b, p);
  }
}

// Steps 3-5 after a forward (advance, merge, sync) and the periodic refresh decision. Nothing
// changes when a branch is EOS-ready: the host returns that branch's canvas (early exit).
template <typename Ex>
BLOCKBATCH_HOST_DEVICE void coordinate(const Ex& ex, const View& v, int64_t* flags, int64_t* sync_src,
                                       const CoordinateParams& p) {
  const bool ok = state_ok(v);  // the host checks it (CPU ops); a bad table changes nothing
  bool eos_ready = false;
  for (int64_t b = 0; b < v.B; ++b) eos_ready = eos_ready || v.st(b)[kEosReady];
  ex.once([&] {
    for (int64_t b = 0; b < v.B; ++b) sync_src[b] = -1;
    flags[kEarlyExit] = ok && eos_ready;
    flags[kRefreshWanted] = 0;
  });
  if (!ok || eos_ready) return;
  for (int64_t b = 0; b < v.B; ++b) {
    if (!v.st(b)[kDone] && masks_in(ex, v, b, v.st(b)[kStart], v.st(b)[kEnd]) == 0) advance(ex, v, b, p);
  }
  if (v.st(leader(v))[kDecoded] > 0) {
    if (p.merge) merge_step(ex, v, p);
    if (p.sync) sync_step(ex, v, sync_src, p);
  }
  for (int64_t b = 0; b < v.B; ++b) update_masks(ex, v, b);
  ex.once([&] {
    for (int64_t b = 0; b < v.B; ++b) {
      if (!v.st(b)[kDone] && v.st(b)[kNeedsRefresh]) flags[kRefreshWanted] = 1;
    }
  });
}

}  // namespace blockbatch::branches

// Measuring the step-time curve (decode/budget.h) that branch_budget = auto requests are budgeted by.
#pragma once

#include "decode/budget.h"
#include "model/network.h"

namespace blockbatch {

// Measures the curve on `model`: forwards of T = 16, 32, 64, ... query tokens (rows of up to 128
// tokens, full mode, logits for every token as a block step has), the median of 3 after a
// warm-up, doubling T until one forward takes more than limit_s / 8, T reaches 4096 or limit_s
// is spent.
StepCurve measure_step_curve(const Network& model, double limit_s);

}  // namespace blockbatch

// The fused ops (ort_ops/specs/fused.py) as plain functions over pointers and shapes: chains of the
// family's ops computed in one pass over memory, with each op's own per-element arithmetic (the
// TFOPS_HD functions of batch_norm.h and fake_quant.h) in the chain's order, so that a fused node gives
// the bits of the nodes it replaces (where two NaNs meet in the batch norm, which one survives follows
// the batch-norm ops' any-NaN rule, docs/semantics.md 4a.3). The CPU kernels are in fused.cc, the CUDA
// ones in cuda/fused.cu.
#pragma once

#include <cstdint>

#include "kernels/batch_norm.h"
#include "kernels/device.h"
#include "kernels/fake_quant.h"
#include "kernels/parallel.h"

namespace tfops {
namespace fused {

// The quantizer at the end of a chain, from its scalar (min, max) and bits.
struct FakeQuantStep {
  FakeQuantGrid grid{};
  bool use_division = true;   // FakeQuantWithMinMaxVars divides by the grid step; Args multiplies
  bool zero_output = false;   // Vars with min == max == 0: TF skips the nudge and writes zeros
};

// The step of FakeQuantWithMinMaxArgs (`args`: its range check, OpError with TF's message) or of
// FakeQuantWithMinMaxVars. Call it on a thread in TF's denormal mode (the adapters' Compute is).
FakeQuantStep MakeFakeQuantStep(bool args, float min, float max, const FakeQuantBits& bits);

// clip_min <= clip_max, neither NaN (OpError otherwise).
void CheckClipBounds(float clip_min, float clip_max);

// ONNX Runtime's Clip on its CPU (Eigen's cwiseMax(lo).cwiseMin(hi), std::max/std::min): a NaN v stays
// v, and so does a v equal to a bound (a -0 against a +0 bound keeps its sign). Selections only.
TFOPS_HD inline float ClipValue(float v, float lo, float hi) {
  const float c = v < lo ? lo : v;
  return hi < c ? hi : c;
}

// One element of FusedBatchNormClipFakeQuant: batch_norm::Normalize, ClipValue, then the quantizer's
// forward (FakeQuantDivide for Vars, FakeQuantMultiply for Args).
template <bool kDivide, class Ops = FakeQuantHardwareOps>
TFOPS_HD inline float BatchNormClipFakeQuantElement(float x, float mean, float k, float offset, float clip_lo,
                                                    float clip_hi, const FakeQuantGrid& g) {
  const float v = ClipValue(batch_norm::Normalize(x, mean, k, offset), clip_lo, clip_hi);
  return kDivide ? FakeQuantDivide<Ops>(v, g.nudged_min, g.nudged_max, g.scale, g.quant_zero)
                 : FakeQuantMultiply<Ops>(v, g.nudged_min, g.nudged_max, g.inv_scale, g.quant_zero, g.scale);
}

// FusedBatchNormClipFakeQuant on x viewed as layout `l` (batch_norm::CheckForward's, inference mode).
void BatchNormClipFakeQuantForward(const batch_norm::Layout& l, const float* x, const float* scale,
                                   const float* offset, const float* mean, const float* variance, float epsilon,
                                   float clip_min, float clip_max, const FakeQuantStep& step, float* y,
                                   const Parallel& par);

}  // namespace fused
}  // namespace tfops

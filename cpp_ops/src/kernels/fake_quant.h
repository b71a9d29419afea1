// FakeQuantWithMinMax{Args,Vars,VarsPerChannel} and their gradients as plain functions over float
// buffers, reproducing TensorFlow's CPU kernels bit for bit (docs/semantics.md section 1).
// No ONNX Runtime types here. The checks at the end (fake_quant_checks.cc) throw OpError with TF's
// messages; the adapters in cpp_ops/src/ort/fake_quant_ops.cc call them before any kernel.
//
// The per-element arithmetic (the nudge of a range, the quantize-dequantize of one value, the
// gradient mask and the summed terms) is in the TFOPS_HD functions below, which the CPU loops
// (fake_quant.cc) and the CUDA kernels (cuda/fake_quant.cu) both call. They assume TF's
// flush-to-zero/denormals-are-zero mode: on the CPU the caller holds ScopedFlushDenormals, on the
// GPU the .cu files are compiled with -ftz=true (every float32 add, multiply, divide, compare and
// floor then flushes subnormal operands and results the same way).
#pragma once

#include <math.h>

#include <cmath>
#include <cstdint>
#include <vector>

#include "kernels/device.h"
#include "kernels/eigen_sum.h"
#include "kernels/op_error.h"
#include "kernels/parallel.h"

namespace tfops {

// The nudged quantization grid for one (min, max) pair.
struct FakeQuantGrid {
  float nudged_min;
  float nudged_max;
  float scale;       // grid step
  float inv_scale;   // (qmax - qmin) / (max - min), computed on its own (not 1 / scale)
  float quant_zero;  // the grid index of 0, as TF computes it from the nudged range
};

// ---------------------------------------------------------------- shared per-element arithmetic

constexpr float kFakeQuantFloatMin = 1.17549435e-38f;  // FLT_MIN, the smallest normal float

// The float operations of the formulas below (kernels/eigen_sum.h): the hardware's, or the same with
// x86's NaN results spelled out. The CUDA kernels recompute an element whose result is NaN with
// FakeQuantX86Ops, so that NaN outputs carry the CPU kernel's bits. On x86 the two equal each other
// bit for bit except where an operation meets two NaNs and the compiler swapped its operands; that
// happens only with a grid that holds a NaN, and the CPU kernels compute those grids with
// FakeQuantX86Ops too (fake_quant.cc, ForwardNanGrid).
using FakeQuantHardwareOps = float_ops::Hardware;
using FakeQuantX86Ops = float_ops::X86;
TFOPS_HD inline bool FakeQuantIsNan(float v) { return float_ops::IsNan(v); }

// A subnormal as the signed zero flush-to-zero makes of it; other values unchanged (NaNs keep their
// bits). For results a compiler may produce without an arithmetic instruction (g * 1 folded to g),
// where the FTZ mode cannot act.
TFOPS_HD inline float FakeQuantFlush(float v) { return fabsf(v) < kFakeQuantFloatMin ? copysignf(0.0f, v) : v; }

// Whether a nudged grid holds a NaN (from a NaN or infinite range): the one case where an operation of
// the forward can meet two NaNs, so the CPU kernels then compute with FakeQuantX86Ops (fake_quant.cc).
TFOPS_HD inline bool FakeQuantGridHasNan(const FakeQuantGrid& g) {
  return FakeQuantIsNan(g.nudged_min) || FakeQuantIsNan(g.nudged_max) || FakeQuantIsNan(g.scale) ||
         FakeQuantIsNan(g.inv_scale) || FakeQuantIsNan(g.quant_zero);
}

// Vars and PerChannel skip the nudge and output zeros when min == max == 0. TF compares with
// denormals-are-zero on, so subnormal bounds count as 0.
TFOPS_HD inline bool FakeQuantRangeIsZero(float min, float max) {
  return fabsf(min) < kFakeQuantFloatMin && fabsf(max) < kFakeQuantFloatMin;
}

// TF stores the zero point as uint16 after rounding half away from zero. A NaN zero point (min or
// max infinite) converts the way x86 does it (cvttss2si gives INT_MIN, whose low 16 bits are 0),
// without C++ UB.
TFOPS_HD inline uint16_t FakeQuantZeroPointToUint16(float rounded) {
  if (!(rounded >= 0.0f && rounded <= 65535.0f)) return 0;
  return static_cast<uint16_t>(rounded);
}

// The nudge (docs/semantics.md section 1.1), every step one float32 operation. The caller holds the
// flush-to-zero mode (NudgeFakeQuantRange below does on the CPU; the GPU is compiled with it). The
// device nudges with FakeQuantX86Ops, so a NaN or infinite range gives the CPU's NaN bits.
template <class Ops = FakeQuantHardwareOps>
TFOPS_HD inline FakeQuantGrid NudgeFakeQuantGrid(float min, float max, int quant_min, int quant_max) {
  const float qmin = static_cast<float>(quant_min);
  const float qmax = static_cast<float>(quant_max);
  FakeQuantGrid grid;
  grid.scale = Ops::Div(Ops::Sub(max, min), Ops::Sub(qmax, qmin));
  grid.inv_scale = Ops::Div(Ops::Sub(qmax, qmin), Ops::Sub(max, min));
  const float zero_point_from_min = Ops::Sub(qmin, Ops::Div(min, grid.scale));
  uint16_t zero_point;
  if (zero_point_from_min < qmin) {
    zero_point = static_cast<uint16_t>(quant_min);
  } else if (zero_point_from_min > qmax) {
    zero_point = static_cast<uint16_t>(quant_max);
  } else {
    zero_point = FakeQuantZeroPointToUint16(roundf(zero_point_from_min));  // exact on both sides
  }
  const float zp = static_cast<float>(zero_point);
  grid.nudged_min = Ops::Mul(Ops::Sub(qmin, zp), grid.scale);
  grid.nudged_max = Ops::Mul(Ops::Sub(qmax, zp), grid.scale);
  grid.quant_zero = Ops::Floor(Ops::Add(Ops::Mul(Ops::Neg(grid.nudged_min), grid.inv_scale), 0.5f));
  return grid;
}

// Eigen's cwiseMin/cwiseMax follow std::min/std::max: the first operand wins when a comparison
// involves NaN, so a NaN input stays NaN (and a NaN bound is ignored). Selections keep bits.
TFOPS_HD inline float FakeQuantClamp(float x, float lo, float hi) {
  const float c = hi < x ? hi : x;
  return c < lo ? lo : c;
}

// Forward of Args and PerChannel: the shifted value times inv_scale (section 1.2).
template <class Ops = FakeQuantHardwareOps>
TFOPS_HD inline float FakeQuantMultiply(float x, float lo, float hi, float inv_scale, float quant_zero, float scale) {
  const float shifted = Ops::Sub(FakeQuantClamp(x, lo, hi), lo);
  return Ops::Mul(Ops::Floor(Ops::Add(Ops::Sub(Ops::Mul(shifted, inv_scale), quant_zero), 0.5f)), scale);
}

// Forward of Vars: the shifted value divided by scale (section 1.2).
template <class Ops = FakeQuantHardwareOps>
TFOPS_HD inline float FakeQuantDivide(float x, float lo, float hi, float scale, float quant_zero) {
  const float shifted = Ops::Sub(FakeQuantClamp(x, lo, hi), lo);
  return Ops::Mul(Ops::Floor(Ops::Add(Ops::Sub(Ops::Div(shifted, scale), quant_zero), 0.5f)), scale);
}

// dx = g * (lo <= x <= hi ? 1 : 0) (section 1.3). TF multiplies by a 0/1 mask under flush-to-zero;
// g * 1 may be folded to g, so the inside side flushes explicitly (g * 0 keeps TF's -0 and
// inf * 0 = NaN).
template <class Ops = FakeQuantHardwareOps>
TFOPS_HD inline float FakeQuantMasked(float g, float x, float lo, float hi) {
  return (x >= lo && x <= hi) ? FakeQuantFlush(g) : Ops::Mul(g, 0.0f);
}

// The terms summed into dmin and dmax (section 1.4). Only ever used as an operand of a flushing
// addition, so a folded g * 1 changes nothing (the addition quiets a signaling NaN as the product
// would). A sum that comes out NaN is recomputed with FakeQuantX86Ops terms and additions (see
// eigen_sum.h), so NaN sums have the same bits on the CPU and the GPU.
template <class Ops = FakeQuantHardwareOps>
TFOPS_HD inline float FakeQuantBelowTerm(float g, float x, float lo) { return Ops::Mul(g, x < lo ? 1.0f : 0.0f); }
template <class Ops = FakeQuantHardwareOps>
TFOPS_HD inline float FakeQuantAboveTerm(float g, float x, float hi) { return Ops::Mul(g, x > hi ? 1.0f : 0.0f); }

// ---------------------------------------------------------------- CPU kernels

// quant_min = narrow_range ? 1 : 0, quant_max = 2^num_bits - 1 (num_bits already checked to be 2..16).
// NudgeFakeQuantGrid under ScopedFlushDenormals (callable from any thread).
FakeQuantGrid NudgeFakeQuantRange(float min, float max, int quant_min, int quant_max);

// Forward. `use_division`: Vars divides by scale; Args and PerChannel multiply by inv_scale.
void FakeQuantForward(const float* x, float* y, int64_t n, const FakeQuantGrid& grid, bool use_division,
                      const Parallel& parallel);

// Vars forward from its (min, max): zeros when min == max == 0, else FakeQuantForward with division.
void FakeQuantVarsForward(const float* x, float* y, int64_t n, float min, float max, int quant_min, int quant_max,
                          const Parallel& parallel);

// PerChannel forward: x viewed as [outer, channels, inner], channel c uses min[c], max[c]. inner is 1
// for TF's op (the channels are the last dim); the `axis` attribute gives the product of the dims after it.
void FakeQuantPerChannelForward(const float* x, float* y, int64_t outer, int64_t channels, int64_t inner,
                                const float* min, const float* max, int quant_min, int quant_max,
                                const Parallel& parallel);

// dx = g * (nudged_min <= x <= nudged_max ? 1 : 0): a product, as in TF, so a NaN or infinite
// gradient outside the range gives NaN and a negative one gives -0.
void FakeQuantGradientInput(const float* g, const float* x, float* dx, int64_t n, const FakeQuantGrid& grid,
                            const Parallel& parallel);

// Vars gradient: dx as above; dmin = sum of g*(x < nudged_min), dmax = sum of g*(x > nudged_max), in
// Eigen's full-reduction order. With min == max == 0: dx = g, dmin = dmax = 0.
void FakeQuantVarsGradient(const float* g, const float* x, int64_t n, float min, float max, int quant_min,
                           int quant_max, float* dx, float* dmin, float* dmax, const Parallel& parallel);

// PerChannel gradient over x viewed as [outer, channels, inner]; dmin/dmax have `channels` entries, each
// the sum of the channel's outer * inner terms in memory order, in the order of Eigen's vectorized full
// reduction (as TF sums each channel's chip for inner == 1; for inner > 1 as TF's op would on the input
// transposed so that the channels are last).
void FakeQuantPerChannelGradient(const float* g, const float* x, int64_t outer, int64_t channels, int64_t inner,
                                 const float* min, const float* max, int quant_min, int quant_max, float* dx,
                                 float* dmin, float* dmax, const Parallel& parallel);

// ---------------------------------------------------------------- validation (fake_quant_checks.cc)
// Each throws OpError (kernels/op_error.h) with TF's message.

// num_bits, an attribute of all six ops: 2..16.
void CheckFakeQuantNumBits(int64_t num_bits);

// The grid bounds from a checked num_bits and narrow_range.
struct FakeQuantBits {
  int quant_min = 0;
  int quant_max = 255;
};
inline FakeQuantBits FakeQuantBitsOf(int64_t num_bits, bool narrow_range) {
  return FakeQuantBits{narrow_range ? 1 : 0, (1 << num_bits) - 1};
}

// The Args ops' attribute range: min < max once subnormals are flushed (TF reads and compares them with
// denormals-are-zero on). Returns the nudged grid.
FakeQuantGrid CheckArgsRange(float min, float max, const FakeQuantBits& bits);

// The Args gradient's shape check, in TF's generic binary-op wording.
void CheckArgsGradientShapes(const std::vector<int64_t>& gradients, const std::vector<int64_t>& inputs);
// The Vars gradients' shape check is CheckGradientSameSize (kernels/op_error.h), shared with QDQ's.
// The Vars ops' min or max (`name`): a scalar.
void CheckScalarRange(const std::vector<int64_t>& shape, const char* name);
// The PerChannel ops' view of `inputs` around the channel axis: [outer, depth, inner].
struct FakeQuantChannels {
  int64_t outer = 1;
  int64_t depth = 0;
  int64_t inner = 1;
};
// The PerChannel ops: inputs of rank >= 1, `axis` -1 (the last dim) or in [0, rank), min and max vectors
// of that dim's size. Returns the view around that dim.
FakeQuantChannels CheckChannelRanges(const std::vector<int64_t>& inputs, const std::vector<int64_t>& min,
                                     const std::vector<int64_t>& max, int64_t axis);

}  // namespace tfops

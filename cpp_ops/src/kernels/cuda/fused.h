// CUDA launchers of the fused ops (kernels/fused.h; kernels in cuda/fused.cu). Plain C++: the adapter
// (ort/fused_ops.cc, compiled by g++) includes this header; only a build with TFOPS_WITH_CUDA defines them.
//
// Same contract as the CPU kernels, with device pointers for x, the statistics and y; `step` was made
// on the host from the host inputs min/max. The launchers enqueue on launch.stream and return without
// waiting; a failed launch throws DeviceError. Every output is the CPU kernel's bits, NaN payloads
// included: the element arithmetic is fused.h's TFOPS_HD functions. The exception is batch norm's own
// (docs/semantics.md 4a.3): where two NaNs meet in it (a NaN statistic and a NaN x, or a NaN variance
// and a NaN scale), any NaN stands for any NaN, as the CPU's ISA copies differ there too.
#pragma once

#include "kernels/batch_norm.h"
#include "kernels/device.h"
#include "kernels/fused.h"

namespace tfops {
namespace cuda {

void BatchNormClipFakeQuantForward(const batch_norm::Layout& layout, const float* x, const float* scale,
                                   const float* offset, const float* mean, const float* variance, float epsilon,
                                   float clip_min, float clip_max, const fused::FakeQuantStep& step, float* y,
                                   const CudaLaunch& launch);

}  // namespace cuda
}  // namespace tfops

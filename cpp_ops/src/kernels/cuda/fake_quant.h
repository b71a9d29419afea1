// CUDA launchers for FakeQuantWithMinMax{Args,Vars,VarsPerChannel} and their gradients: the same
// functions as kernels/fake_quant.h, over device pointers, on the stream of `launch`. Plain C++ (no
// CUDA types) so that the adapters, compiled by g++, include it; only a build with TFOPS_WITH_CUDA
// defines them (cuda/fake_quant.cu).
//
// Every output is bit-identical to the CPU kernel's (docs/semantics.md section 1): the per-element
// arithmetic is the TFOPS_HD functions of kernels/fake_quant.h, and the sums dmin/dmax add the same
// terms in the same order as eigen_sum.h. Each launcher throws DeviceError if a launch fails; none
// waits on the host.
#pragma once

#include <cstdint>

#include "kernels/device.h"
#include "kernels/fake_quant.h"

namespace tfops {
namespace cuda {

// Args forward (multiply by inv_scale) and Vars forward with an already nudged grid (division).
void FakeQuantForward(const float* x, float* y, int64_t n, const FakeQuantGrid& grid, bool use_division,
                      const CudaLaunch& launch);

// Vars forward; `min` and `max` are host values (the op's CPU inputs): zeros when both are 0, else
// nudged here on the host and FakeQuantForward with division.
void FakeQuantVarsForward(const float* x, float* y, int64_t n, float min, float max, int quant_min, int quant_max,
                          const CudaLaunch& launch);

// PerChannel forward over x viewed as [outer, channels, inner] (inner 1 for the last dim); `min` and
// `max` are device vectors of `channels` entries, nudged on the device.
void FakeQuantPerChannelForward(const float* x, float* y, int64_t outer, int64_t channels, int64_t inner,
                                const float* min, const float* max, int quant_min, int quant_max,
                                const CudaLaunch& launch);

// Args gradient: dx = g * (nudged_min <= x <= nudged_max).
void FakeQuantGradientInput(const float* g, const float* x, float* dx, int64_t n, const FakeQuantGrid& grid,
                            const CudaLaunch& launch);

// Vars gradient; `min` and `max` are host values, dmin and dmax device scalars.
void FakeQuantVarsGradient(const float* g, const float* x, int64_t n, float min, float max, int quant_min,
                           int quant_max, float* dx, float* dmin, float* dmax, const CudaLaunch& launch);

// PerChannel gradient over [outer, channels, inner]; `min`, `max`, `dmin` and `dmax` are device vectors
// of `channels` entries. inner > 1 (an axis before the last dim) runs on channels-last copies in scratch
// memory (three times x's size), with the same sums.
void FakeQuantPerChannelGradient(const float* g, const float* x, int64_t outer, int64_t channels, int64_t inner,
                                 const float* min, const float* max, int quant_min, int quant_max, float* dx,
                                 float* dmin, float* dmax, const CudaLaunch& launch);

}  // namespace cuda
}  // namespace tfops

// CUDA launchers of FusedBatchNorm{,V2,V3} and FusedBatchNormGrad{,V2,V3} (kernels in batch_norm.cu).
// Plain C++: the adapter (batch_norm_ops.cc, compiled by g++) includes this header.
//
// Same contract as the CPU kernels of kernels/batch_norm.h, with device pointers: every tensor
// argument (x, the statistics, every output) is device memory; nothing is read on the host. The
// launchers enqueue their kernels on launch.stream and return without waiting; temporaries come
// from launch.scratch. A failed launch throws DeviceError.
//
// Exactness (docs/cuda.md): the per-element and per-channel formulas are the TFOPS_HD functions of
// kernels/batch_norm.h, so every element is the CPU's float32 operation sequence on the same
// statistics: the outputs that need no sum (the inference forward's five, the inference
// gradient's x_backprop) are the CPU kernels' bit for bit (NaN for NaN). The sums (mean, variance,
// the gradients' column sums) use a fixed two-level tree instead of the CPU's sequential order:
// deterministic (the order depends on the shape only, never on the GPU, the buffers' alignment or
// the run), within the suite's tolerances of TF, and closer to the exact sums than the CPU's on
// large batches; so everything computed from them differs from the CPU kernels in the last bits.
#pragma once

#include "kernels/batch_norm.h"
#include "kernels/device.h"

namespace tfops {
namespace cuda {

// The forward op. mean/variance are read only when !is_training or exponential_avg_factor != 1.
// reserve_space_3 (nullable) is V3's scalar placeholder output: set to 0.
template <typename T>
void BatchNormForward(const batch_norm::Layout& layout, const T* x, const float* scale, const float* offset,
                      const float* mean, const float* variance, float epsilon, float exponential_avg_factor,
                      bool is_training, T* y, float* batch_mean, float* batch_variance, float* reserve_space_1,
                      float* reserve_space_2, float* reserve_space_3, const CudaLaunch& launch);

// The gradient op (outputs 0-2; the shape-[0] placeholders have nothing to write).
template <typename T>
void BatchNormGrad(const batch_norm::Layout& layout, const T* y_backprop, const T* x, const float* scale,
                   const float* reserve_space_1, const float* reserve_space_2, float epsilon, bool is_training,
                   T* x_backprop, float* scale_backprop, float* offset_backprop, const CudaLaunch& launch);

}  // namespace cuda
}  // namespace tfops

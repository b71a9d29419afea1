// CUDA launchers of DepthwiseConv2dNative and its two backprops (kernels in depthwise.cu). Plain
// C++ (no CUDA types): the adapters, compiled by g++, include it. Pointers are device memory; the
// Geometry has been validated on the host (kernels/depthwise.h) and is passed by value. Every launch
// goes on launch.stream; nothing waits on the host. Throws DeviceError when a launch fails.
//
// T is float, double, Half or BFloat16. Exactness (docs/cuda.md):
//  - Forward and BackpropInput compute each output element in one thread with the CPU kernels'
//    operations in the CPU kernels' order (the shared TFOPS_HD steps of kernels/depthwise.h), so
//    they are bit-identical to them (NaN payloads aside).
//  - BackpropFilter sums over batch x output positions in another fixed order (per-thread running
//    sums over fixed chunks of output rows, a fixed tree in each block; the chunk partials summed in
//    8 contiguous runs, then a fixed tree), accumulating 16-bit types in float and rounding once:
//    deterministic, and within the suite's tolerances against TF rather than bit-identical to the
//    CPU kernel.
#pragma once

#include "kernels/depthwise.h"
#include "kernels/device.h"

namespace tfops {
namespace cuda {

template <typename T>
void DepthwiseForward(const depthwise::Geometry& g, const T* input, const T* filter, T* output,
                      const CudaLaunch& launch);

template <typename T>
void DepthwiseBackpropInput(const depthwise::Geometry& g, const T* filter, const T* out_backprop, T* in_backprop,
                            const CudaLaunch& launch);

// Uses launch.scratch for the per-chunk partial sums (at most kMaxFilterPartials compute-type values;
// none when the plan has a single chunk).
template <typename T>
void DepthwiseBackpropFilter(const depthwise::Geometry& g, const T* input, const T* out_backprop, T* filter_backprop,
                             const CudaLaunch& launch);

// The most partial sums BackpropFilter keeps in scratch (16 Mi values: 64 MiB for float, 128 MiB for
// double); larger problems use longer chunks.
constexpr long long kMaxFilterPartials = 1ll << 24;

}  // namespace cuda
}  // namespace tfops

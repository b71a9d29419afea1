// Host emulation of the CUDA depthwise kernels, for machines without a GPU.
//
// Includes cpp_ops/src/kernels/cuda/depthwise.cu and runs its TFOPS_HD kernel bodies on the host
// over the same grids, block shapes and phases (barriers become phase boundaries) the launchers
// use, with the launchers' own path and plan choices (or a forced one). It checks indexing, tiling,
// boundaries, the tap order and the reduction plan; it cannot check what only hardware does (the
// .ftz rounding of float32 instructions, cvt rounding, the memory model, speed). float32 and the
// 16-bit types run with MXCSR FTZ/DAZ on, which is what -ftz=true gives float32 on the device;
// float64 runs with it off, as the device's f64 instructions, so its explicit flushes are tested.
//
// Built and driven by tests/test_cuda_emulation_depthwise.py (nvcc, no GPU needed).
#include "kernels/cuda/depthwise.cu"

#include <cstring>
#include <optional>
#include <string>
#include <vector>

#include "kernels/simd.h"

namespace tfops {
namespace cuda {
namespace {

template <typename T>
void EmuForward(const Geometry& g, const T* x, const T* w, T* y, Path path) {
  const long long n = g.OutputSize();
  if (n == 0) return;
  switch (path) {
    case Path::kNhwcTiles: {
      const Dims<int> d = DimsOf<int>(g);
      const TileGrid grid = TilesFor(d.out_depth, d.out_cols, d.batch * d.out_rows);
      for (int row = 0; row < grid.rows; ++row)
        for (int bx = 0; bx < grid.c_tiles * grid.col_tiles; ++bx)
          for (int ty = 0; ty < kColGroups; ++ty)
            for (int tx = 0; tx < kTileChannels; ++tx) ForwardNhwcBlockThread(d, x, w, y, grid, row, bx, tx, ty);
      break;
    }
    case Path::kElements32: {
      const Dims<int> d = DimsOf<int>(g);
      for (int e = 0; e < static_cast<int>(n); ++e) ForwardElement(d, x, w, y, e);
      break;
    }
    case Path::kElements64: {
      const Dims<long long> d = DimsOf<long long>(g);
      for (long long e = 0; e < n; ++e) ForwardElement(d, x, w, y, e);
      break;
    }
  }
}

template <typename T, int kStride>
void EmuBackpropInputTiles(const Geometry& g, const T* f, const T* dy, T* dx) {
  const Dims<int> d = DimsOf<int>(g);
  const TileGrid grid = TilesFor(d.in_depth, d.in_cols, d.batch * d.in_rows);
  for (int row = 0; row < grid.rows; ++row)
    for (int bx = 0; bx < grid.c_tiles * grid.col_tiles; ++bx)
      for (int ty = 0; ty < kColGroups; ++ty)
        for (int tx = 0; tx < kTileChannels; ++tx)
          BackpropInputNhwcBlockThread<T, kStride>(d, f, dy, dx, grid, row, bx, tx, ty);
}

template <typename T>
void EmuBackpropInput(const Geometry& g, const T* f, const T* dy, T* dx, Path path) {
  const long long n = g.InputSize();
  if (n == 0) return;
  switch (path) {
    case Path::kNhwcTiles:
      WithStride(g.stride, [&](auto stride) { EmuBackpropInputTiles<T, decltype(stride)::value>(g, f, dy, dx); });
      break;
    case Path::kElements32:
      WithStride(g.stride, [&](auto stride) {
        const Dims<int> d = DimsOf<int>(g);
        for (int e = 0; e < static_cast<int>(n); ++e) BackpropInputElement<decltype(stride)::value>(d, f, dy, dx, e);
      });
      break;
    case Path::kElements64: {
      const Dims<long long> d = DimsOf<long long>(g);
      for (long long e = 0; e < n; ++e) BackpropInputElement<0>(d, f, dy, dx, e);
      break;
    }
  }
}

// The two kernels of BackpropFilter, phase by phase (the partials live in host memory here).
template <typename T, typename I, int kTaps>
void EmuFilterPlan(const Geometry& g, const FilterPlan<I>& plan, const T* x, const T* dy, T* out) {
  using A = typename Dev<T>::A;
  const Dims<I> d = DimsOf<I>(g);
  std::vector<A> partial(plan.chunks > 1 ? static_cast<std::size_t>(plan.chunks * g.FilterSize()) : 0);
  std::vector<A> smem(static_cast<std::size_t>(TapCount<kTaps>::value * plan.bx * plan.by));
  for (I task = 0; task < plan.tasks; ++task) {
    for (int ty = 0; ty < plan.by; ++ty)
      for (int tx = 0; tx < plan.bx; ++tx) FilterAccumulate<T, I, kTaps>(d, plan, x, dy, task, tx, ty, smem.data());
    for (int half = plan.by / 2; half > 0; half /= 2)
      for (int ty = 0; ty < half; ++ty)
        for (int tx = 0; tx < plan.bx; ++tx) FilterTreeStep<T, I, kTaps>(plan, half, tx, ty, smem.data());
    for (int ty = 0; ty < plan.by; ++ty)
      for (int tx = 0; tx < plan.bx; ++tx)
        FilterStore<T, I, kTaps>(d, plan, task, tx, ty, smem.data(), partial.data(), out);
  }
  if (plan.chunks == 1) return;
  const int filter_size = static_cast<int>(g.FilterSize());
  const int tiles = (filter_size + kSumColumns - 1) / kSumColumns;
  A sum_smem[kSumGroups * kSumColumns];
  for (int tile = 0; tile < tiles; ++tile) {
    for (int ty = 0; ty < kSumGroups; ++ty)
      for (int tx = 0; tx < kSumColumns; ++tx)
        ChunkSumAccumulate<T>(partial.data(), static_cast<int>(plan.chunks), filter_size, tile, tx, ty, sum_smem);
    for (int half = kSumGroups / 2; half > 0; half /= 2)
      for (int ty = 0; ty < half; ++ty)
        for (int tx = 0; tx < kSumColumns; ++tx) ChunkSumTreeStep<T>(half, tx, ty, sum_smem);
    for (int tx = 0; tx < kSumColumns; ++tx) ChunkSumStore<T>(filter_size, tile, tx, sum_smem, out);
  }
}

template <typename T, typename I, int kTaps>
void EmuFilterTaps(const Geometry& g, const T* x, const T* dy, T* out, long long max_partials,
                   long long positions_per_lane) {
  EmuFilterPlan<T, I, kTaps>(g, PlanFilter<I>(g, kTaps > 0, max_partials, positions_per_lane), x, dy, out);
}

// index_bits: 32 or 64; all_taps: 1 (3x3 only), 0 (one tap per task), -1 (the launcher's choice).
template <typename T>
void EmuBackpropFilter(const Geometry& g, const T* x, const T* dy, T* out, int index_bits, int all_taps,
                       long long max_partials, long long positions_per_lane) {
  const long long n = g.FilterSize();
  if (n == 0) return;
  if (g.OutputSize() == 0) {
    for (long long e = 0; e < n; ++e) out[e] = Dev<T>::Store(typename Dev<T>::A(0));
    return;
  }
  const bool taps = all_taps < 0 ? FilterAllTaps(g) : all_taps == 1;
  if (index_bits == 32) {
    if (taps)
      EmuFilterTaps<T, int, 9>(g, x, dy, out, max_partials, positions_per_lane);
    else
      EmuFilterTaps<T, int, 0>(g, x, dy, out, max_partials, positions_per_lane);
  } else {
    if (taps)
      EmuFilterTaps<T, long long, 9>(g, x, dy, out, max_partials, positions_per_lane);
    else
      EmuFilterTaps<T, long long, 0>(g, x, dy, out, max_partials, positions_per_lane);
  }
}

template <typename T>
int Run(int op, const Geometry& g, const void* a, const void* b, void* out, int path, int index_bits, int all_taps,
        long long max_partials, long long positions_per_lane) {
  if (op == 0) {
    const Path p = path < 0 ? ForwardPath(g) : static_cast<Path>(path);
    EmuForward<T>(g, static_cast<const T*>(a), static_cast<const T*>(b), static_cast<T*>(out), p);
  } else if (op == 1) {
    const Path p = path < 0 ? BackpropInputPath(g) : static_cast<Path>(path);
    EmuBackpropInput<T>(g, static_cast<const T*>(a), static_cast<const T*>(b), static_cast<T*>(out), p);
  } else {
    const int bits = index_bits < 0 ? (Fits32(g) ? 32 : 64) : index_bits;
    EmuBackpropFilter<T>(g, static_cast<const T*>(a), static_cast<const T*>(b), static_cast<T*>(out), bits, all_taps,
                         max_partials, positions_per_lane);
  }
  return 0;
}

}  // namespace
}  // namespace cuda
}  // namespace tfops

using tfops::depthwise::Attrs;
using tfops::depthwise::Geometry;

namespace {
void Copy(const std::string& s, char* buf, int size) {
  std::strncpy(buf, s.c_str(), static_cast<std::size_t>(size - 1));
  buf[size - 1] = '\0';
}
std::vector<std::int64_t> Vec(const std::int64_t* v, int n) { return std::vector<std::int64_t>(v, v + n); }
}  // namespace

extern "C" {

// The launcher's choices for a geometry: path (0 tiles, 1 elements32, 2 elements64) of the forward
// (op 0) or input gradient (op 1); for the filter gradient (op 2) 32 or 64 index bits.
// op: 0 forward (s0/p0 input, s1/p1 filter), 1 backprop input (s0 = input_sizes values, s1/p1
// filter, s2/p2 out_backprop), 2 backprop filter (s0/p0 input, s1 = filter_sizes values, s2/p2
// out_backprop). dtype: 0 float, 1 double, 2 float16, 3 bfloat16. path: -1 the launcher's choice,
// else a Path (the caller makes sure it applies). index_bits/all_taps: for op 2, -1 = launcher's.
// Returns 0, or 1 with the geometry error in `error`. `chosen` gets the launcher's choice
// (path for ops 0/1, index bits for op 2).
int dw_emu(int op, int dtype, const char* data_format, const char* padding, const std::int64_t* strides,
           const std::int64_t* dilations, const std::int64_t* explicit_paddings, int n_explicit,
           const std::int64_t* s0, const std::int64_t* s1, const std::int64_t* s2, const void* p0, const void* p1,
           const void* p2, void* out, int path, int index_bits, int all_taps, long long max_partials,
           long long positions_per_lane, int* chosen, char* error, int error_size) {
  // float32 as -ftz=true makes it on the device; float64 runs without the mode, as the device's f64
  // instructions do, so that the kernels' explicit flushes are what is tested.
  std::optional<tfops::ScopedFlushDenormals> flush;
  if (dtype != 1) flush.emplace();
  Attrs attrs;
  attrs.strides = Vec(strides, 4);
  attrs.dilations = Vec(dilations, 4);
  attrs.explicit_paddings = Vec(explicit_paddings, n_explicit);
  attrs.padding = padding;
  attrs.data_format = data_format;
  Geometry g;
  const void *a = nullptr, *b = nullptr;
  try {  // the geometry checks throw tfops::OpError (kernels/op_error.h)
    if (op == 0) {
      tfops::depthwise::ForwardGeometry(attrs, Vec(s0, 4), Vec(s1, 4), &g);
      a = p0;
      b = p1;
    } else if (op == 1) {
      std::int32_t sizes[4];
      for (int i = 0; i < 4; ++i) sizes[i] = static_cast<std::int32_t>(s0[i]);
      tfops::depthwise::BackpropInputGeometry(attrs, {4}, sizes, Vec(s1, 4), Vec(s2, 4), &g);
      a = p1;
      b = p2;
    } else {
      std::int32_t sizes[4];
      for (int i = 0; i < 4; ++i) sizes[i] = static_cast<std::int32_t>(s1[i]);
      tfops::depthwise::BackpropFilterGeometry(attrs, Vec(s0, 4), {4}, sizes, Vec(s2, 4), &g);
      a = p0;
      b = p2;
    }
  } catch (const tfops::OpError& e) {
    Copy(e.what(), error, error_size);
    return 1;
  }
  using tfops::cuda::Path;
  if (op == 0) *chosen = static_cast<int>(tfops::cuda::ForwardPath(g));
  if (op == 1) *chosen = static_cast<int>(tfops::cuda::BackpropInputPath(g));
  if (op == 2) *chosen = tfops::cuda::Fits32(g) ? 32 : 64;
  switch (dtype) {
    case 0:
      return tfops::cuda::Run<float>(op, g, a, b, out, path, index_bits, all_taps, max_partials, positions_per_lane);
    case 1:
      return tfops::cuda::Run<double>(op, g, a, b, out, path, index_bits, all_taps, max_partials, positions_per_lane);
    case 2:
      return tfops::cuda::Run<tfops::Half>(op, g, a, b, out, path, index_bits, all_taps, max_partials,
                                           positions_per_lane);
    default:
      return tfops::cuda::Run<tfops::BFloat16>(op, g, a, b, out, path, index_bits, all_taps, max_partials,
                                               positions_per_lane);
  }
}

}  // extern "C"

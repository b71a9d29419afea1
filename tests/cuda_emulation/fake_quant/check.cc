// Host emulation of the FakeQuant CUDA kernels against the CPU kernels, bit for bit (NaN bits of the sums
// included): fake_quant.cu is rewritten by transform.py so that each launch runs its blocks on the host
// (fake/cuda_runtime.h: block threads with a real barrier where a kernel synchronizes), over 618 cases
// (each with the per-channel ops on the last dim and, where rows divide by 2 or 3, on an axis before it):
// split tree nodes, fewer than 32 rows, 4M rows, zero and NaN/inf ranges, six NaN payloads, misaligned
// pointers. Built and run by tests/test_cuda_emulation_fake_quant.py.
#include <cstdio>
#include <cstring>
#include <random>
#include <vector>
#include <memory>
#include "kernels/fake_quant.h"
#include "kernels/cuda/fake_quant.h"
#include "kernels/eigen_sum.h"
const float* g_x = nullptr; const float* g_mn; const float* g_mx; int64_t g_C = 1;
using namespace tfops;
struct VecScratch : DeviceScratch { std::vector<std::unique_ptr<char[]>> bufs; void* Allocate(std::size_t b) override { bufs.emplace_back(new char[b]); char* p = bufs.back().get(); std::memset(p, 0x7f, b); return p; } };
static bool Same(const float* a, const float* b, int64_t n, const char* what, int64_t rows, int64_t C, bool nan_bits = true) {
  for (int64_t i = 0; i < n; ++i) if (std::memcmp(a + i, b + i, 4) && !(!nan_bits && std::isnan(a[i]) && std::isnan(b[i]))) { uint32_t ua, ub; memcpy(&ua, a + i, 4); memcpy(&ub, b + i, 4); printf("MISMATCH %s rows=%lld C=%lld at %lld: cpu %08x emu %08x\n", what, (long long)rows, (long long)C, (long long)i, ua, ub); if (g_x) { uint32_t ux; memcpy(&ux, g_x + i, 4); int64_t c = i % C; printf("   x %08x min %a max %a\n", ux, g_mn[c % g_C], g_mx[c % g_C]); } return false; }
  return true;
}
std::mt19937 rng(7);
float Nan() { static const uint32_t pats[] = {0x7fc00000u, 0xffc00000u, 0x7f800001u, 0xff800123u, 0x7fc12345u, 0xffd00001u}; float v; std::memcpy(&v, &pats[rng() % 6], 4); return v; }
float RandVal(float lo, float hi) {
  std::uniform_real_distribution<float> u(lo - 1.0f, hi + 1.0f);
  switch (rng() % 40) {
    case 0: return Nan(); case 1: return INFINITY; case 2: return -INFINITY; case 3: return 1e-40f; case 4: return -1e-40f;
    case 5: return -0.0f; case 6: return lo; case 7: return hi; case 8: return 0.0f; default: { float v = u(rng); return (rng()%5==0) ? std::round(v*4)/4 : v; }
  }
}
int fails = 0;
bool g_storm = false, g_finite_g = false;
void Run(int64_t rows, int64_t C, int qmin, int qmax, int offset) {
  const int64_t n = rows * C;
  std::vector<float> xb(n + offset), gb(n + offset), mn(C), mx(C);
  float* x = xb.data() + offset; float* g = gb.data() + offset;
  for (int64_t c = 0; c < C; ++c) { int k = rng() % 12; if (k == 0) { mn[c] = 0; mx[c] = (rng()%2) ? -1e-40f : 0.0f; } else if (k == 1) { mn[c] = -1e-40f; mx[c] = 3; } else if (k == 2) { mn[c] = 0.3f; mx[c] = 5.0f; } else if (k == 3) { mn[c] = -7.f; mx[c] = -0.5f; } else if (k == 4 && rng() % 3 == 0) { const float sp[] = {INFINITY, -INFINITY, Nan(), Nan(), 1.0f, -1.0f, 0.0f, 3e38f, -3e38f}; mn[c] = sp[rng() % 9]; mx[c] = sp[rng() % 9]; } else { mn[c] = -(float)(rng() % 1000) / 97.0f; mx[c] = (float)(rng() % 1000 + 1) / 89.0f; } }
  if (g_storm) for (int64_t c = 0; c < C; ++c) { const float sp[] = {INFINITY, -INFINITY, Nan(), Nan(), Nan(), 1.0f, -1.0f, 0.0f, 3e38f, -3e38f}; mn[c] = sp[rng() % 10]; mx[c] = sp[rng() % 10]; }
  for (int64_t i = 0; i < n; ++i) { int64_t c = i % C; x[i] = g_storm && rng() % 2 ? Nan() : RandVal(mn[c], mx[c]); g[i] = (rng() % 30 == 0) ? (g_finite_g ? (rng() % 2 ? 1e-40f : -0.0f) : RandVal(-1, 1)) : std::uniform_real_distribution<float>(-2, 2)(rng); }
  g_x = x; g_mn = mn.data(); g_mx = mx.data(); g_C = C;
  VecScratch scratch; CudaLaunch launch{nullptr, &scratch};
  Parallel par; ScopedFlushDenormals ftz;
  std::vector<float> ya(n + offset), yb(n + offset), dxa(n + offset), dxb(n + offset), dmna(C), dmnb(C), dmxa(C), dmxb(C);
  float* y1 = ya.data() + offset; float* y2 = yb.data() + offset; float* d1 = dxa.data() + offset; float* d2 = dxb.data() + offset;
  // per channel
  FakeQuantPerChannelForward(x, y1, rows, C, 1, mn.data(), mx.data(), qmin, qmax, par);
  cuda::FakeQuantPerChannelForward(x, y2, rows, C, 1, mn.data(), mx.data(), qmin, qmax, launch);
  fails += !Same(y1, y2, n, "pc fwd", rows, C);
  // The same buffer as [rows / inner, C, inner]: an `axis` before the last dim.
  if (const int64_t inner = rows % 3 == 0 ? 3 : rows % 2 == 0 ? 2 : 1; inner > 1) {
    FakeQuantPerChannelForward(x, y1, rows / inner, C, inner, mn.data(), mx.data(), qmin, qmax, par);
    cuda::FakeQuantPerChannelForward(x, y2, rows / inner, C, inner, mn.data(), mx.data(), qmin, qmax, launch);
    fails += !Same(y1, y2, n, "pc fwd inner", rows / inner, C);
  }
  if (const int64_t inner = rows % 3 == 0 ? 3 : rows % 2 == 0 ? 2 : 1; inner > 1) {  // the gradient, moved axis
    FakeQuantPerChannelGradient(g, x, rows / inner, C, inner, mn.data(), mx.data(), qmin, qmax, d1, dmna.data(), dmxa.data(), par);
    cuda::FakeQuantPerChannelGradient(g, x, rows / inner, C, inner, mn.data(), mx.data(), qmin, qmax, d2, dmnb.data(), dmxb.data(), launch);
    fails += !Same(d1, d2, n, "pc dx inner", rows / inner, C) + !Same(dmna.data(), dmnb.data(), C, "pc dmin inner", rows, C) + !Same(dmxa.data(), dmxb.data(), C, "pc dmax inner", rows, C);
  }
  FakeQuantPerChannelGradient(g, x, rows, C, 1, mn.data(), mx.data(), qmin, qmax, d1, dmna.data(), dmxa.data(), par);
  cuda::FakeQuantPerChannelGradient(g, x, rows, C, 1, mn.data(), mx.data(), qmin, qmax, d2, dmnb.data(), dmxb.data(), launch);
  fails += !Same(d1, d2, n, "pc dx", rows, C) + !Same(dmna.data(), dmnb.data(), C, "pc dmin", rows, C) + !Same(dmxa.data(), dmxb.data(), C, "pc dmax", rows, C);
  // per tensor over all n, with channel 0's range
  const int64_t pick = rng() % C; const float lo = mn[pick], hi = mx[pick];
  FakeQuantVarsForward(x, y1, n, lo, hi, qmin, qmax, par);
  cuda::FakeQuantVarsForward(x, y2, n, lo, hi, qmin, qmax, launch);
  fails += !Same(y1, y2, n, "vars fwd", n, 1);
  float a1, a2, b1, b2;
  FakeQuantVarsGradient(g, x, n, lo, hi, qmin, qmax, d1, &a1, &b1, par);
  cuda::FakeQuantVarsGradient(g, x, n, lo, hi, qmin, qmax, d2, &a2, &b2, launch);
  fails += !Same(d1, d2, n, "vars dx", n, 1) + !Same(&a1, &a2, 1, "vars dmin", n, 1) + !Same(&b1, &b2, 1, "vars dmax", n, 1);
  if (!FakeQuantRangeIsZero(lo, hi)) {  // Args grids (the adapter requires min < max; the kernels do not care)
    const FakeQuantGrid grid = NudgeFakeQuantRange(lo, hi, qmin, qmax);
    FakeQuantForward(x, y1, n, grid, false, par); cuda::FakeQuantForward(x, y2, n, grid, false, launch);
    fails += !Same(y1, y2, n, "args fwd", n, 1);
    FakeQuantGradientInput(g, x, d1, n, grid, par); cuda::FakeQuantGradientInput(g, x, d2, n, grid, launch);
    fails += !Same(d1, d2, n, "args dx", n, 1);
  }
}
int main(int argc, char** argv) {
  // sizes with split nodes on the leaf level
  std::vector<int64_t> split_sizes;
  for (int64_t n = 8193; n < 3000000 && split_sizes.size() < 6; n += 1 + rng() % 997) { eigen_sum::TreeLevels lv; eigen_sum::TreeLevelsOf(n, &lv); if (lv.any_split) split_sizes.push_back(n); }
  printf("split sizes:"); for (auto s : split_sizes) printf(" %lld", (long long)s); printf("\n");
  int cases = 0;
  for (int64_t rows : {1, 2, 7, 8, 9, 31, 32, 33, 40, 63, 64, 65, 100, 255, 1000, 8191, 8192, 8193, 8200, 16384, 16385, 20000, 40000})
    for (int64_t C : {1, 2, 3, 4, 5, 8, 13, 32, 64}) {
      if (rows * C > 400000) continue;
      Run(rows, C, rng() % 2, (1 << (2 + rng() % 15)) - 1, (rows + C) % 3 == 0 ? 1 : 0); ++cases;
      g_finite_g = true; Run(rows, C, rng() % 2, (1 << (2 + rng() % 15)) - 1, 0); g_finite_g = false; ++cases; }
  for (int64_t n : split_sizes) { Run(n, 1, 0, 255, 0); g_finite_g = true; Run(n, 1, 1, 15, 1); Run(n / 3, 3, 0, 255, 0); g_finite_g = false; cases += 3; }
  Run(100000, 300, 0, 255, 0); Run(3, 70000, 0, 255, 0); Run(1, 5000, 0, 255, 1); Run(31, 100, 1, 255, 0); Run(32, 100, 0, 7, 0); cases += 3; Run(300000, 3, 0, 255, 2); Run(1000003, 1, 0, 65535, 0); cases += 4;
  g_finite_g = true; Run(100000, 300, 0, 255, 0); Run(300000, 3, 0, 255, 2); Run(1000003, 1, 0, 65535, 0); Run(4000000, 1, 0, 255, 0); Run(70001, 64, 1, 255, 0); g_finite_g = false; cases += 5;
  g_storm = true; int before = fails;
  for (int r = 0; r < 200; ++r) { Run(64 + r % 7, 16, r % 2, 255, r % 3); ++cases; }
  printf("storm fails %d\n", fails - before);
  printf("cases %d fails %d\n", cases, fails);
  return fails != 0;
}

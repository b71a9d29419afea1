// Float sums in the exact order Eigen's single-threaded full reductions add, so that a kernel's
// gradient sums match TensorFlow bit for bit (float addition is not associative).
//
// The reducer reads element i through `value(i)` (a callable), so the summed expression (e.g.
// g[i] * mask[i]) is never materialized.
//
// The TFOPS_HD pieces (the split of a range, the folds, the combination of two halves) are shared
// with the CUDA kernels, which compute the same sums in parallel (cuda/fake_quant.cu): a leaf's
// element j (leaf-relative) in the 4-accumulator blocks belongs to the sequence j % 32 (accumulator
// (j / 8) % 4, lane j % 8), and each of the 32 sequences is a chain of additions of its own.
//
// Every function takes the float operations as a policy (Ops): float_ops::Hardware (the machine's own
// operations, the fast path) or float_ops::X86 (the same numbers, with x86's NaN results spelled out).
// Which NaN a sum of NaN terms ends with depends on the operand order of each addition; a sum that
// comes out NaN is recomputed with float_ops::X86, on the CPU and on the GPU, so NaN sums carry the
// same bits on both and on every CPU whatever order the compiler picked.
#pragma once

#include <math.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <vector>

#include "kernels/device.h"

namespace tfops {

// ---------------------------------------------------------------- float operations

namespace float_ops {

TFOPS_HD inline uint32_t Bits(float v) {
#if defined(__CUDA_ARCH__)
  return __float_as_uint(v);
#else
  uint32_t u;
  std::memcpy(&u, &v, sizeof u);
  return u;
#endif
}

TFOPS_HD inline float FromBits(uint32_t u) {
#if defined(__CUDA_ARCH__)
  return __uint_as_float(u);
#else
  float v;
  std::memcpy(&v, &u, sizeof v);
  return v;
#endif
}

TFOPS_HD inline bool IsNan(float v) { return (Bits(v) & 0x7fffffffu) > 0x7f800000u; }

// The float operations of a formula, as the hardware does them. On x86 (TF's CPU kernels and ours)
// that includes which NaN a NaN result is; a GPU returns its one canonical NaN instead.
struct Hardware {
  TFOPS_HD static float Add(float a, float b) { return a + b; }
  TFOPS_HD static float Sub(float a, float b) { return a - b; }
  TFOPS_HD static float Mul(float a, float b) { return a * b; }
  TFOPS_HD static float Div(float a, float b) { return a / b; }
  TFOPS_HD static float Neg(float a) { return -a; }
  TFOPS_HD static float Floor(float a) { return floorf(a); }
};

// The same operations with x86's NaN results spelled out (SSE/AVX, which TF's and our CPU kernels
// use): a NaN operand comes out quieted (signaling bit set, sign and payload kept), the first
// operand's when both are NaN; an invalid operation on numbers (inf - inf, 0 * inf, 0 / 0) gives
// the default NaN 0xffc00000; negation flips the sign bit of a NaN too. Numbers are the hardware's,
// flush-to-zero included. Kernels use them where a result is NaN: the CUDA kernels so that NaN
// outputs carry the CPU kernel's bits, the CPU kernels where the compiler may have swapped the
// operands of an operation that meets two NaNs (a vectorized sum, a grid holding a NaN).
struct X86 {
  TFOPS_HD static float Quiet(float a) { return FromBits(Bits(a) | 0x00400000u); }
  TFOPS_HD static float NanOf(float a, float b) {
    if (IsNan(a)) return Quiet(a);
    if (IsNan(b)) return Quiet(b);
    return FromBits(0xffc00000u);
  }
  TFOPS_HD static float Add(float a, float b) {
    const float r = a + b;
    return IsNan(r) ? NanOf(a, b) : r;
  }
  TFOPS_HD static float Sub(float a, float b) {
    const float r = a - b;
    return IsNan(r) ? NanOf(a, b) : r;
  }
  TFOPS_HD static float Mul(float a, float b) {
    const float r = a * b;
    return IsNan(r) ? NanOf(a, b) : r;
  }
  TFOPS_HD static float Div(float a, float b) {
    const float r = a / b;
    return IsNan(r) ? NanOf(a, b) : r;
  }
  TFOPS_HD static float Neg(float a) { return IsNan(a) ? FromBits(Bits(a) ^ 0x80000000u) : -a; }
  TFOPS_HD static float Floor(float a) { return IsNan(a) ? Quiet(a) : floorf(a); }
};

}  // namespace float_ops

namespace eigen_sum {

constexpr int64_t kLeafSize = 1024;  // Eigen's LeafSize<float>: leaves of up to 8*1024 values
constexpr int64_t kPacket = 8;       // AVX float packet width of the official TF wheels

constexpr int64_t kBlock = 4 * kPacket;  // values per block of the four packet accumulators

// AVX horizontal sum of one 8-lane packet: lanes folded 4+4, then 2+2, then 1+1.
template <class Ops = float_ops::Hardware>
TFOPS_HD inline float HorizontalSum(const float* v) {
  const float h0 = Ops::Add(v[0], v[4]), h1 = Ops::Add(v[1], v[5]), h2 = Ops::Add(v[2], v[6]),
              h3 = Ops::Add(v[3], v[7]);
  return Ops::Add(Ops::Add(h0, h2), Ops::Add(h1, h3));
}

// One lane of the fold of the four packet accumulators into the first: acc0 + acc1, + acc2, + acc3.
template <class Ops = float_ops::Hardware>
TFOPS_HD inline float FoldAccumulators(float a0, float a1, float a2, float a3) {
  return Ops::Add(Ops::Add(Ops::Add(a0, a1), a2), a3);
}

// A split node's sum: 0 + left, then + right (the +0 start turns a -0 left sum into +0).
template <class Ops = float_ops::Hardware>
TFOPS_HD inline float CombineHalves(float left, float right) {
  return Ops::Add(Ops::Add(0.0f, left), right);
}

// Whether a range of n values is summed as one leaf, and how many values its left half takes when
// it is not: the split is at a packet-aligned midpoint (so every right half starts at a multiple of
// kPacket when the whole range does).
TFOPS_HD inline bool IsLeafRange(int64_t n) { return n <= kPacket * kLeafSize; }
TFOPS_HD inline int64_t LeftCount(int64_t first, int64_t n) {
  const int64_t half = (n + 1) / 2;
  const int64_t split = kPacket * ((first + half + kPacket - 1) / kPacket);
  return split - first < n ? split - first : n;
}

// Eigen's vectorized leaf: four packet accumulators over blocks of 32, folded into the first; the
// remaining whole packets into the first; the scalar tail on its own; then tail + horizontal sum.
template <class Ops = float_ops::Hardware, typename F>
float PacketLeaf(const F& value, int64_t first, int64_t n) {
  float acc0[kPacket] = {0}, acc1[kPacket] = {0}, acc2[kPacket] = {0}, acc3[kPacket] = {0};
  int64_t start = 0;
  if (n >= 4 * kPacket) {
    const int64_t blocks = (n / (4 * kPacket)) * (4 * kPacket);
    for (int64_t j = 0; j < blocks; j += 4 * kPacket) {
      for (int64_t l = 0; l < kPacket; ++l) {
        acc0[l] = Ops::Add(acc0[l], value(first + j + l));
        acc1[l] = Ops::Add(acc1[l], value(first + j + kPacket + l));
        acc2[l] = Ops::Add(acc2[l], value(first + j + 2 * kPacket + l));
        acc3[l] = Ops::Add(acc3[l], value(first + j + 3 * kPacket + l));
      }
    }
    for (int64_t l = 0; l < kPacket; ++l) acc0[l] = FoldAccumulators<Ops>(acc0[l], acc1[l], acc2[l], acc3[l]);
    start = blocks;
  }
  if (start <= n - kPacket) {
    const int64_t whole = (n / kPacket) * kPacket;
    for (int64_t j = start; j < whole; j += kPacket) {
      for (int64_t l = 0; l < kPacket; ++l) acc0[l] = Ops::Add(acc0[l], value(first + j + l));
    }
    start = whole;
  }
  float tail = 0.0f;
  for (int64_t j = start; j < n; ++j) tail = Ops::Add(tail, value(first + j));
  return Ops::Add(tail, HorizontalSum<Ops>(acc0));
}

// Eigen's vectorized tree reduction: above 8*1024 values, split at a packet-aligned midpoint.
template <typename F>
float PacketTreeSum(const F& value, int64_t first, int64_t n) {
  if (!IsLeafRange(n)) {
    const int64_t num_left = LeftCount(first, n);
    float acc = 0.0f;
    acc = acc + PacketTreeSum(value, first, num_left);
    if (num_left < n) acc = acc + PacketTreeSum(value, first + num_left, n - num_left);
    return acc;
  }
  return PacketLeaf(value, first, n);
}

// PacketTreeSum's leaves over [first, first + n), in order: (first, count) pairs. A kernel can sum
// the leaves in parallel (each in cache, next to other work on the same elements) and then combine
// them with TreeCombine, getting PacketTreeSum's bits.
struct Leaf {
  int64_t first;
  int64_t count;
};

inline void TreeLeaves(int64_t first, int64_t n, std::vector<Leaf>* leaves) {
  if (!IsLeafRange(n)) {
    const int64_t num_left = LeftCount(first, n);
    TreeLeaves(first, num_left, leaves);
    if (num_left < n) TreeLeaves(first + num_left, n - num_left, leaves);
    return;
  }
  leaves->push_back({first, n});
}

// Adds the leaf sums `*next`, `*(next + stride)`, ... in PacketTreeSum's order over the same range.
template <class Ops = float_ops::Hardware>
inline float TreeCombine(int64_t first, int64_t n, const float*& next, int64_t stride = 1) {
  if (!IsLeafRange(n)) {
    const int64_t num_left = LeftCount(first, n);
    float acc = 0.0f;
    acc = Ops::Add(acc, TreeCombine<Ops>(first, num_left, next, stride));
    if (num_left < n) acc = Ops::Add(acc, TreeCombine<Ops>(first + num_left, n - num_left, next, stride));
    return acc;
  }
  const float leaf = *next;
  next += stride;
  return leaf;
}

// ---------------------------------------------------------------- the tree by levels (for the GPU)
//
// The tree over [0, n) seen level by level. Every node starts at a multiple of kPacket, so a node's
// split depends on its size only, and the splits are near halves: the sizes on one level differ by
// a few packets. Hence the tree is complete down to the depth of its shallowest leaf, `depth`, and
// every node on that level is either a leaf or splits into two leaves. A GPU kernel can then find
// node j of that level by walking down the bits of j (NodeAt) and give each node one or two slots.
struct TreeLevels {
  int depth = 0;           // the shallowest leaf's depth; 2^depth nodes on that level
  bool any_split = false;  // whether some node on that level splits into two leaves
};

// Returns false if the tree over [0, n) does not have that shape (never, for the splits above: the
// check guards the kernels' assumption rather than a case known to occur).
inline bool TreeLevelsOf(int64_t n, TreeLevels* levels) {
  std::vector<int64_t> sizes{n}, next;
  int depth = 0;
  while (std::all_of(sizes.begin(), sizes.end(), [](int64_t s) { return !IsLeafRange(s); })) {
    next.clear();
    for (const int64_t s : sizes) {
      const int64_t left = LeftCount(0, s);
      next.push_back(left);
      if (left < s) next.push_back(s - left);
    }
    std::sort(next.begin(), next.end());
    next.erase(std::unique(next.begin(), next.end()), next.end());
    sizes.swap(next);
    if (++depth > 62) return false;
  }
  bool any_split = false;
  for (const int64_t s : sizes) {
    if (IsLeafRange(s)) continue;
    const int64_t left = LeftCount(0, s);
    if (left >= s || !IsLeafRange(left) || !IsLeafRange(s - left)) return false;
    any_split = true;
  }
  levels->depth = depth;
  levels->any_split = any_split;
  return true;
}

// Node j (0 <= j < 2^depth, left to right) on level `depth` of the tree over [0, n), for the
// `depth` of TreeLevelsOf (every node above it splits).
TFOPS_HD inline Leaf NodeAt(int64_t n, int depth, int64_t j) {
  Leaf node{0, n};
  for (int d = depth - 1; d >= 0; --d) {
    const int64_t left = LeftCount(node.first, node.count);
    if ((j >> d) & 1) {
      node.first += left;
      node.count -= left;
    } else {
      node.count = left;
    }
  }
  return node;
}

}  // namespace eigen_sum
}  // namespace tfops

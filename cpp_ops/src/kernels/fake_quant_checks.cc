// The FakeQuant ops' attribute and shape checks (see fake_quant.h), in TF's order and wording
// (docs/semantics.md section 1.5). Apart from fake_quant.cc so that the kernels' CUDA host emulation
// (tests/cuda_emulation/fake_quant) builds the arithmetic alone.
#include <string>
#include <vector>

#include "kernels/fake_quant.h"
#include "kernels/op_error.h"
#include "kernels/simd.h"

namespace tfops {

void CheckFakeQuantNumBits(int64_t num_bits) {
  if (num_bits < 2 || num_bits > 16) throw OpError("num_bits must be between 2 and 16, inclusive");
}

FakeQuantGrid CheckArgsRange(float min, float max, const FakeQuantBits& bits) {
  min = FlushDenormal(min);
  max = FlushDenormal(max);
  if (!(min < max)) {
    throw OpError("min has to be smaller than max, was: " + FloatString(min) + " >= " + FloatString(max));
  }
  return NudgeFakeQuantRange(min, max, bits.quant_min, bits.quant_max);
}

void CheckArgsGradientShapes(const std::vector<int64_t>& gradients, const std::vector<int64_t>& inputs) {
  if (gradients != inputs) {
    throw OpError(
        "Inputs to operation FakeQuantWithMinMaxArgsGradient of type FakeQuantWithMinMaxArgsGradient must have the "
        "same size and shape.  Input 0: " + ShapeString(gradients) + " != input 1: " + ShapeString(inputs));
  }
}

void CheckScalarRange(const std::vector<int64_t>& shape, const char* name) {
  if (!shape.empty()) {
    throw OpError(std::string("`") + name + "` must be rank 0 but is rank " + std::to_string(shape.size()));
  }
}

FakeQuantChannels CheckChannelRanges(const std::vector<int64_t>& inputs, const std::vector<int64_t>& min,
                                     const std::vector<int64_t>& max, int64_t axis) {
  if (inputs.empty()) throw OpError("input must be at least rank 1");
  const int64_t rank = static_cast<int64_t>(inputs.size());
  // `axis` is not TF's (spec deviation); checked after TF's own rank rule, before the sizes it selects.
  if (axis != -1 && (axis < 0 || axis >= rank)) {
    throw OpError("attribute axis must be -1 or in [0, rank) = [0, " + std::to_string(rank) + "), was " +
                  std::to_string(axis));
  }
  const int64_t channel_dim = axis == -1 ? rank - 1 : axis;
  FakeQuantChannels view;
  view.depth = inputs[channel_dim];
  for (int64_t i = 0; i < channel_dim; ++i) view.outer *= inputs[i];
  for (int64_t i = channel_dim + 1; i < rank; ++i) view.inner *= inputs[i];
  for (const auto* t : {&min, &max}) {
    const char* name = t == &min ? "min" : "max";
    if (t->size() != 1) {
      throw OpError(std::string("`") + name + "` must be rank 1 but is rank " + std::to_string(t->size()));
    }
    if ((*t)[0] != view.depth) {
      throw OpError(std::string(name) + " has incorrect size, expected " + std::to_string(view.depth) + " was " +
                    std::to_string((*t)[0]));
    }
  }
  return view;
}

}  // namespace tfops

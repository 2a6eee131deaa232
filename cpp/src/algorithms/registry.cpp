// The table of built-in algorithms. Each algorithm file defines one AlgorithmImpl constant.
#include "internal/comm_state.hpp"

namespace fourd::detail {

extern const AlgorithmImpl kFlatAlgorithm;

const AlgorithmImpl* algorithmImpl(Algorithm a) {
  switch (a) {
    case Algorithm::kFlat: return &kFlatAlgorithm;
    default: return nullptr;
  }
}

}  // namespace fourd::detail

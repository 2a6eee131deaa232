// The table of built-in algorithms. Each algorithm file defines one AlgorithmImpl constant;
// docs/algorithms.md describes them (phases, bytes per rank, cost).
#include "internal/group.hpp"

namespace fourd::detail {

extern const AlgorithmImpl kFlatAlgorithm;
extern const AlgorithmImpl kRingAlgorithm;
extern const AlgorithmImpl kRhdAlgorithm;
extern const AlgorithmImpl kHierarchicalAlgorithm;
extern const AlgorithmImpl kShmAlgorithm;

bool shapeSupports(Collective c, Algorithm a, const Group& g, std::string* reason) {
  return isSupported(c, a, g.shape(), reason);
}

const AlgorithmImpl* algorithmImpl(Algorithm a) {
  switch (a) {
    case Algorithm::kFlat:
      return &kFlatAlgorithm;
    case Algorithm::kRing:
      return &kRingAlgorithm;
    case Algorithm::kRhd:
      return &kRhdAlgorithm;
    case Algorithm::kHierarchical:
      return &kHierarchicalAlgorithm;
    case Algorithm::kShm:
      return &kShmAlgorithm;
    default:
      return nullptr;
  }
}

}  // namespace fourd::detail

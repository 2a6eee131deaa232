// The table of built-in algorithms. Each algorithm file defines one AlgorithmImpl constant;
// docs/algorithms.md describes them (phases, bytes per rank, cost).
#include "algorithms/levels.hpp"
#include "internal/comm_state.hpp"

namespace fourd::detail {

extern const AlgorithmImpl kFlatAlgorithm;
extern const AlgorithmImpl kRingAlgorithm;
extern const AlgorithmImpl kRhdAlgorithm;
extern const AlgorithmImpl kHierarchicalAlgorithm;
extern const AlgorithmImpl kShmAlgorithm;

bool shapeSupports(Collective c, Algorithm a, const CommState& s, std::string* reason) {
  GroupShape shape;
  shape.size = s.topo.size;
  shape.nodes = s.topo.numNodes;
  shape.uniform = s.topo.uniform;
  shape.ranksPerNode = s.topo.uniform ? s.topo.k : 0;
  return isSupported(c, a, shape, reason);
}

const AlgorithmImpl* algorithmImpl(Algorithm a) {
  switch (a) {
    case Algorithm::kFlat: return &kFlatAlgorithm;
    case Algorithm::kRing: return &kRingAlgorithm;
    case Algorithm::kRhd: return &kRhdAlgorithm;
    case Algorithm::kHierarchical: return &kHierarchicalAlgorithm;
    case Algorithm::kShm: return &kShmAlgorithm;
    default: return nullptr;
  }
}

}  // namespace fourd::detail

#include "fourd/topology.hpp"

#include <map>
#include <sstream>

#include "fourd/error.hpp"

namespace fourd {

int GroupTopology::memberAt(int node, int local) const {
  for (int g = 0; g < size; ++g)
    if (nodeIndex[g] == node && localIndex[g] == local) return g;
  return -1;
}

std::string GroupTopology::describe() const {
  std::ostringstream os;
  if (uniform) {
    os << numNodes << (numNodes == 1 ? " node" : " nodes") << " x " << k
       << (k == 1 ? " rank" : " ranks");
  } else {
    os << "uneven: ";
    for (int i = 0; i < numNodes; ++i) os << (i ? "+" : "") << ranksPerNode[i];
    os << " ranks on " << numNodes << " nodes";
  }
  return os.str();
}

Topology::Topology(std::vector<int> nodeOfRank) {
  if (nodeOfRank.empty()) throw InvalidArgument("topology: expected at least one rank, found 0");
  std::map<int, int> renumber;
  node_.resize(nodeOfRank.size());
  local_.resize(nodeOfRank.size());
  for (size_t r = 0; r < nodeOfRank.size(); ++r) {
    auto it = renumber.find(nodeOfRank[r]);
    if (it == renumber.end()) {
      it = renumber.emplace(nodeOfRank[r], static_cast<int>(renumber.size())).first;
      count_.push_back(0);
    }
    node_[r] = it->second;
    local_[r] = count_[it->second]++;
  }
  numNodes_ = static_cast<int>(count_.size());
}

Topology Topology::fromRanksPerNode(int worldSize, int ranksPerNode) {
  if (ranksPerNode < 1) {
    throw InvalidArgument("ranks_per_node: expected an integer >= 1, found " +
                          std::to_string(ranksPerNode));
  }
  std::vector<int> node(worldSize);
  for (int r = 0; r < worldSize; ++r) node[r] = r / ranksPerNode;
  return Topology(node);
}

GroupTopology Topology::group(const std::vector<int>& worldRanks) const {
  GroupTopology g;
  g.size = static_cast<int>(worldRanks.size());
  g.nodeIndex.resize(g.size);
  g.localIndex.resize(g.size);
  std::map<int, int> nodeIdx;
  for (int i = 0; i < g.size; ++i) {
    const int node = nodeOf(worldRanks[i]);
    auto it = nodeIdx.find(node);
    if (it == nodeIdx.end()) {
      it = nodeIdx.emplace(node, static_cast<int>(nodeIdx.size())).first;
      g.ranksPerNode.push_back(0);
    }
    g.nodeIndex[i] = it->second;
    g.localIndex[i] = g.ranksPerNode[it->second]++;
  }
  g.numNodes = static_cast<int>(g.ranksPerNode.size());
  g.uniform = true;
  for (int c : g.ranksPerNode) g.uniform = g.uniform && (c == g.ranksPerNode[0]);
  g.k = g.uniform && g.numNodes > 0 ? g.ranksPerNode[0] : 0;
  return g;
}

}  // namespace fourd

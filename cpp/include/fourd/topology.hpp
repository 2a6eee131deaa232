// Which ranks share a node: pure arithmetic over a node id per world rank.
//
// The node ids come from MPI (MPI_Comm_split_type shared, see Grid) or from a virtual split of
// one machine into nodes of `ranks_per_node` consecutive world ranks (FOURD_RANKS_PER_NODE), so
// the hierarchical paths run on one machine.
#pragma once

#include <string>
#include <vector>

namespace fourd {

/// The two-level topology of one group of ranks (k ranks per node on N nodes when uniform).
struct GroupTopology {
  int size = 0;                   ///< ranks in the group
  int numNodes = 0;               ///< N: distinct nodes holding group members
  std::vector<int> nodeIndex;     ///< per group rank: its node, 0..N-1 in order of first appearance
  std::vector<int> localIndex;    ///< per group rank: its position among the members on its node
  std::vector<int> ranksPerNode;  ///< per node index: how many members it holds
  bool uniform = false;           ///< every node holds the same number of members
  int k = 0;                      ///< members per node when uniform, else 0

  /// Group rank of the member with (node, local) = (n, l); -1 if none.
  int memberAt(int node, int local) const;
  /// "N nodes x k ranks" or "uneven: 3+1 ranks on 2 nodes".
  std::string describe() const;
};

/// Node of every world rank.
class Topology {
 public:
  /// `nodeOfRank[r]` is any id of the node of world rank r; ids are renumbered 0..N-1 in order
  /// of first appearance. Throws InvalidArgument on an empty vector.
  explicit Topology(std::vector<int> nodeOfRank);

  /// Virtual nodes of `ranksPerNode` consecutive world ranks (the last may be smaller).
  /// Throws InvalidArgument when ranksPerNode < 1.
  static Topology fromRanksPerNode(int worldSize, int ranksPerNode);

  int worldSize() const noexcept { return static_cast<int>(node_.size()); }
  int numNodes() const noexcept { return numNodes_; }
  int nodeOf(int worldRank) const { return node_.at(worldRank); }
  /// Index of `worldRank` among the world ranks on its node (ascending world rank).
  int localRank(int worldRank) const { return local_.at(worldRank); }
  /// World ranks on `node`, ascending.
  int ranksOnNode(int node) const { return count_.at(node); }

  /// Topology of the group whose members are `worldRanks` (in group-rank order).
  GroupTopology group(const std::vector<int>& worldRanks) const;

 private:
  std::vector<int> node_;
  std::vector<int> local_;
  std::vector<int> count_;
  int numNodes_ = 0;
};

}  // namespace fourd

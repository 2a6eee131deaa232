// The 4D process grid: pure rank arithmetic, no MPI.
//
// Four named axes x, y, z, data (AxoNN's Gx, Gy, Gz, Gdata). An order lists the axes innermost
// first: with the default "x-y-z-data", x varies fastest over world ranks, so the x ranks of a
// group are consecutive world ranks (as in AxoNN and Megatron's "tp-...-dp").
//
//   world_rank = sum over axes a of coord[a] * stride[a],
//   stride[order[0]] = 1, stride[order[i]] = stride[order[i-1]] * size[order[i-1]].
//
// A group along a set of axes (an AxisMask) holds the ranks that share every coordinate outside
// the set. Its members are ordered as in the grid: the innermost axis of the set varies fastest.
#pragma once

#include <array>
#include <string>
#include <vector>

namespace fourd {

enum class Axis : int { kX = 0, kY = 1, kZ = 2, kData = 3 };

inline constexpr int kNumAxes = 4;

/// A set of axes as a bit mask: bit i is Axis(i). kWorldMask is all four.
using AxisMask = unsigned;
inline constexpr AxisMask kWorldMask = 0xF;

constexpr AxisMask maskOf(Axis a) { return 1u << static_cast<int>(a); }

/// "x", "y", "z", "data".
const char* axisName(Axis a);

/// "x", "z+data", "world" (all four), "none" for 0.
std::string maskName(AxisMask m);

/// Parses "x", "y", "z", "data", "world", or a '+'-joined combination ("z+data").
/// Throws InvalidArgument naming `argName`.
AxisMask parseAxisMask(const std::string& s, const char* argName = "axis");

/// The grid. Immutable; copyable.
class ProcessGrid {
 public:
  /// `sizes` indexed by Axis; `order` lists all four axes innermost first.
  /// Throws InvalidArgument for a size < 1 or an order that is not a permutation.
  ProcessGrid(std::array<int, kNumAxes> sizes, std::array<Axis, kNumAxes> order);

  /// Parses an order string such as "x-y-z-data" (innermost first). Throws InvalidArgument.
  static std::array<Axis, kNumAxes> parseOrder(const std::string& s);
  static std::string orderName(const std::array<Axis, kNumAxes>& order);

  int worldSize() const noexcept { return worldSize_; }
  int size(Axis a) const noexcept { return sizes_[static_cast<int>(a)]; }
  int stride(Axis a) const noexcept { return strides_[static_cast<int>(a)]; }
  const std::array<int, kNumAxes>& sizes() const noexcept { return sizes_; }
  const std::array<Axis, kNumAxes>& order() const noexcept { return order_; }
  std::string orderName() const { return orderName(order_); }

  /// Coordinates of a world rank, indexed by Axis. Throws InvalidArgument if out of range.
  std::array<int, kNumAxes> coords(int worldRank) const;
  /// World rank of coordinates indexed by Axis. Throws InvalidArgument if out of range.
  int rankOf(const std::array<int, kNumAxes>& coords) const;

  /// Number of ranks in a group along `mask` (product of the sizes of its axes; 1 for mask 0).
  int groupSize(AxisMask mask) const noexcept;
  /// Position of `worldRank` inside its group along `mask` (the group rank).
  int groupRank(int worldRank, AxisMask mask) const;
  /// Which group along `mask` holds `worldRank` (0 .. worldSize/groupSize - 1). Used as the
  /// MPI_Comm_split colour; groupRank is the key.
  int groupColor(int worldRank, AxisMask mask) const;
  /// World ranks of the group along `mask` that holds `worldRank`, in group-rank order.
  std::vector<int> groupRanks(int worldRank, AxisMask mask) const;

 private:
  std::array<int, kNumAxes> sizes_;
  std::array<Axis, kNumAxes> order_;
  std::array<int, kNumAxes> strides_;
  int worldSize_;
};

}  // namespace fourd

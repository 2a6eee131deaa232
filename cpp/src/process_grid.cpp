#include "fourd/process_grid.hpp"

#include <sstream>

#include "fourd/error.hpp"

namespace fourd {

const char* axisName(Axis a) {
  switch (a) {
    case Axis::kX:
      return "x";
    case Axis::kY:
      return "y";
    case Axis::kZ:
      return "z";
    case Axis::kData:
      return "data";
  }
  return "?";
}

std::string maskName(AxisMask m) {
  if (m == 0) return "none";
  if (m == kWorldMask) return "world";
  std::string s;
  for (int i = 0; i < kNumAxes; ++i) {
    if (m & (1u << i)) {
      if (!s.empty()) s += "+";
      s += axisName(static_cast<Axis>(i));
    }
  }
  return s;
}

static bool parseOneAxis(const std::string& s, Axis* out) {
  if (s == "x")
    *out = Axis::kX;
  else if (s == "y")
    *out = Axis::kY;
  else if (s == "z")
    *out = Axis::kZ;
  else if (s == "data")
    *out = Axis::kData;
  else
    return false;
  return true;
}

AxisMask parseAxisMask(const std::string& s, const char* argName) {
  if (s == "world") return kWorldMask;
  AxisMask m = 0;
  size_t start = 0;
  while (true) {
    size_t p = s.find('+', start);
    std::string tok = s.substr(start, p == std::string::npos ? std::string::npos : p - start);
    Axis a;
    if (!parseOneAxis(tok, &a)) {
      throw InvalidArgument(std::string(argName) +
                            ": expected 'x', 'y', 'z', 'data', 'world' or a combination such "
                            "as 'z+data'; found '" +
                            s + "'");
    }
    if (m & maskOf(a)) {
      throw InvalidArgument(std::string(argName) + ": axis '" + tok + "' appears twice in '" + s +
                            "'");
    }
    m |= maskOf(a);
    if (p == std::string::npos) break;
    start = p + 1;
  }
  return m;
}

ProcessGrid::ProcessGrid(std::array<int, kNumAxes> sizes, std::array<Axis, kNumAxes> order)
    : sizes_(sizes), order_(order) {
  for (int i = 0; i < kNumAxes; ++i) {
    if (sizes_[i] < 1) {
      throw InvalidArgument(std::string(axisName(static_cast<Axis>(i))) +
                            ": expected a grid size >= 1, found " + std::to_string(sizes_[i]));
    }
  }
  unsigned seen = 0;
  for (Axis a : order_) seen |= maskOf(a);
  if (seen != kWorldMask) {
    throw InvalidArgument("order: expected a permutation of x, y, z, data; found '" +
                          orderName(order_) + "'");
  }
  long long stride = 1;
  for (Axis a : order_) {
    strides_[static_cast<int>(a)] = static_cast<int>(stride);
    stride *= sizes_[static_cast<int>(a)];
    if (stride > (1LL << 30)) throw InvalidArgument("grid: world size too large");
  }
  worldSize_ = static_cast<int>(stride);
}

std::array<Axis, kNumAxes> ProcessGrid::parseOrder(const std::string& s) {
  std::array<Axis, kNumAxes> out{};
  int n = 0;
  unsigned seen = 0;
  size_t start = 0;
  const char* expected =
      "order: expected the four axes x, y, z, data joined by '-', innermost first (for example "
      "'x-y-z-data'); found '";
  while (true) {
    size_t p = s.find('-', start);
    std::string tok = s.substr(start, p == std::string::npos ? std::string::npos : p - start);
    Axis a;
    if (!parseOneAxis(tok, &a) || n >= kNumAxes || (seen & maskOf(a))) {
      throw InvalidArgument(expected + s + "'");
    }
    seen |= maskOf(a);
    out[n++] = a;
    if (p == std::string::npos) break;
    start = p + 1;
  }
  if (n != kNumAxes) throw InvalidArgument(expected + s + "'");
  return out;
}

std::string ProcessGrid::orderName(const std::array<Axis, kNumAxes>& order) {
  std::string s;
  for (int i = 0; i < kNumAxes; ++i) {
    if (i) s += "-";
    s += axisName(order[i]);
  }
  return s;
}

std::array<int, kNumAxes> ProcessGrid::coords(int worldRank) const {
  if (worldRank < 0 || worldRank >= worldSize_) {
    throw InvalidArgument("rank: expected 0 <= rank < " + std::to_string(worldSize_) + ", found " +
                          std::to_string(worldRank));
  }
  std::array<int, kNumAxes> c{};
  for (int i = 0; i < kNumAxes; ++i) c[i] = (worldRank / strides_[i]) % sizes_[i];
  return c;
}

int ProcessGrid::rankOf(const std::array<int, kNumAxes>& c) const {
  int r = 0;
  for (int i = 0; i < kNumAxes; ++i) {
    if (c[i] < 0 || c[i] >= sizes_[i]) {
      throw InvalidArgument(std::string("coords: expected 0 <= ") + axisName(static_cast<Axis>(i)) +
                            " < " + std::to_string(sizes_[i]) + ", found " + std::to_string(c[i]));
    }
    r += c[i] * strides_[i];
  }
  return r;
}

int ProcessGrid::groupSize(AxisMask mask) const noexcept {
  int n = 1;
  for (int i = 0; i < kNumAxes; ++i)
    if (mask & (1u << i)) n *= sizes_[i];
  return n;
}

int ProcessGrid::groupRank(int worldRank, AxisMask mask) const {
  const auto c = coords(worldRank);
  int r = 0, mult = 1;
  for (Axis a : order_) {  // innermost first: varies fastest
    if (mask & maskOf(a)) {
      r += c[static_cast<int>(a)] * mult;
      mult *= sizes_[static_cast<int>(a)];
    }
  }
  return r;
}

int ProcessGrid::groupColor(int worldRank, AxisMask mask) const {
  return groupRank(worldRank, kWorldMask & ~mask);
}

std::vector<int> ProcessGrid::groupRanks(int worldRank, AxisMask mask) const {
  auto base = coords(worldRank);
  const int n = groupSize(mask);
  std::vector<int> out(n);
  for (int g = 0; g < n; ++g) {
    auto c = base;
    int rem = g;
    for (Axis a : order_) {
      if (mask & maskOf(a)) {
        const int i = static_cast<int>(a);
        c[i] = rem % sizes_[i];
        rem /= sizes_[i];
      }
    }
    out[g] = rankOf(c);
  }
  return out;
}

}  // namespace fourd

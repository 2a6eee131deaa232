// Shared by the unit and multi-rank C++ suites: the 4D grid shapes a test sweeps.
#pragma once

#include <array>
#include <vector>

namespace fourd::test {

/// Every {x, y, z, data} with x * y * z * data == n, in increasing order of (x, y, z).
inline std::vector<std::array<int, 4>> gridShapes(int n) {
  std::vector<std::array<int, 4>> out;
  for (int x = 1; x <= n; ++x)
    for (int y = 1; y <= n; ++y)
      for (int z = 1; z <= n; ++z)
        if (n % (x * y * z) == 0) out.push_back({x, y, z, n / (x * y * z)});
  return out;
}

}  // namespace fourd::test

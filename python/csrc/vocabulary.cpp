// The one vocabulary of fourd, exported from C++: dtypes, reduce ops, algorithms, collectives
// and axes, with their parsers, and the pure rank arithmetic (ProcessGrid, Topology) that needs
// no MPI. Python reads every name from here and keeps no copy (tests/python/test_structure.py
// checks that).
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <string>
#include <vector>

#include "bindings.hpp"
#include "fourd/cost_model.hpp"
#include "fourd/data_type.hpp"
#include "fourd/error.hpp"
#include "fourd/process_grid.hpp"
#include "fourd/topology.hpp"

namespace py = pybind11;

namespace fourd_py {

namespace {

// An axis argument: a mask (int) or a name such as "x", "z+data", "world".
fourd::AxisMask maskArg(const py::handle& axis) {
  if (py::isinstance<py::str>(axis)) return fourd::parseAxisMask(axis.cast<std::string>());
  if (py::isinstance<py::int_>(axis) && !py::isinstance<py::bool_>(axis)) {
    const long long m = axis.cast<long long>();
    if (m < 1 || m > static_cast<long long>(fourd::kWorldMask)) {
      throw fourd::InvalidArgument("axis: expected a mask 1..15, found " + std::to_string(m));
    }
    return static_cast<fourd::AxisMask>(m);
  }
  throw fourd::InvalidArgument(
      "axis: expected an axis name such as 'x' or 'z+data', or a mask; "
      "found " +
      py::repr(axis).cast<std::string>());
}

py::tuple names(int n, const char* (*name)(int)) {
  py::list out;
  for (int i = 0; i < n; ++i) out.append(name(i));
  return py::tuple(out);
}

py::dict groupTopologyDict(const fourd::GroupTopology& t) {
  py::dict d;
  d["size"] = t.size;
  d["num_nodes"] = t.numNodes;
  d["ranks_per_node"] = t.ranksPerNode;
  d["node_index"] = t.nodeIndex;
  d["local_index"] = t.localIndex;
  d["uniform"] = t.uniform;
  d["k"] = t.k;
  d["description"] = t.describe();
  return d;
}

void bindNames(py::module_& m) {
  m.attr("DTYPES") = names(fourd::kNumDataTypes, [](int i) {
    return fourd::detail::dataTypeName(static_cast<fourd::DataType>(i));
  });
  py::list sizes, floating;
  for (int i = 0; i < fourd::kNumDataTypes; ++i) {
    const auto t = static_cast<fourd::DataType>(i);
    sizes.append(fourd::dataTypeSize(t));
    if (fourd::isFloating(t)) floating.append(fourd::detail::dataTypeName(t));
  }
  m.attr("DTYPE_SIZES") = py::tuple(sizes);
  m.attr("FLOATING_DTYPES") = py::tuple(floating);
  m.attr("OPS") = names(fourd::kNumReduceOps, [](int i) {
    return fourd::detail::reduceOpName(static_cast<fourd::ReduceOp>(i));
  });
  m.attr("ALGORITHMS") = names(fourd::kNumAlgorithms, [](int i) {
    return fourd::algorithmName(static_cast<fourd::Algorithm>(i));
  });
  m.attr("COLLECTIVES") = names(fourd::kNumCollectives, [](int i) {
    return fourd::collectiveName(static_cast<fourd::Collective>(i));
  });
  m.attr("AXES") =
      names(fourd::kNumAxes, [](int i) { return fourd::axisName(static_cast<fourd::Axis>(i)); });
  m.attr("WORLD_MASK") = fourd::kWorldMask;

  m.def(
      "parse_dtype",
      [](const std::string& s, const std::string& arg) {
        return static_cast<int>(fourd::parseDataType(s, arg.c_str()));
      },
      py::arg("name"), py::arg("arg") = "dtype",
      "Code of a dtype name or alias ('bf16', 'half', ...); InvalidArgumentError otherwise.");
  m.def(
      "parse_op",
      [](const std::string& s, const std::string& arg) {
        return static_cast<int>(fourd::parseReduceOp(s, arg.c_str()));
      },
      py::arg("name"), py::arg("arg") = "op",
      "Code of a reduce op name or alias ('product', 'mean').");
  m.def(
      "parse_algorithm",
      [](const std::string& s, const std::string& arg) {
        return static_cast<int>(fourd::parseAlgorithm(s, arg.c_str()));
      },
      py::arg("name"), py::arg("arg") = "algorithm", "Code of an algorithm name.");
  m.def(
      "parse_collective",
      [](const std::string& s, const std::string& arg) {
        return static_cast<int>(fourd::parseCollective(s, arg.c_str()));
      },
      py::arg("name"), py::arg("arg") = "collective", "Code of a collective name.");
  m.def(
      "parse_axis",
      [](const std::string& s, const std::string& arg) {
        return fourd::parseAxisMask(s, arg.c_str());
      },
      py::arg("name"), py::arg("arg") = "axis",
      "Mask of 'x', 'z+data', 'world', ...; a repeated axis is an error.");
  m.def("mask_name", [](unsigned mask) { return fourd::maskName(mask); }, py::arg("mask"));
  m.def(
      "parse_order",
      [](const std::string& s) {
        return fourd::ProcessGrid::orderName(fourd::ProcessGrid::parseOrder(s));
      },
      py::arg("order"), "The canonical form of an order such as 'x-y-z-data' (innermost first).");
}

void bindProcessGrid(py::module_& m) {
  using fourd::ProcessGrid;
  py::class_<ProcessGrid>(m, "ProcessGrid",
                          "The 4D grid's rank arithmetic, without MPI (process_grid.hpp). Axis "
                          "arguments are names ('x', 'z+data', 'world') or masks.")
      .def(py::init([](const std::vector<int>& sizes, const std::string& order) {
             if (sizes.size() != static_cast<size_t>(fourd::kNumAxes)) {
               throw fourd::InvalidArgument("sizes: expected 4 sizes (x, y, z, data), found " +
                                            std::to_string(sizes.size()));
             }
             return ProcessGrid({sizes[0], sizes[1], sizes[2], sizes[3]},
                                ProcessGrid::parseOrder(order));
           }),
           py::arg("sizes"), py::arg("order") = "x-y-z-data")
      .def_property_readonly("world_size", &ProcessGrid::worldSize)
      .def_property_readonly(
          "sizes",
          [](const ProcessGrid& g) { return std::vector<int>(g.sizes().begin(), g.sizes().end()); })
      .def_property_readonly("order", [](const ProcessGrid& g) { return g.orderName(); })
      .def(
          "stride",
          [](const ProcessGrid& g, const std::string& axis) {
            return g.stride(static_cast<fourd::Axis>(__builtin_ctz(fourd::parseAxisMask(axis))));
          },
          py::arg("axis"))
      .def(
          "coords",
          [](const ProcessGrid& g, int r) {
            auto c = g.coords(r);
            return std::vector<int>(c.begin(), c.end());
          },
          py::arg("world_rank"))
      .def(
          "rank_of",
          [](const ProcessGrid& g, const std::vector<int>& c) {
            if (c.size() != 4) throw fourd::InvalidArgument("coords: expected 4 coordinates");
            return g.rankOf({c[0], c[1], c[2], c[3]});
          },
          py::arg("coords"))
      .def(
          "group_size",
          [](const ProcessGrid& g, const py::object& axis) { return g.groupSize(maskArg(axis)); },
          py::arg("axis"))
      .def(
          "group_rank",
          [](const ProcessGrid& g, int r, const py::object& axis) {
            return g.groupRank(r, maskArg(axis));
          },
          py::arg("world_rank"), py::arg("axis"))
      .def(
          "group_color",
          [](const ProcessGrid& g, int r, const py::object& axis) {
            return g.groupColor(r, maskArg(axis));
          },
          py::arg("world_rank"), py::arg("axis"))
      .def(
          "group_ranks",
          [](const ProcessGrid& g, int r, const py::object& axis) {
            return g.groupRanks(r, maskArg(axis));
          },
          py::arg("world_rank"), py::arg("axis"))
      .def("__repr__", [](const ProcessGrid& g) {
        const auto& s = g.sizes();
        return "ProcessGrid(x=" + std::to_string(s[0]) + ", y=" + std::to_string(s[1]) +
               ", z=" + std::to_string(s[2]) + ", data=" + std::to_string(s[3]) + ", order='" +
               g.orderName() + "')";
      });
}

void bindTopology(py::module_& m) {
  using fourd::Topology;
  py::class_<Topology>(m, "Topology", "Which world ranks share a node (topology.hpp), no MPI.")
      .def(py::init<std::vector<int>>(), py::arg("node_of_rank"))
      .def_static("from_ranks_per_node", &Topology::fromRanksPerNode, py::arg("world_size"),
                  py::arg("ranks_per_node"))
      .def_property_readonly("world_size", &Topology::worldSize)
      .def_property_readonly("num_nodes", &Topology::numNodes)
      .def("node_of", &Topology::nodeOf, py::arg("world_rank"))
      .def("local_rank", &Topology::localRank, py::arg("world_rank"))
      .def("ranks_on_node", &Topology::ranksOnNode, py::arg("node"))
      .def(
          "group",
          [](const Topology& t, const std::vector<int>& ranks) {
            return groupTopologyDict(t.group(ranks));
          },
          py::arg("world_ranks"),
          "The two-level shape of a group: num_nodes, k, uniform, node_index, local_index, "
          "description.");
}

}  // namespace

py::dict topologyDict(const fourd::GroupTopology& t) { return groupTopologyDict(t); }

void register_vocabulary(py::module_& m) {
  bindNames(m);
  bindProcessGrid(m);
  bindTopology(m);
}

}  // namespace fourd_py

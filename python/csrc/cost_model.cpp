// Bindings of the cost model (cost_model.hpp): MachineProfile, GroupShape, Prediction and
// predict / candidates / choose / is_supported. Collectives, algorithms and dtypes cross as
// their names ("all_gather", "hierarchical", "bfloat16"); C++ camelCase becomes snake_case.
// The planner (python -m fourd.plan) calls these, so `auto` and the planner share one model.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <sstream>
#include <string>
#include <utility>

#include "bindings.hpp"
#include "fourd/cost_model.hpp"
#include "fourd/data_type.hpp"
#include "fourd/error.hpp"

namespace py = pybind11;
using fourd::GroupShape;
using fourd::MachineProfile;
using fourd::Prediction;

namespace {

std::string profileRepr(const MachineProfile& p) {
  std::ostringstream os;
  os << "MachineProfile(name='" << p.name << "', ranks_per_node=" << p.ranksPerNode
     << ", intra_alpha=" << p.intraAlpha << ", intra_bw=" << p.intraBw
     << ", inter_alpha=" << p.interAlpha << ", nic_bw=" << p.nicBw
     << ", nics_per_node=" << p.nicsPerNode << ", reduce_bw=" << p.reduceBw
     << ", memcpy_bw=" << p.memcpyBw << ", flat_efficiency=" << p.flatEfficiency
     << ", compute_flops=" << p.computeFlops << ", memory_bytes=" << p.memoryBytes
     << ", intra_mesh=" << (p.intraMesh ? "True" : "False")
     << ", hierarchical_chunks=" << p.hierarchicalChunks << ", shm_bw=" << p.shmBw << ")";
  return os.str();
}

size_t checkedBytes(long long nbytes) {
  if (nbytes < 0) {
    throw fourd::InvalidArgument("nbytes: expected a byte count >= 0; found " +
                                 std::to_string(nbytes));
  }
  return static_cast<size_t>(nbytes);
}

}  // namespace

void register_cost_model(py::module_& m) {
  const MachineProfile d;  // defaults for the keyword constructor

  py::class_<MachineProfile>(m, "MachineProfile",
                             "Costs of one machine for the alpha-beta-gamma model. Seconds and "
                             "bytes per second (1e9 = 1 GB/s).")
      .def(py::init([](std::string name, int ranksPerNode, double intraAlpha, double intraBw,
                       double interAlpha, double nicBw, int nicsPerNode, double reduceBw,
                       double memcpyBw, double flatEfficiency, double computeFlops,
                       double memoryBytes, bool intraMesh, int hierarchicalChunks,
                       double shmBw) {
             MachineProfile p;
             p.name = std::move(name);
             p.ranksPerNode = ranksPerNode;
             p.intraAlpha = intraAlpha;
             p.intraBw = intraBw;
             p.interAlpha = interAlpha;
             p.nicBw = nicBw;
             p.nicsPerNode = nicsPerNode;
             p.reduceBw = reduceBw;
             p.memcpyBw = memcpyBw;
             p.flatEfficiency = flatEfficiency;
             p.computeFlops = computeFlops;
             p.memoryBytes = memoryBytes;
             p.intraMesh = intraMesh;
             p.hierarchicalChunks = hierarchicalChunks;
             p.shmBw = shmBw;
             return p;
           }),
           py::kw_only(), py::arg("name") = d.name, py::arg("ranks_per_node") = d.ranksPerNode,
           py::arg("intra_alpha") = d.intraAlpha, py::arg("intra_bw") = d.intraBw,
           py::arg("inter_alpha") = d.interAlpha, py::arg("nic_bw") = d.nicBw,
           py::arg("nics_per_node") = d.nicsPerNode, py::arg("reduce_bw") = d.reduceBw,
           py::arg("memcpy_bw") = d.memcpyBw, py::arg("flat_efficiency") = d.flatEfficiency,
           py::arg("compute_flops") = d.computeFlops, py::arg("memory_bytes") = d.memoryBytes,
           py::arg("intra_mesh") = d.intraMesh,
           py::arg("hierarchical_chunks") = d.hierarchicalChunks, py::arg("shm_bw") = d.shmBw)
      .def_readwrite("name", &MachineProfile::name)
      .def_readwrite("ranks_per_node", &MachineProfile::ranksPerNode)
      .def_readwrite("intra_alpha", &MachineProfile::intraAlpha)
      .def_readwrite("intra_bw", &MachineProfile::intraBw)
      .def_readwrite("inter_alpha", &MachineProfile::interAlpha)
      .def_readwrite("nic_bw", &MachineProfile::nicBw)
      .def_readwrite("nics_per_node", &MachineProfile::nicsPerNode)
      .def_readwrite("reduce_bw", &MachineProfile::reduceBw)
      .def_readwrite("memcpy_bw", &MachineProfile::memcpyBw)
      .def_readwrite("flat_efficiency", &MachineProfile::flatEfficiency)
      .def_readwrite("compute_flops", &MachineProfile::computeFlops)
      .def_readwrite("memory_bytes", &MachineProfile::memoryBytes)
      .def_readwrite("intra_mesh", &MachineProfile::intraMesh)
      .def_readwrite("hierarchical_chunks", &MachineProfile::hierarchicalChunks)
      .def_readwrite("shm_bw", &MachineProfile::shmBw)
      .def("node_injection_bw", &MachineProfile::nodeInjectionBw,
           "nic_bw * nics_per_node, bytes/s")
      .def("__repr__", &profileRepr);

  py::class_<GroupShape>(m, "GroupShape",
                         "How a group is placed: `size` ranks on `nodes` nodes, "
                         "`ranks_per_node` each when uniform.")
      .def(py::init([](int size, int nodes, int ranksPerNode, bool uniform) {
             return GroupShape{size, nodes, ranksPerNode, uniform};
           }),
           py::arg("size") = 1, py::arg("nodes") = 1, py::arg("ranks_per_node") = 1,
           py::arg("uniform") = true)
      .def_readwrite("size", &GroupShape::size)
      .def_readwrite("nodes", &GroupShape::nodes)
      .def_readwrite("ranks_per_node", &GroupShape::ranksPerNode)
      .def_readwrite("uniform", &GroupShape::uniform)
      .def("__repr__", [](const GroupShape& s) {
        return "GroupShape(size=" + std::to_string(s.size) + ", nodes=" +
               std::to_string(s.nodes) + ", ranks_per_node=" + std::to_string(s.ranksPerNode) +
               ", uniform=" + (s.uniform ? "True" : "False") + ")";
      });

  py::class_<Prediction>(m, "Prediction", "One candidate of a selection.")
      .def_property_readonly("algorithm",
                             [](const Prediction& p) { return fourd::algorithmName(p.algorithm); })
      .def_readonly("seconds", &Prediction::seconds)
      .def_readonly("supported", &Prediction::supported)
      .def_readonly("reason", &Prediction::reason)
      .def("__repr__", [](const Prediction& p) {
        std::ostringstream os;
        os << "Prediction(algorithm='" << fourd::algorithmName(p.algorithm)
           << "', seconds=" << p.seconds << ", supported=" << (p.supported ? "True" : "False")
           << ", reason='" << p.reason << "')";
        return os.str();
      });

  m.def(
      "predict",
      [](const std::string& collective, const std::string& algorithm, long long nbytes,
         const std::string& dtype, const GroupShape& shape, const MachineProfile& profile) {
        return fourd::predict(fourd::parseCollective(collective),
                              fourd::parseAlgorithm(algorithm), checkedBytes(nbytes),
                              fourd::parseDataType(dtype), shape, profile);
      },
      py::arg("collective"), py::arg("algorithm"), py::arg("nbytes"), py::arg("dtype"),
      py::arg("shape"), py::arg("profile"),
      "Predicted seconds of one collective; inf when the algorithm cannot run on the shape.");
  m.def(
      "candidates",
      [](const std::string& collective, long long nbytes, const std::string& dtype,
         const GroupShape& shape, const MachineProfile& profile) {
        return fourd::candidates(fourd::parseCollective(collective), checkedBytes(nbytes),
                                 fourd::parseDataType(dtype), shape, profile);
      },
      py::arg("collective"), py::arg("nbytes"), py::arg("dtype"), py::arg("shape"),
      py::arg("profile"), "Every concrete algorithm with its prediction, in enum order.");
  m.def(
      "choose",
      [](const std::string& collective, long long nbytes, const std::string& dtype,
         const GroupShape& shape, const MachineProfile& profile) {
        return std::string(fourd::algorithmName(
            fourd::choose(fourd::parseCollective(collective), checkedBytes(nbytes),
                          fourd::parseDataType(dtype), shape, profile)));
      },
      py::arg("collective"), py::arg("nbytes"), py::arg("dtype"), py::arg("shape"),
      py::arg("profile"), "The supported algorithm with the smallest prediction (never 'auto').");
  m.def(
      "is_supported",
      [](const std::string& collective, const std::string& algorithm, const GroupShape& shape) {
        std::string reason;
        const bool ok = fourd::isSupported(fourd::parseCollective(collective),
                                           fourd::parseAlgorithm(algorithm), shape, &reason);
        return py::make_tuple(ok, reason);
      },
      py::arg("collective"), py::arg("algorithm"), py::arg("shape"),
      "(supported, reason) of an algorithm on a group shape.");
}

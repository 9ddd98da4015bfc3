#include "worker/topology/hwloc_probe.h"

#include <hwloc.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>

namespace tessera {

namespace {

hwloc_topology_t Topo(void* t) { return static_cast<hwloc_topology_t>(t); }

std::string CpuList(hwloc_const_bitmap_t set) {
  if (!set) return "";
  char* s = nullptr;
  if (hwloc_bitmap_list_asprintf(&s, set) < 0 || !s) return "";
  std::string out = s;
  std::free(s);
  return out;
}

hwloc_obj_t PciDevice(hwloc_topology_t topo, const std::string& bus_id) {
  unsigned domain = 0, bus = 0, dev = 0, fn = 0;
  if (std::sscanf(CanonicalPciBusId(bus_id).c_str(), "%x:%x:%x.%x", &domain, &bus, &dev, &fn) != 4)
    return nullptr;
  return hwloc_get_pcidev_by_busid(topo, domain, bus, dev, fn);
}

}  // namespace

StatusOr<std::unique_ptr<HwlocProbe>> HwlocProbe::Load() {
  hwloc_topology_t topo = nullptr;
  if (hwloc_topology_init(&topo) != 0)
    return Unavailable(std::string("hwloc_topology_init: ") + std::strerror(errno));
  hwloc_topology_set_io_types_filter(topo, HWLOC_TYPE_FILTER_KEEP_IMPORTANT);
  if (hwloc_topology_load(topo) != 0) {
    const int err = errno;
    hwloc_topology_destroy(topo);
    return Unavailable(std::string("hwloc_topology_load: ") + std::strerror(err));
  }
  std::unique_ptr<HwlocProbe> p(new HwlocProbe());
  p->topology_ = topo;
  return p;
}

HwlocProbe::~HwlocProbe() {
  if (topology_) hwloc_topology_destroy(Topo(topology_));
}

CpuInfo HwlocProbe::Cpu() const {
  hwloc_topology_t topo = Topo(topology_);
  CpuInfo cpu;
  cpu.sockets = hwloc_get_nbobjs_by_type(topo, HWLOC_OBJ_PACKAGE);
  cpu.cores = hwloc_get_nbobjs_by_type(topo, HWLOC_OBJ_CORE);
  cpu.pus = hwloc_get_nbobjs_by_type(topo, HWLOC_OBJ_PU);
  if (hwloc_obj_t pkg = hwloc_get_obj_by_type(topo, HWLOC_OBJ_PACKAGE, 0)) {
    if (const char* model = hwloc_obj_get_info_by_name(pkg, "CPUModel")) cpu.model = model;
  }
  const int numa = hwloc_get_nbobjs_by_type(topo, HWLOC_OBJ_NUMANODE);
  for (int i = 0; i < numa; ++i) {
    hwloc_obj_t n = hwloc_get_obj_by_type(topo, HWLOC_OBJ_NUMANODE, static_cast<unsigned>(i));
    NumaNodeInfo info;
    info.id = static_cast<int>(n->os_index);
    info.cpus = CpuList(n->cpuset);
    info.memory_bytes = static_cast<int64_t>(n->attr->numanode.local_memory);
    cpu.numa_nodes.push_back(info);
  }
  return cpu;
}

std::string HwlocProbe::PciLocalCpus(const std::string& bus_id) const {
  hwloc_topology_t topo = Topo(topology_);
  hwloc_obj_t dev = PciDevice(topo, bus_id);
  if (!dev) return "";
  hwloc_obj_t anc = hwloc_get_non_io_ancestor_obj(topo, dev);
  return anc ? CpuList(anc->cpuset) : "";
}

int HwlocProbe::PciNumaNode(const std::string& bus_id) const {
  hwloc_topology_t topo = Topo(topology_);
  hwloc_obj_t dev = PciDevice(topo, bus_id);
  if (!dev) return -1;
  hwloc_obj_t anc = hwloc_get_non_io_ancestor_obj(topo, dev);
  if (!anc || !anc->nodeset || hwloc_bitmap_weight(anc->nodeset) != 1) return -1;
  return hwloc_bitmap_first(anc->nodeset);
}

}  // namespace tessera

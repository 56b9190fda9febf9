// The runtime's one cache policy (runtime/lru_cache.h) on torch_tpu._C.runtime: every cache's
// counters, and the LRU map itself for Python's caches (torch.compile's per-shape programs).
#include "python/bindings.h"

#include "runtime/lru_cache.h"

namespace torch_tpu::python {
namespace {

namespace py = pybind11;

// Python keys hashed and compared as Python does (the caller holds the GIL).
struct PyHash {
  size_t operator()(const py::object& o) const { return py::hash(o); }
};
struct PyEq {
  bool operator()(const py::object& a, const py::object& b) const { return a.equal(b); }
};
using PyLru = runtime::LruCache<py::object, py::object, PyHash, PyEq>;

}  // namespace

void bind_host_caches(py::module_& m) {
  m.def("host_caches", [] {
    settle_compiles();
    py::dict out;
    for (const auto& s : runtime::host_caches()) {
      py::dict d;
      d["entries"] = s.entries;
      d["capacity"] = s.capacity;
      d["bytes"] = s.bytes;
      d["max_bytes"] = s.max_bytes;
      d["hits"] = s.hits;
      d["misses"] = s.misses;
      d["evictions"] = s.evictions;
      out[py::str(s.name)] = d;
    }
    return out;
  }, "Per in-memory cache name: entries, capacity, bytes, max_bytes (0: no byte bound), hits, misses, "
     "evictions (caches of one name summed).");
  m.def("reset_host_cache_stats", [] {
    settle_compiles();
    runtime::reset_host_cache_stats();
  });
  // Every method is called with the GIL held (keys and values are Python objects); values leave
  // the cache after its lock is released, so a value's __del__ cannot deadlock it.
  py::class_<PyLru>(m, "LruCache",
                    "A least-recently-used map of at most `capacity` entries holding at most `max_bytes` "
                    "bytes (0: no byte bound; put() says what a value holds), counted under `name` in "
                    "torch_tpu.metrics.host_caches(). get(key) returns None when absent.")
      .def(py::init<std::string, size_t, int64_t>(), py::arg("name"), py::arg("capacity"), py::arg("max_bytes") = 0)
      .def("get", [](PyLru& c, const py::object& key) -> py::object {
        py::object v = c.find(key);
        return v ? v : py::none();
      }, py::arg("key"))
      .def("put", [](PyLru& c, py::object key, py::object value, int64_t bytes) {
        TORCH_CHECK(!value.is_none(), "LruCache.put: None cannot be cached (get returns it for a miss)");
        c.put(std::move(key), std::move(value), bytes);
      }, py::arg("key"), py::arg("value"), py::arg("bytes") = 0)
      .def("__len__", &PyLru::size)
      .def("clear", &PyLru::clear);
}

}  // namespace torch_tpu::python

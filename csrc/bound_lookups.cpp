// Point lookups bound to one index, for eager calls from Python with nothing but the query batch.
//
// A torch.ops call boxes every argument through the operator's schema on every call (at small batches about as
// long as the kernel launch itself). A BoundLookups holds the index's tensors and configuration and calls the
// same operator's typed dispatcher entry: the call still goes through the whole dispatcher (profiler, dispatch
// modes, fake tensors), only the boxing is gone. A batch that is not plain (another device or dtype, not 1-D
// contiguous), or a call under a __torch_function__ mode (which must see the operator), is handed back as None,
// and the caller takes the torch.ops path, which explains any error.
#include <ATen/PythonTorchFunctionTLS.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <torch/csrc/Exceptions.h>
#include <torch/csrc/utils/pybind.h>

#if RTINDEX_WITH_CUDA
#include "core/cuda_utils.h"
#endif

#include <algorithm>
#include <optional>
#include <string>
#include <tuple>
#include <type_traits>
#include <vector>

namespace {

namespace py = pybind11;
using at::Tensor;
using OptTensor = std::optional<Tensor>;
using Pair = std::tuple<Tensor, Tensor>;

// The operator signatures, by the number of index tensors before `config` (ops.cpp): RX takes two, cgRX four.
using RxLookup = Pair(const Tensor&, const Tensor&, int64_t, const Tensor&, const OptTensor&);
using RxRows = Tensor(const Tensor&, const Tensor&, int64_t, const Tensor&, const OptTensor&, int64_t);
using CgrxLookup = Pair(const Tensor&, const Tensor&, const Tensor&, const Tensor&, int64_t, const Tensor&, const OptTensor&);
using CgrxRows = Tensor(const Tensor&, const Tensor&, const Tensor&, const Tensor&, int64_t, const Tensor&, const OptTensor&,
                        int64_t);

template <typename Sig>
c10::TypedOperatorHandle<Sig> find_op(const std::string& name) {
  return c10::Dispatcher::singleton().findSchemaOrThrow(("rtindex::" + name).c_str(), "").typed<Sig>();
}

#if RTINDEX_WITH_CUDA
using IndexRecorded = rtindex::RecordedUsesScope;
#else
struct IndexRecorded {  // a CPU build records nothing
  explicit IndexRecorded(int) {}
};
#endif

class BoundLookups {
 public:
  BoundLookups(const std::string& family, std::vector<Tensor> lead, int64_t config, at::ScalarType dtype, at::Device device,
               py::type lookup_type)
      : lead_(std::move(lead)), config_(config), dtype_(dtype), device_(device), lookup_type_(std::move(lookup_type)) {
    TORCH_CHECK(PyType_IsSubtype(reinterpret_cast<PyTypeObject*>(lookup_type_.ptr()), &PyTuple_Type),
                "BoundLookups: the answer type must be a tuple type");
    if (lead_.size() == 2) {
      rx_lookup_ = find_op<RxLookup>(family + "_lookup");
      rx_rows_ = find_op<RxRows>(family + "_lookup_rows");
    } else {
      TORCH_CHECK(lead_.size() == 4, "BoundLookups: an index passes 2 (RX) or 4 (cgRX) tensors, got ", lead_.size());
      cgrx_lookup_ = find_op<CgrxLookup>(family + "_lookup");
      cgrx_rows_ = find_op<CgrxRows>(family + "_lookup_rows");
    }
#if RTINDEX_WITH_CUDA
    for (const Tensor& t : lead_)
      if (t.defined() && t.has_storage() && t.is_cuda())
        index_storages_.storages[index_storages_.n++] = t.storage().unsafeGetStorageImpl();
#endif
  }

  // Lookup(first_row, count), or None for a batch the checked path must see.
  py::object lookup(const Tensor& q) {
    if (!plain(q)) return py::none();
    Pair out = call([&] {
      return rx_lookup_ ? rx_lookup_->call(lead_[0], lead_[1], config_, q, std::nullopt)
                        : cgrx_lookup_->call(lead_[0], lead_[1], lead_[2], lead_[3], config_, q, std::nullopt);
    });
    // The named tuple made as tuple.__new__ makes one of a tuple subclass (tuple_subtype_new).
    auto* type = reinterpret_cast<PyTypeObject*>(lookup_type_.ptr());
    py::object first = py::cast(std::move(std::get<0>(out)));
    py::object count = py::cast(std::move(std::get<1>(out)));
    PyObject* answer = type->tp_alloc(type, 2);
    if (answer == nullptr) throw py::error_already_set();
    PyTuple_SET_ITEM(answer, 0, first.release().ptr());
    PyTuple_SET_ITEM(answer, 1, count.release().ptr());
    return py::reinterpret_steal<py::object>(answer);
  }

  // first_row with misses as miss_row, or None for a batch the checked path must see.
  py::object lookup_rows(const Tensor& q, int64_t miss_row) {
    if (!plain(q)) return py::none();
    return py::cast(call([&] {
      return rx_rows_ ? rx_rows_->call(lead_[0], lead_[1], config_, q, std::nullopt, miss_row)
                      : cgrx_rows_->call(lead_[0], lead_[1], lead_[2], lead_[3], config_, q, std::nullopt, miss_row);
    }));
  }

 private:
  // One operator call: the index's tensors announced as recorded on this stream, the GIL released (as torch.ops does).
  template <typename F>
  std::invoke_result_t<F&> call(F&& f) {
    const IndexRecorded recorded(index_uses());
    py::gil_scoped_release no_gil;
    return f();
  }

#if RTINDEX_WITH_CUDA
  // The index's tensors recorded on the current stream, once per stream (under the GIL), and for this call a
  // copy of their storages with that stream, which the operator's record_uses skips (see RecordedUses).
  rtindex::RecordedUses index_uses() {
    rtindex::RecordedUses uses = index_storages_;
    if (uses.n == 0) return uses;  // a CPU index
    const c10::cuda::CUDAStream stream = at::cuda::getCurrentCUDAStream(device_.index());
    if (std::find(recorded_on_.begin(), recorded_on_.end(), stream.id()) == recorded_on_.end()) {
      for (int k = 0; k < uses.n; ++k) c10::cuda::CUDACachingAllocator::recordStream(uses.storages[k]->data_ptr(), stream);
      recorded_on_.push_back(stream.id());
    }
    uses.stream = stream.stream();
    return uses;
  }
#else
  int index_uses() { return 0; }
#endif

  bool plain(const Tensor& q) const {
    return !at::impl::torch_function_mode_enabled() && q.scalar_type() == dtype_ && q.device() == device_ && q.dim() == 1 && q.is_contiguous();
  }

  std::vector<Tensor> lead_;
  int64_t config_;
  at::ScalarType dtype_;
  at::Device device_;
  py::type lookup_type_;
#if RTINDEX_WITH_CUDA
  rtindex::RecordedUses index_storages_;  // the lead tensors' storages (no stream)
  std::vector<c10::StreamId> recorded_on_;
#endif
  std::optional<c10::TypedOperatorHandle<RxLookup>> rx_lookup_;
  std::optional<c10::TypedOperatorHandle<RxRows>> rx_rows_;
  std::optional<c10::TypedOperatorHandle<CgrxLookup>> cgrx_lookup_;
  std::optional<c10::TypedOperatorHandle<CgrxRows>> cgrx_rows_;
};

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  py::class_<BoundLookups>(m, "BoundLookups")
      .def(py::init<const std::string&, std::vector<Tensor>, int64_t, at::ScalarType, at::Device, py::type>(),
           py::arg("family"), py::arg("lead"), py::arg("config"), py::arg("dtype"), py::arg("device"), py::arg("lookup_type"))
      // HANDLE_TH_ERRORS: torch's own translation of C++ errors (c10::Error -> RuntimeError, c10::ValueError ->
      // ValueError, ...), the one torch.ops applies.
      .def("lookup", [](BoundLookups& self, const Tensor& q) -> py::object {
        HANDLE_TH_ERRORS
        return self.lookup(q);
        END_HANDLE_TH_ERRORS_PYBIND
      })
      .def("lookup_rows", [](BoundLookups& self, const Tensor& q, int64_t miss_row) -> py::object {
        HANDLE_TH_ERRORS
        return self.lookup_rows(q, miss_row);
        END_HANDLE_TH_ERRORS_PYBIND
      });
}

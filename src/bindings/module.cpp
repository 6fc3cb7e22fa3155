// The extension module kdakit._kdakit: one register_<op>(m) per operation, plus build facts.
// The Python package kdakit wraps these entry points; see python/kdakit/.
#include <nanobind/nanobind.h>

#include "kdakit/kdakit.h"
#include "ops.h"

namespace nb = nanobind;

NB_MODULE(_kdakit, m) {
  m.doc() = "kdakit native extension: KDA prefill and decode over DLPack arrays.";
  m.def("built_with_cuda", &kdakit::built_with_cuda,
        "Whether this build carries the sm_90a CUDA kernels.");
  kdakit::bindings::register_prefill(m);
  kdakit::bindings::register_decode(m);
}

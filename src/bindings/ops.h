// One register_<op>(m) per operation file of the extension kdakit._kdakit.
#pragma once

#include <nanobind/nanobind.h>

namespace kdakit::bindings {

void register_prefill(nanobind::module_& m);  // prefill.cpp
void register_decode(nanobind::module_& m);   // decode.cpp

}  // namespace kdakit::bindings

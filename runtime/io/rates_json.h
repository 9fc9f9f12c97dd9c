// The rates file's JSON object: the resource model's rates as the calibration cache writes them
// (save_rates in dos.h) and dos-train's --report carries them.
#pragma once

#include <nlohmann/json.hpp>

#include "resource_model.h"

namespace dos {

/// One object with U_c, U_c_dma, U_g, D_c (params/s), B_h2d, B_d2h (bytes/s) and link_share, in
/// that order: what load_rates (dos.h) and dos-train --rates FILE read back. Throws nothing.
nlohmann::ordered_json rates_to_json(const Rates& r);

}  // namespace dos

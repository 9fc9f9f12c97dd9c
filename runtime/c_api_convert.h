// Conversions between the C ABI's structs (dos_c.h) and the C++ API's types (dos.h), for the
// entry points of c_api.cpp: an options struct checked field by field and turned into
// dos::OptimizerOptions, the defaults written into one, hyper-parameters, a phase's figures and the
// failed calls' messages.
//
// Contract: pure functions, no StarPU, no state; nothing here throws but std::bad_alloc.
#pragma once

#include <string>

#include "dos.h"
#include "dos_c.h"

namespace dos::c_api {

/// The hyper-parameters of dos_optimizer_set_hyper as dos::AdamHyper (decoupled: nonzero is AdamW),
/// unchecked: Optimizer::set_hyper checks them.
dos::AdamHyper make_hyper(double lr, double beta1, double beta2, double eps, double weight_decay, int decoupled);

/// Copies a phase's figures into `stats` (nothing when it is NULL): seconds, bytes, counts, flags
/// as 0 or 1, field for field (dos_step_stats in dos_c.h gives each one's unit).
void copy_stats(const dos::StepStats& s, dos_step_stats* stats);

/// Checks a struct dos_optimizer_options field by field and, when every field is in its range,
/// fills `o` from it. Returns "" when it is valid, else a message naming the first bad field, its
/// valid range and the value given.
std::string check_options(const dos_optimizer_options& c, dos::OptimizerOptions& o);

/// Writes dos::OptimizerOptions' defaults into `options` (not NULL), with its size and version
/// (dos_optimizer_options_init), every byte not a field zeroed.
void default_options(dos_optimizer_options* options);

/// The message of a failed C call: `what` (a C++ exception's text) led by the C call's name `fn`
/// and ": ". A `what` led by the method's own name (the name of `fn` after dos_optimizer_,
/// dos_runtime_ or dos_, or the C++ method the call runs where the names differ: read_master_range
/// for read_masters, write_master_range for write_masters) and ": ", " " or "() " loses that lead,
/// which would only repeat the call's name: "set_gradients: tensor 1 ..." from
/// dos_optimizer_set_gradients gives "dos_optimizer_set_gradients: tensor 1 ...",
/// "gradients_final after ...: ..." gives "dos_optimizer_gradients_final after ...: ...". With
/// `call_hints` (a dos::UsageError's text, which names calls to make and quotes no value of the
/// caller's) and an optimizer call, the C++ calls named in the rest (begin_step, finish_step,
/// finish_step_async, wait_step, step_async, gradients_final, wait_parameters, step()) become the C
/// calls (dos_optimizer_begin_step, ...); other texts are kept as they are (they may quote the
/// caller's values).
std::string named(const char* fn, const std::string& what, bool call_hints = false);

}  // namespace dos::c_api

// The phase simulation (models/phase_sim.h) on hand-worked cases of what crosses PCIe beside
// StarPU's task data: the runtime's own gradient downloads and parameter uploads (by its kernel or
// by the GPU's copy engine), the compact master's streamed state, and a resident subgroup whose
// state has still to come up. As in test_phase_sim.cpp, each expected time below is worked out
// here, piece by piece, from the resources' rates and the order the runtime submits in, not by the
// simulation's code.
#include <stdexcept>
#include <vector>

#include "cmocka_cpp.h"
#include "phase_sim.h"
#include "phase_sim_fixtures.h"

namespace {

using dos::PlanSide;
using phase_sim_fixtures::workload;

// The compact master (Workload::compact_master): a streamed state of 10.125 B per parameter each
// way: one streamed subgroup takes 10.125 n / B up, n / U_g, 10.125 n / B down; a CPU subgroup with
// the caller on the GPU brings P (pb) down beside its gradient (gb): its D2H is (gb + pb) n / B
// (gb n / B when Execution::params_on_host says the host staging holds P already), its H2D pb n / B
// as before; CPU Adam's host bytes are 26.25 (20.25 + gb + 2 pb) instead of 28, so
// host memory's M with U_c_dma = U_c and link_share 1 is 26.25 U_c + 2 B.
void test_compact_master(void**) {
  const double n = 1e8;
  dos::Workload w = workload({std::size_t(n)}, true);
  w.compact_master = true;
  const dos::Rates r{1e9, 1e9, 1e11, 4e11, 4e10, 5e10};
  const dos::Simulation s = dos::simulate_phase(w, {PlanSide::gpu_streamed}, r, dos::Execution{});
  assert_float_equal(s.total, 10.125 * n / 4e10 + n / 1e11 + 10.125 * n / 5e10, 1e-12);
  assert_float_equal(s.h2d, 10.125 * n / 4e10, 1e-12);
  assert_float_equal(s.d2h, 10.125 * n / 5e10, 1e-12);
  dos::Execution own;
  own.own_grad_download = own.own_param_upload = true;
  w.cpu_grads_staged_on_gpu = w.cpu_params_staged_on_gpu = false;
  const dos::Simulation c = dos::simulate_phase(w, {PlanSide::cpu}, r, own);
  assert_float_equal(c.d2h, (2 + 2) * n / 5e10, 1e-12);
  assert_float_equal(c.h2d, 2 * n / 4e10, 1e-12);
  own.params_on_host = {true};  // P in the host staging from the phase before: the gradient alone
  assert_float_equal(dos::simulate_phase(w, {PlanSide::cpu}, r, own).d2h, 2 * n / 5e10, 1e-12);
  own.params_on_host = {true, false};  // one flag per subgroup, or none
  bool threw = false;
  try {
    dos::simulate_phase(w, {PlanSide::cpu}, r, own);
  } catch (const std::invalid_argument&) {
    threw = true;
  }
  assert_true(threw);
  own.params_on_host.clear();
  w.compact_master = false;
  assert_float_equal(dos::simulate_phase(w, {PlanSide::cpu}, r, own).d2h, 2 * n / 5e10, 1e-12);
  assert_float_equal(dos::cpu_adam_host_bytes(w), 28.0, 0.0);
  assert_float_equal(dos::host_bandwidth(w, r), 28 * 1e9 + 9e10, 1.0);
  w.compact_master = true;
  assert_float_equal(dos::cpu_adam_host_bytes(w), 26.25, 0.0);
  assert_float_equal(dos::host_bandwidth(w, r), 26.25 * 1e9 + 9e10, 1.0);
  // the streamed footprint: the compact state's buffer
  assert_int_equal(dos::subgroup_footprint(w, 1024, PlanSide::gpu_streamed), 10368);
  w.compact_master = false;
  assert_int_equal(dos::subgroup_footprint(w, 1024, PlanSide::gpu_streamed), 12288);
}

// The subgroups, rates and plan of the two tests of the runtime's own copies: subgroup 0 streamed
// (1e9 parameters), subgroup 1 on the CPU (3e9), the caller on the GPU; U_c = U_c_dma = 1e10
// params/s, U_g = D_c = 1e15 params/s, B = 1.2e10 B/s each way.
struct OwnCopyCase {
  dos::Workload w = workload({1000000000, 3000000000}, true);
  dos::Rates r{1e10, 1e10, 1e15, 1e15, 1.2e10, 1.2e10};
  std::vector<PlanSide> plan = {PlanSide::gpu_streamed, PlanSide::cpu};
};

// The runtime's own parameter upload (Execution::own_param_upload), cpu_first, caller on the GPU:
// subgroup 0 streamed (n_s = 1e9: its state, 12 n_s, takes 1 s each way at B = 1.2e10), subgroup 1
// on the CPU (n_c = 3e9: gradient down and parameters up 6e9 bytes each, 0.5 s alone; Adam 0.3 s at
// U_c = 1e10); the GPU's work n / 1e15 (staging 3e-6 s, the streamed Adam 1e-6 s); host memory
// never binds (U_c_dma = U_c).
// Own upload: staging [0, 3e-6], gradient down [.., 0.5 + 3e-6], CPU Adam [.., 0.8 + 3e-6]; the
// parameters then go up beside the state, which keeps B (up at 1, as alone), at B / 2 until 1
// (1.2e9 - 1.8e4 bytes), then their 4.8e9 + 1.8e4 bytes left at B: up at 1.4 + 1.5e-6; the
// streamed Adam [1, 1 + 1e-6], its state back 1 s later: 2 + 1e-6; the link up busy until 1.4 + 1.5e-6.
// StarPU's stream instead: the parameters wait behind the state [0, 1] and go up in [1, 1.5], the
// write-back behind the streamed Adam [1, 1 + 1e-6] runs at 1.5; the state back in
// [1 + 1e-6, 2 + 1e-6]: 2 + 1e-6, the link up busy 1.5.
void test_own_param_upload(void**) {
  const OwnCopyCase c;
  const dos::Workload& w = c.w;
  const dos::Rates& r = c.r;
  const std::vector<PlanSide>& plan = c.plan;
  dos::Execution e;
  e.order = dos::SubmitOrder::cpu_first;
  e.own_param_upload = true;
  const dos::Simulation own = dos::simulate_phase(w, plan, r, e);
  assert_true(own.cpu_first);
  ASSERT_NEAR(own.total, 2 + 1e-6, 1e-9);
  ASSERT_NEAR(own.stream_end, 2 + 1e-6, 1e-9);
  ASSERT_NEAR(own.h2d, 1.4 + 1.5e-6, 1e-9);  // the link was busy while either carried data
  e.own_param_upload = false;
  const dos::Simulation task = dos::simulate_phase(w, plan, r, e);
  ASSERT_NEAR(task.total, 2 + 1e-6, 1e-9);
  ASSERT_NEAR(task.h2d, 1.5, 1e-9);
  // caller in host memory: nothing goes up, the flag changes nothing
  const dos::Workload host = workload({1000000000, 3000000000}, false);
  e.own_param_upload = true;
  const double with = dos::simulate_phase(host, plan, r, e).total;
  e.own_param_upload = false;
  ASSERT_NEAR(with, dos::simulate_phase(host, plan, r, e).total, 0.0);
}

// The runtime's own gradient download (Execution::own_grad_download), plan order, caller on the
// GPU, own parameter upload in both runs; the rates and subgroups of test_own_param_upload.
// Own download: the gradient goes down at submission [0, 0.5], the CPU Adam [0.5, 0.8], the
// parameters go up beside the state from 0.8 (the state at B, up at 1; the parameters at B / 2
// until 1, then at B: up at 1.4); the streamed Adam [1, 1 + 1e-6], the state back 1 s later:
// 2 + 1e-6; PCIe down busy 0.5 + 1.
// Staging task instead: it waits in the GPU's queue behind the streamed Adam, which waits for its
// state [0, 1]: Adam [1, 1 + 1e-6], staging [.., 1 + 4e-6]; its gradient goes down behind the state
// [1 + 1e-6, 2 + 1e-6], in [2 + 1e-6, 2.5 + 1e-6]; the CPU Adam to 2.8 + 1e-6, the parameters up
// 0.5 s: 3.3 + 1e-6.
// Both down at once (CPU subgroup of 1.5e10: its gradient, 3e10 bytes, alone from 0 to 1 + 1e-6
// moves 1.2000012e10; then the state at B, back at 2 + 1e-6, and the gradient at B / 2, 6e9 more;
// its last 1.1999988e10 alone at B take 0.999999 s: 3); CPU Adam 1.5 s to 4.5, parameters up
// 2.5 s: 7; PCIe down busy 3.
void test_own_grad_download(void**) {
  const OwnCopyCase c;
  const dos::Workload& w = c.w;
  const dos::Rates& r = c.r;
  const std::vector<PlanSide>& plan = c.plan;
  dos::Execution e;
  e.order = dos::SubmitOrder::plan;
  e.own_param_upload = true;
  e.own_grad_download = true;
  const dos::Simulation own = dos::simulate_phase(w, plan, r, e);
  assert_false(own.cpu_first);
  ASSERT_NEAR(own.total, 2 + 1e-6, 1e-9);
  ASSERT_NEAR(own.stream_end, 2 + 1e-6, 1e-9);
  ASSERT_NEAR(own.d2h, 1.5, 1e-9);
  ASSERT_NEAR(own.gpu, 1e-6, 1e-12);  // no staging task on the GPU
  e.own_grad_download = false;
  const dos::Simulation task = dos::simulate_phase(w, plan, r, e);
  ASSERT_NEAR(task.total, 3.3 + 1e-6, 1e-9);
  ASSERT_NEAR(task.stream_end, 2 + 1e-6, 1e-9);
  ASSERT_NEAR(task.gpu, 4e-6, 1e-12);
  e.own_grad_download = true;
  const dos::Simulation shared = dos::simulate_phase(workload({1000000000, 15000000000}, true), plan, r, e);
  ASSERT_NEAR(shared.stream_end, 2 + 1e-6, 1e-9);
  ASSERT_NEAR(shared.total, 7, 1e-9);
  ASSERT_NEAR(shared.d2h, 3, 1e-9);
  // caller in host memory: nothing comes down, the flag changes nothing
  const dos::Workload host = workload({1000000000, 3000000000}, false);
  const double with = dos::simulate_phase(host, plan, r, e).total;
  e.own_grad_download = false;
  ASSERT_NEAR(with, dos::simulate_phase(host, plan, r, e).total, 0.0);
}

// The runtime's own copies made by the GPU's copy engine (Execution::grad_download_by_copy_engine,
// param_upload_by_copy_engine) join StarPU's stream of their direction, first in first out; the
// rates and subgroups of test_own_param_upload.
// Downloads, plan order, with the CPU subgroup of 1.5e10 of test_own_grad_download's last case:
// its gradient (3e10 bytes) goes down first, [0, 2.5] at B; the streamed state (up [0, 1], Adam
// [1, 1 + 1e-6]) waits behind it and goes home in [2.5, 3.5]; CPU Adam [2.5, 4], parameters up by
// the kernel with the link up idle, 2.5 s: 6.5; PCIe down busy 3.5. (By the kernel, beside: 7,
// the state home at 2 + 1e-6.)
// Uploads, cpu_first, own download off (a staging task [0, 3e-6], the gradient down to 0.5 + 3e-6,
// CPU Adam to 0.8 + 3e-6): the parameters wait behind the state [0, 1] and go up in [1, 1.5], so the
// link up is busy 1.5 s (by the kernel: 1.4 + 1.5e-6, test_own_param_upload); the state home at
// 2 + 1e-6 either way.
void test_own_copies_by_copy_engine(void**) {
  const OwnCopyCase c;
  dos::Execution e;
  e.order = dos::SubmitOrder::plan;
  e.own_param_upload = e.own_grad_download = true;
  e.grad_download_by_copy_engine = true;
  const dos::Workload big = workload({1000000000, 15000000000}, true);
  const dos::Simulation down = dos::simulate_phase(big, c.plan, c.r, e);
  ASSERT_NEAR(down.stream_end, 3.5, 1e-9);
  ASSERT_NEAR(down.total, 6.5, 1e-9);
  ASSERT_NEAR(down.d2h, 3.5, 1e-9);
  e.grad_download_by_copy_engine = false;
  ASSERT_NEAR(dos::simulate_phase(big, c.plan, c.r, e).total, 7, 1e-9);
  // the flag means nothing without the runtime's own download
  e.own_grad_download = false;
  e.grad_download_by_copy_engine = true;
  const double task = dos::simulate_phase(big, c.plan, c.r, e).total;
  e.grad_download_by_copy_engine = false;
  ASSERT_NEAR(task, dos::simulate_phase(big, c.plan, c.r, e).total, 0.0);

  e.order = dos::SubmitOrder::cpu_first;
  e.param_upload_by_copy_engine = true;
  const dos::Simulation up = dos::simulate_phase(c.w, c.plan, c.r, e);
  assert_true(up.cpu_first);
  ASSERT_NEAR(up.h2d, 1.5, 1e-9);
  ASSERT_NEAR(up.stream_end, 2 + 1e-6, 1e-9);
  ASSERT_NEAR(up.total, 2 + 1e-6, 1e-9);
  ASSERT_NEAR(up.gpu, 3e-6 + 1e-6, 1e-12);  // the staging task and the streamed Adam: no write-back task
  e.param_upload_by_copy_engine = false;
  ASSERT_NEAR(dos::simulate_phase(c.w, c.plan, c.r, e).h2d, 1.4 + 1.5e-6, 1e-9);
}

// A resident subgroup whose state is not on the GPU yet (Execution::state_off_gpu): its 12 n bytes
// go up first, asked for at its submission (a = 12 n / B_h2d), then the GPU updates it (g = n / U_g).
//  1. The caller on the GPU, one resident subgroup: a + g flagged, g not (no flags: the same as
//     not flagged); other sides ignore the flag.
//  2. Two resident subgroups, the second flagged, a > g: the first is updated in [0, g], the second's
//     state is up at a, updated in [a, a + g].
//  3. The caller in host memory: up (12 + gb) n, the update, down pb n (no CPU: the links alone).
//  4. The flagged resident subgroup first, a streamed one after it (plan order, lookahead 3):
//     resident up [0, a], updated [a, a + g]; streamed up [a, 2a], updated [2a, 2a + g], back
//     [2a + g, 3a + g] = stream_end. The streams carried state 3a of it, with no CPU: stream_alone.
//  5. The streamed one first and a resident one of 3n after it: streamed up [0, a], updated
//     [a, a + g], back [a + g, 2a + g] = stream_end; the resident state goes up in [a, 4a]. Of
//     [0, stream_end] the streams carried state all but nothing: [a, a + g] the resident state
//     alone, then it beside the streamed state's way back (counted once): stream_alone 2a + g; what
//     it carried after stream_end is no part of it. Updated [4a, 4a + 3g].
//  6. Beside CPU Adam, the caller in host memory: the flagged resident subgroup (n), a CPU one (2n,
//     0.2 s at U_c = 1e9 with U_c_dma = U_c: host memory never short), a streamed one (n); b = 14 n
//     / B (state and gradient up; the streamed state and parameters down), d = 2 n / B (the
//     resident subgroup's parameters down). Up: resident [0, b], streamed [b, 2b]; the resident one
//     updated [b, b + g] and its parameters down [b + g, b + g + d]; the streamed one updated
//     [2b, 2b + g], down [2b + g, 3b + g] = stream_end. The streams carried state 3b of it, all
//     beside the CPU (the resident upload included); the phase is the CPU's 0.2 s. The CPU's Adam
//     runs through [0, stream_end] (Simulation::cpu_idle_before_stream_end 0; in case 4, with no
//     CPU subgroup, the whole of it).
void test_resident_state_off_gpu(void**) {
  const double n = 1e8, B = 4e10, U_g = 1e11;
  const double a = 12 * n / B, g = n / U_g;
  const dos::Rates r{1e9, 1e9, U_g, 4e11, B, B};
  dos::Execution off;
  off.state_off_gpu = {true};
  const dos::Workload one = workload({std::size_t(n)}, true);
  dos::Simulation s = dos::simulate_phase(one, {PlanSide::gpu_resident}, r, off);
  assert_float_equal(s.total, a + g, 1e-12);
  assert_float_equal(s.h2d, a, 1e-12);
  assert_float_equal(s.d2h, 0.0, 0.0);
  assert_float_equal(s.stream_end, 0.0, 0.0);
  dos::Execution on;
  on.state_off_gpu = {false};
  assert_float_equal(dos::simulate_phase(one, {PlanSide::gpu_resident}, r, on).total, g, 1e-12);
  assert_float_equal(dos::simulate_phase(one, {PlanSide::gpu_resident}, r, dos::Execution{}).total, g, 1e-12);
  assert_float_equal(dos::simulate_phase(one, {PlanSide::gpu_streamed}, r, off).total,
                     dos::simulate_phase(one, {PlanSide::gpu_streamed}, r, dos::Execution{}).total, 0.0);

  dos::Execution second;
  second.state_off_gpu = {false, true};
  const dos::Workload two = workload({std::size_t(n), std::size_t(n)}, true);
  s = dos::simulate_phase(two, {PlanSide::gpu_resident, PlanSide::gpu_resident}, r, second);
  assert_float_equal(s.total, a + g, 1e-12);
  assert_float_equal(s.gpu, 2 * g, 1e-12);

  const dos::Workload host = workload({std::size_t(n)}, false);
  s = dos::simulate_phase(host, {PlanSide::gpu_resident}, r, off);
  assert_float_equal(s.total, (12 + 2) * n / B + g + 2 * n / B, 1e-12);
  assert_float_equal(s.h2d, (12 + 2) * n / B, 1e-12);
  assert_float_equal(dos::simulate_phase(host, {PlanSide::gpu_resident}, r, on).total, 2 * n / B + g + 2 * n / B, 1e-12);

  dos::Execution first;
  first.state_off_gpu = {true, false};
  s = dos::simulate_phase(two, {PlanSide::gpu_resident, PlanSide::gpu_streamed}, r, first);
  assert_false(s.cpu_first);
  assert_float_equal(s.total, 3 * a + g, 1e-12);
  assert_float_equal(s.stream_end, 3 * a + g, 1e-12);
  assert_float_equal(s.stream_alone, 3 * a, 1e-12);
  assert_float_equal(s.stream_beside_cpu, 0.0, 0.0);
  assert_float_equal(s.cpu_idle_before_stream_end, 3 * a + g, 1e-12);  // no CPU subgroup

  dos::Execution last;
  last.state_off_gpu = {false, true};
  const dos::Workload big_last = workload({std::size_t(n), std::size_t(3 * n)}, true);
  s = dos::simulate_phase(big_last, {PlanSide::gpu_streamed, PlanSide::gpu_resident}, r, last);
  assert_float_equal(s.stream_end, 2 * a + g, 1e-12);
  assert_float_equal(s.stream_alone, 2 * a + g, 1e-12);
  assert_float_equal(s.total, 4 * a + 3 * g, 1e-12);

  const dos::Workload mixed = workload({std::size_t(n), std::size_t(2 * n), std::size_t(n)}, false);
  const dos::Rates even{1e9, 1e9, U_g, 4e11, B, B};
  dos::Execution resident_first;
  resident_first.state_off_gpu = {true, true, true};
  s = dos::simulate_phase(mixed, {PlanSide::gpu_resident, PlanSide::cpu, PlanSide::gpu_streamed}, even, resident_first);
  const double b = 14 * n / B;
  assert_float_equal(s.stream_end, 3 * b + g, 1e-12);
  assert_float_equal(s.stream_beside_cpu, 3 * b, 1e-12);
  assert_float_equal(s.stream_alone, 0.0, 0.0);
  assert_float_equal(s.total, 0.2, 1e-12);
  assert_float_equal(s.cpu_beside_dma, 3 * b, 1e-12);  // DMA in [0, 2b] and [2b + g, 3b + g]
  // the CPU's Adam runs through [0, stream_end]: never idle there, though the streams wait g
  assert_float_equal(s.cpu_idle_before_stream_end, 0.0, 0.0);
  ASSERT_NEAR(s.stream_end - s.stream_beside_cpu - s.stream_alone, g, 1e-12);
}

}  // namespace

int main() {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_own_param_upload),       cmocka_unit_test(test_own_grad_download),
      cmocka_unit_test(test_own_copies_by_copy_engine), cmocka_unit_test(test_resident_state_off_gpu),
      cmocka_unit_test(test_compact_master),
  };
  return cmocka_run_group_tests(tests, nullptr, nullptr);
}

// The team of threads the kernels' parallel calls share (claim.h): begin/end around a
// decode step (runner.kernels.team), and a probe of for_each_claimed's contract for tests.
#include <ATen/ATen.h>

#include <atomic>
#include <chrono>
#include <thread>
#include <vector>

#include "claim.h"
#include "ops.h"

namespace modelyard::ops {

void team_begin() { modelyard::Team::get().begin(); }
void team_end() { modelyard::Team::get().end(); }

// for_each_claimed's contract (for_each_claimed_in_runs' with runs of `run` units), for tests:
// (4, units) rows of how many times each unit ran (each exactly once), whether it ran on the
// calling thread, whether on the Team's helper, and the `following` unit it was given; an error
// raised by unit `fail` (-1: none) reaches the caller from whichever thread ran it; each unit
// busy for `unit_us` microseconds
at::Tensor claim_probe(int64_t units, int64_t fail, int64_t unit_us, int64_t run) {
  auto result = at::zeros({4, units}, at::kInt);
  const auto n = static_cast<size_t>(units);
  std::vector<std::atomic<int>> seen(n), here(n), helper(n), next(n);
  const auto caller = std::this_thread::get_id();
  modelyard::for_each_claimed_in_runs(units, run, [&](int64_t unit, int64_t following, bool) {
    const auto until = std::chrono::steady_clock::now() + std::chrono::microseconds(unit_us);
    while (std::chrono::steady_clock::now() < until) {
    }
    TORCH_CHECK(unit != fail, "claim_probe: unit ", unit, " failed");
    const auto u = static_cast<size_t>(unit);
    seen[u].fetch_add(1, std::memory_order_relaxed);
    if (std::this_thread::get_id() == caller) here[u].store(1);
    if (modelyard::Team::get().on_helper()) helper[u].store(1);
    next[u].store(static_cast<int>(following));
  });
  int* out = result.data_ptr<int>();
  for (int64_t u = 0; u < units; ++u) {
    out[u] = seen[static_cast<size_t>(u)].load();
    out[units + u] = here[static_cast<size_t>(u)].load();
    out[2 * units + u] = helper[static_cast<size_t>(u)].load();
    out[3 * units + u] = next[static_cast<size_t>(u)].load();
  }
  return result;
}

}  // namespace modelyard::ops

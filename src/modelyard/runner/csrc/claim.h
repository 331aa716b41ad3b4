// Work split across the ATen thread pool by claiming, not by static halves.
//
// On a shared host one core can run much slower than the other for seconds at a time (another
// tenant on its SMT sibling: this project's 2-vCPU host measured 63 against 91 GFLOP/s of FMA
// throughput on its two cores at once). A static split makes every parallel call wait for the
// slow core's half; here each thread takes the next unit from a shared counter until none is
// left, so the fast core simply does more units.
#pragma once

#include <ATen/Parallel.h>

#include <algorithm>
#include <atomic>
#include <cstdint>

namespace modelyard {

// Calls fn(unit, following, first) for every unit in [0, units), each exactly once, on up to
// at::get_num_threads() threads. A thread claims its next unit when it starts the current one,
// so `following` (units when there is none) tells fn what it will run next, e.g. what to
// prefetch; `first` is true for a thread's first unit.
template <typename Fn>
void for_each_claimed(int64_t units, const Fn& fn) {
  if (units <= 0) return;
  std::atomic<int64_t> counter{0};
  const int64_t threads = std::min<int64_t>(at::get_num_threads(), units);
  at::parallel_for(0, threads, 1, [&](int64_t, int64_t) {
    int64_t unit = counter.fetch_add(1, std::memory_order_relaxed);
    bool first = true;
    while (unit < units) {
      const int64_t following =
          std::min(units, counter.fetch_add(1, std::memory_order_relaxed));
      fn(unit, following, first);
      unit = following;
      first = false;
    }
  });
}

}  // namespace modelyard

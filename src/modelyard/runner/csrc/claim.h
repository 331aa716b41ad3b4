// Work split across threads by claiming, not by static halves.
//
// On a shared host one core can run much slower than the other for seconds at a time (another
// tenant on its SMT sibling; docs/benchmarks.md has a measured case). A static split makes every
// parallel call wait for the slow core's half; here each thread takes the next unit from a shared
// counter until none is left, so the fast core simply does more units.
//
// The threads are the ATen pool's, or, between Team::begin() and Team::end() (a decode step, see
// runner.kernels.team) on a 2-thread pool, one helper thread of this library that waits for the
// next call by spinning. ATen's OpenMP threads wait passively (the engine worker's environment):
// each parallel call then wakes its second thread, which joins ~30 us late, and a bf16 decode
// step makes ~150 such calls of 50-300 us. Spinning only inside a step keeps the helper awake
// across the step's calls and asleep between steps. While it spins it yields the core every few
// microseconds, so a process beside it still gets the core, and a call never waits for a helper
// that has not started on it: the caller takes back a call the helper has not picked up yet.
// The cost: when the scheduler preempts the helper in the middle of its unit, the call waits
// until it runs again (MODELYARD_DECODE_TEAM=0 switches the helper off).
#pragma once

#include <ATen/Parallel.h>

#include <pthread.h>
#include <sched.h>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <exception>
#include <functional>
#include <mutex>
#include <thread>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#endif

namespace modelyard {

inline void cpu_relax() {
#if defined(__x86_64__) || defined(__i386__)
  _mm_pause();
#endif
}

// Calls fn(unit, following, first) for units claimed from `counter` until none is left.
template <typename Fn>
void claim_units(std::atomic<int64_t>& counter, int64_t units, const Fn& fn) {
  int64_t unit = counter.fetch_add(1, std::memory_order_relaxed);
  bool first = true;
  while (unit < units) {
    const int64_t following = std::min(units, counter.fetch_add(1, std::memory_order_relaxed));
    fn(unit, following, first);
    unit = following;
    first = false;
  }
}

// One helper thread for claimed work inside a step (see the top of this file).
class Team {
 public:
  using Task = std::function<void(int64_t, int64_t, bool)>;

  // The process's team. A forked child gets a new one (a fork handler replaces it): the parent's
  // helper thread, and the state of its lock, did not come along. Never destroyed: the helper
  // outlives static teardown.
  static Team& get() {
    static const bool ready = [] {
      slot().store(new Team(), std::memory_order_release);
      pthread_atfork(nullptr, nullptr, [] { slot().store(new Team(), std::memory_order_release); });
      return true;
    }();
    (void)ready;
    return *slot().load(std::memory_order_acquire);
  }

  // From now until end(), for_each_claimed shares its units with the spinning helper.
  void begin() {
    std::lock_guard<std::mutex> lock(mu_);
    if (!started_) {
      std::thread([this] { helper(); }).detach();
      started_ = true;
    }
    active_.store(true, std::memory_order_release);
    wake_.notify_all();
  }

  void end() { active_.store(false, std::memory_order_release); }

  // Whether the calling thread is this team's helper (for tests).
  bool on_helper() const { return helper_id_.load() == std::this_thread::get_id(); }

  // Runs fn over the units on this thread and the helper; false (nothing run) when no step is
  // open, another call is in flight, we are inside an ATen parallel region, or ATen runs other
  // than 2 threads (one helper would take work from a larger pool).
  template <typename Fn>
  bool run(int64_t units, const Fn& fn) {
    if (!active_.load(std::memory_order_acquire) || at::in_parallel_region() ||
        at::get_num_threads() != 2) {
      return false;
    }
    bool expected = false;
    if (!busy_.compare_exchange_strong(expected, true, std::memory_order_acquire)) return false;
    const Task task = [&fn](int64_t unit, int64_t following, bool first) {
      fn(unit, following, first);
    };
    std::atomic<int64_t> counter{0};
    task_ = &task;
    counter_ = &counter;
    units_ = units;
    helper_error_ = nullptr;
    state_.store(kPosted, std::memory_order_release);
    std::exception_ptr error;
    try {
      claim_units(counter, units, fn);
    } catch (...) {  // stop the helper after its unit; task and counter must outlive it
      error = std::current_exception();
      counter.store(units, std::memory_order_relaxed);
    }
    int state = kPosted;  // take the call back if the helper has not picked it up
    if (!state_.compare_exchange_strong(state, kIdle, std::memory_order_acq_rel)) {
      while (state_.load(std::memory_order_acquire) != kIdle) wait_a_little();
    }
    if (!error) error = helper_error_;
    busy_.store(false, std::memory_order_release);
    if (error) std::rethrow_exception(error);
    return true;
  }

 private:
  static constexpr int kIdle = 0, kPosted = 1, kRunning = 2;

  static std::atomic<Team*>& slot() {
    static std::atomic<Team*> team{nullptr};
    return team;
  }

  static void wait_a_little() {
    for (int i = 0; i < 32; ++i) cpu_relax();
    sched_yield();  // a thread beside us on this core runs now, if there is one
  }

  void helper() {
    helper_id_.store(std::this_thread::get_id());
    for (;;) {
      int state = kPosted;
      if (state_.load(std::memory_order_relaxed) == kPosted &&
          state_.compare_exchange_strong(state, kRunning, std::memory_order_acq_rel)) {
        try {
          claim_units(*counter_, units_, *task_);
        } catch (...) {  // the caller rethrows it
          helper_error_ = std::current_exception();
          counter_->store(units_, std::memory_order_relaxed);
        }
        state_.store(kIdle, std::memory_order_release);
        continue;
      }
      if (active_.load(std::memory_order_acquire)) {
        wait_a_little();
        continue;
      }
      std::unique_lock<std::mutex> lock(mu_);
      wake_.wait(lock, [this] { return active_.load(std::memory_order_acquire); });
    }
  }

  std::mutex mu_;
  std::condition_variable wake_;
  bool started_ = false;
  std::atomic<std::thread::id> helper_id_{};
  std::atomic<bool> active_{false}, busy_{false};
  alignas(64) std::atomic<int> state_{kIdle};  // its own cache line: the helper polls it
  const Task* task_ = nullptr;
  std::atomic<int64_t>* counter_ = nullptr;
  int64_t units_ = 0;
  std::exception_ptr helper_error_;
};

// Calls fn(unit, following, first) for every unit in [0, units), each exactly once, on up to
// at::get_num_threads() threads (or this thread and the Team's helper inside a step). A thread
// claims its next unit when it starts the current one, so `following` (units when there is none)
// tells fn what it will run next, e.g. what to prefetch; `first` is true for a thread's first
// unit.
template <typename Fn>
void for_each_claimed(int64_t units, const Fn& fn) {
  if (units <= 0) return;
  if (units > 1 && at::get_num_threads() > 1 && Team::get().run(units, fn)) return;
  std::atomic<int64_t> counter{0};
  const int64_t threads = std::min<int64_t>(at::get_num_threads(), units);
  at::parallel_for(0, threads, 1, [&](int64_t, int64_t) { claim_units(counter, units, fn); });
}

// fn(begin, end) over [0, n): inside a step on this thread and the Team's helper, in chunks of
// `chunk` (the helper is awake, so even a pass of a few microseconds is worth splitting), else
// at::parallel_for with `grain`.
template <typename Fn>
void parallel_chunks(int64_t n, int64_t grain, int64_t chunk, const Fn& fn) {
  if (n <= 0) return;
  const int64_t units = (n + chunk - 1) / chunk;
  const auto unit = [&](int64_t u, int64_t, bool) { fn(u * chunk, std::min(n, (u + 1) * chunk)); };
  if (units > 1 && at::get_num_threads() > 1 && Team::get().run(units, unit)) return;
  at::parallel_for(0, n, grain, fn);
}

// for_each_claimed over units claimed in runs of consecutive units: a thread takes a run with
// one claim of the shared counter and its units in order (`following` the next unit it runs).
// For calls of many short units (decode attention over a prompt's rows: thousands of items of
// well under a microsecond each), where a claim per unit moves the counter's cache line from
// core to core each time. Runs of 1 are for_each_claimed itself.
template <typename Fn>
void for_each_claimed_in_runs(int64_t units, int64_t run, const Fn& fn) {
  if (run <= 1) return for_each_claimed(units, fn);
  for_each_claimed((units + run - 1) / run, [&](int64_t r, int64_t following, bool first) {
    const int64_t begin = r * run, end = std::min(units, begin + run);
    for (int64_t u = begin; u < end; ++u) {
      fn(u, u + 1 < end ? u + 1 : std::min(units, following * run), first && u == begin);
    }
  });
}

// for_each_claimed_in_runs for `units` short units: one a claim up to 256 units (every unit
// counts when there are few), then ~256 claims a call, at most 16 units a claim.
template <typename Fn>
void for_each_short_unit(int64_t units, const Fn& fn) {
  for_each_claimed_in_runs(units, std::clamp<int64_t>(units / 256, 1, 16), fn);
}

}  // namespace modelyard

// Work split over threads for the compiled CPU kernels (mixers/ops/*/cpp_*.cpp). Header-only, in an anonymous
// namespace, tracked by the builds as a dependency of the sources that include it (as vector_lanes.h is).
#pragma once
#include <atomic>
#include <cstdint>
#include <thread>
#include <vector>
#ifdef _OPENMP
#include <omp.h>
#endif

namespace {

// Calls fn(item, thread) for items 0..count-1 on `threads` threads, items taken one at a time as threads come free
// (on a busy machine a thread that is not scheduled leaves its share to the others).
//
// Built with OpenMP, the threads are the OpenMP runtime's. The library then needs libgomp.so.1, and where torch
// has loaded its own libgomp.so.1 (Linux wheels) the loader hands it that one: the kernel runs on torch's own
// thread pool. Threads of a second pool (std::thread, the fallback) had to share 2 cores with torch's OpenMP
// workers, which spin a while after each parallel op: the scan took twice as long inside a model as alone.
template <class Fn>
void parallel_items(int64_t count, int threads, Fn fn) {
  if (threads <= 1 || count <= 1) {
    for (int64_t i = 0; i < count; ++i) fn(i, 0);
    return;
  }
  int used = static_cast<int>(threads < count ? threads : count);
#ifdef _OPENMP
#pragma omp parallel for num_threads(used) schedule(dynamic, 1)
  for (int64_t i = 0; i < count; ++i) fn(i, omp_get_thread_num());
#else
  std::atomic<int64_t> next{0};
  auto work = [&](int tid) {
    for (int64_t i = next.fetch_add(1); i < count; i = next.fetch_add(1)) fn(i, tid);
  };
  std::vector<std::thread> pool;
  pool.reserve(used - 1);
  for (int t = 1; t < used; ++t) pool.emplace_back(work, t);
  work(0);
  for (auto& th : pool) th.join();
#endif
}

}  // namespace

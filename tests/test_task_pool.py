"""The graph's task pool (runtime/include/ascendc_pack/task_pool.h), compiled and run on its own.

A C++ driver runs thousands of jobs of random sizes and thread counts and checks, per job, that
every task ran exactly once, that worker ids stay below the job's thread count and are never
shared by two tasks running at once, that every task runs in its caller's floating-point mode
(every other job's caller flushes denormals, ascendc_pack/fp_mode.h), that workers really take
tasks, and that a second calling
thread (the pool busy) and a forked child (no workers) still run every task, whether workers stay
awake between jobs (``ASCENDC_PACK_POOL_SPIN_US``) or sleep at once. (That a caller
never waits for a worker to wake up is a timing property: bench/omp_wakeup.py, docs/DESIGN.md
§4.8.)
"""

from __future__ import annotations

import subprocess

import pytest

import ascendc_pack_runtime as rt

DRIVER = r"""
#include "ascendc_pack/task_pool.h"

#include <sys/wait.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <random>
#include <thread>
#include <vector>

using ascendc_pack::TaskPool;

struct Job {
  std::vector<std::atomic<int>> runs;
  std::vector<std::atomic<int>> by;  // the worker that ran each task
  std::atomic<int> busy[64];
  std::atomic<int> by_worker{0};  // tasks a worker (not the caller) ran
  std::atomic<int> errors{0};
  int threads;
  int spin_us;
  uint64_t mode = ascendc_pack::fp_mode() & ascendc_pack::kFpControlBits;  // the caller's
  explicit Job(int64_t n, int t, int spin) : runs(n), by(n), threads(t), spin_us(spin) {
    for (auto& b : busy) b = 0;
  }
};

static void task(void* ctx, int64_t t, int32_t w) {
  Job& j = *static_cast<Job*>(ctx);
  if (w < 0 || w >= j.threads || j.busy[w].exchange(1)) ++j.errors;  // id out of range or shared
  if ((ascendc_pack::fp_mode() & ascendc_pack::kFpControlBits) != j.mode) ++j.errors;  // not the caller's mode
  j.runs[t].fetch_add(1);
  j.by[t] = w;
  if (w != 0) ++j.by_worker;
  if (j.spin_us) {
    auto end = std::chrono::steady_clock::now() + std::chrono::microseconds(j.spin_us);
    while (std::chrono::steady_clock::now() < end) {
    }
  }
  if (w >= 0 && w < j.threads) j.busy[w] = 0;
}

// 1 when a 2-thread job's caller ran a task after (in task order) one its worker ran: with
// locality the caller claims from the front and the worker from the back
static int out_of_order(const Job& j) {
  int64_t last_caller = -1, first_worker = int64_t(j.by.size());
  for (int64_t t = 0; t < int64_t(j.by.size()); ++t) {
    if (j.by[t].load() == 0) last_caller = t;
    else if (first_worker == int64_t(j.by.size())) first_worker = t;
  }
  return j.threads == 2 && last_caller > first_worker;
}

static long unordered = 0;  // 2-thread jobs out of order (see out_of_order)

// runs `jobs` random jobs; returns the number of failed checks, adds the tasks workers ran
static int run_jobs(TaskPool& pool, int jobs, unsigned seed, long* by_workers) {
  std::mt19937 rng(seed);
  int bad = 0;
  for (int i = 0; i < jobs; ++i) {
    int64_t n = 1 + rng() % 300;
    int threads = 1 + rng() % 4;
    ascendc_pack::FlushDenormals flush(i % 2 == 1);  // odd jobs: the caller flushes denormals
    Job j(n, threads, i % 50 == 0 ? 20 : 0);
    pool.abi()->run(pool.abi(), n, threads, task, &j);
    for (auto& r : j.runs) bad += r.load() != 1;
    bad += j.errors.load();
    unordered += out_of_order(j);
    *by_workers += j.by_worker.load();
  }
  return bad;
}

int main() {
  TaskPool& pool = TaskPool::instance();
  long by_workers = 0;
  int bad = run_jobs(pool, 3000, 1, &by_workers);
  // a job of more tasks than the pool's claims (2^20 - 1): claimed in contiguous runs
  {
    Job big((int64_t(1) << 20) + 12345, 2, 0);
    pool.abi()->run(pool.abi(), int64_t(big.runs.size()), 2, task, &big);
    for (auto& r : big.runs) bad += r.load() != 1;
    bad += big.errors.load();
    unordered += out_of_order(big);
    by_workers += big.by_worker.load();
  }
  const long main_unordered = unordered;
  // two callers at once: one gets the pool, the other runs its jobs on its own thread
  long other_workers = 0;
  int other_bad = 0;
  std::thread other([&] { other_bad = run_jobs(pool, 1000, 2, &other_workers); });
  bad += run_jobs(pool, 1000, 3, &by_workers);
  other.join();
  bad += other_bad;
  // a forked child has no workers: its jobs run on the calling thread
  pid_t pid = fork();
  if (pid == 0) {
    long child_workers = 0;
    int child_bad = run_jobs(pool, 200, 4, &child_workers);
    _exit(child_bad == 0 && child_workers == 0 ? 0 : 1);
  }
  int status = 0;
  waitpid(pid, &status, 0);
  int child_ok = WIFEXITED(status) && WEXITSTATUS(status) == 0;
  std::printf("{\"bad\": %d, \"by_workers\": %ld, \"child_ok\": %d, \"spin_us\": %lld, \"unordered\": %ld}\n",
              bad, by_workers + other_workers, child_ok, static_cast<long long>(TaskPool::spin_us()), main_unordered);
  return 0;
}
"""


@pytest.fixture(scope="module")
def driver(tmp_path_factory):
    d = tmp_path_factory.mktemp("task_pool")
    src, exe = d / "driver.cpp", d / "driver"
    src.write_text(DRIVER)
    subprocess.run(["g++", "-std=c++17", "-O1", "-Wall", "-Werror", "-pthread", f"-I{rt.include_dir()}",
                    str(src), "-o", str(exe)], check=True, capture_output=True, text=True)
    return exe


# ASCENDC_PACK_POOL_SPIN_US: how long a worker stays awake after a job (unset: 200 us; 0: it
# sleeps at once; not a count of microseconds: the default, which the pool says)
SPIN = [(None, 200), ("0", 0), ("3000", 3000), ("fast", 200), ("-5", 200), ("+5", 200)]


@pytest.mark.parametrize("spin,expected", SPIN, ids=[str(s) for s, _ in SPIN])
def test_every_task_runs_once_on_distinct_workers(driver, spin, expected):
    import json
    import os

    env = {k: v for k, v in os.environ.items() if k != "ASCENDC_PACK_POOL_SPIN_US"}
    if spin is not None:
        env["ASCENDC_PACK_POOL_SPIN_US"] = spin
    out = subprocess.run([str(driver)], check=True, capture_output=True, text=True, timeout=300, env=env).stdout
    res = json.loads(out)
    assert res["spin_us"] == expected
    assert res["bad"] == 0  # every task once, worker ids in range and never shared at once
    assert res["by_workers"] > 0  # the workers took tasks, not only the caller
    assert res["child_ok"] == 1  # after fork(): every task on the calling thread
    assert res["unordered"] == 0  # 2-thread jobs: the caller's tasks before its worker's


def test_workers_claim_from_the_back_unless_locality_is_off(driver):
    """The caller claims a job's tasks from the front and the workers from the back, so each
    core of a 2-thread call gets about the same part of every tensor kernel after kernel;
    ``ASCENDC_PACK_POOL_LOCALITY=0`` claims from the front only, and the order interleaves."""
    import json
    import os

    env = {**os.environ, "ASCENDC_PACK_POOL_LOCALITY": "0"}
    res = json.loads(subprocess.run([str(driver)], check=True, capture_output=True, text=True, timeout=300,
                                    env=env).stdout)
    assert res["bad"] == 0 and res["child_ok"] == 1
    assert res["unordered"] > 0  # one counter: a worker's task often comes before a later caller's

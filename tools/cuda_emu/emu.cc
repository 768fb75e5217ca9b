// The emulator's scheduler (blocks run in turn, a block's threads as fibers) and its CUDA
// runtime: the cudaXxx functions the kernels, launchers and tests call, defined with the
// signatures of cuda_runtime_api.h so that programs link against this instead of libcudart.
#include "tools/cuda_emu/emu.h"

#include <sys/mman.h>

#if defined(__SANITIZE_ADDRESS__)
#include <sanitizer/asan_interface.h>
#endif

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <numeric>
#include <optional>
#include <random>
#include <utility>
#include <vector>

thread_local uint3 threadIdx;
thread_local uint3 blockIdx;
thread_local dim3 blockDim;
thread_local dim3 gridDim;

// Switches fibers: saves the callee-saved registers on the current stack, stores the stack
// pointer in *from and continues on the stack `to` (System V x86-64 ABI). A tenth of the cost of
// swapcontext, which also saves the signal mask with a system call.
extern "C" void trainyard_emu_switch(void** from, void* to);
asm(R"(
  .text
  .globl trainyard_emu_switch
  .type trainyard_emu_switch, @function
trainyard_emu_switch:
  pushq %rbp
  pushq %rbx
  pushq %r12
  pushq %r13
  pushq %r14
  pushq %r15
  movq %rsp, (%rdi)
  movq %rsi, %rsp
  popq %r15
  popq %r14
  popq %r13
  popq %r12
  popq %rbx
  popq %rbp
  ret
  .size trainyard_emu_switch, .-trainyard_emu_switch
  .section .note.GNU-stack,"",@progbits
  .text
)");

namespace trainyard::emu {
namespace {

// The device work the host thread has queued (launches, copies, fills) and how much of it the
// host has waited for: a wait for work already waited for costs nothing on a device.
thread_local int64_t g_queued = 0, g_waited_for = 0, g_waits = 0, g_launches = 0;
void Queue() { ++g_queued; }
void WaitFor(int64_t work) {
  if (work <= g_waited_for) return;
  g_waited_for = work;
  ++g_waits;
}

// Live device and pinned allocations (start → bytes, and whether pinned host memory): host
// memory outside them is pageable.
struct Allocation {
  size_t bytes;
  bool pinned;
};
std::mutex g_memory_mu;
std::map<uintptr_t, Allocation> g_allocations;
void Track(void* p, size_t bytes, bool pinned) {
  std::lock_guard<std::mutex> lock(g_memory_mu);
  g_allocations[reinterpret_cast<uintptr_t>(p)] = {bytes, pinned};
}
void Untrack(void* p) {
  std::lock_guard<std::mutex> lock(g_memory_mu);
  g_allocations.erase(reinterpret_cast<uintptr_t>(p));
}
// The allocation holding `p` (its start and kind), or none for pageable host memory.
std::optional<std::pair<uintptr_t, Allocation>> AllocationOf(const void* p) {
  const auto at = reinterpret_cast<uintptr_t>(p);
  std::lock_guard<std::mutex> lock(g_memory_mu);
  auto it = g_allocations.upper_bound(at);
  if (it == g_allocations.begin()) return std::nullopt;
  --it;
  if (at >= it->first + it->second.bytes) return std::nullopt;
  return *it;
}
bool Pageable(const void* p) { return !AllocationOf(p).has_value(); }
constexpr size_t kStackBytes = 512 * 1024;  // kernels keep register tiles in local arrays
constexpr int kDefaultSmemLimit = 48 * 1024;
constexpr int kOptInSmemLimit = 227 * 1024;

[[noreturn]] void Fatal(const char* what) {
  std::fprintf(stderr, "cuda_emu: %s (block %u,%u,%u thread %u,%u,%u of %u,%u,%u threads)\n", what,
               blockIdx.x, blockIdx.y, blockIdx.z, threadIdx.x, threadIdx.y, threadIdx.z,
               blockDim.x, blockDim.y, blockDim.z);
  std::abort();
}

// A barrier among the live members of a group (the block, or one warp). Exited threads leave
// the group, as on the hardware.
struct Barrier {
  int live = 0;
  int arrived = 0;
  uint64_t generation = 0;
};

struct Warp {
  Barrier barrier;
  int lanes = 0;  // lanes the warp started with (fewer than 32 in a block's partial last warp)
  uint64_t slots[2][32] = {};
};

struct Fiber {
  void* sp = nullptr;  // saved stack pointer while switched out
  void* stack = nullptr;
  uint3 tid;
  bool done = false;
};

// A thread's cp.async copies: taken from the source when issued, landing in shared memory only
// when a wait covers their group (until then the destination holds poison).
struct AsyncCopy {
  void* dst;
  unsigned char bytes[16];
};
struct AsyncCopies {
  std::vector<AsyncCopy> open;                   // issued since the last commit
  std::deque<std::vector<AsyncCopy>> committed;  // oldest first
};

// Everything about the block being run on this OS thread.
struct BlockRun {
  void* scheduler_sp = nullptr;
  std::vector<Fiber> fibers;
  std::vector<Warp> warps;
  Barrier block;
  int current = 0;
  uint64_t progress = 0;  // bumped by every arrival and exit; a pass without any is a deadlock
  const std::function<void()>* body = nullptr;
  std::vector<unsigned char> smem_storage;
  unsigned char* smem = nullptr;
  std::vector<void*> stacks;                             // reused across blocks and launches
  std::vector<std::pair<const void*, size_t>> poisoned;  // static shared arrays of this block
  std::vector<int> order;          // the order in which the scheduler visits the threads
  std::vector<AsyncCopies> async;  // per thread (ThreadIndex)
};

thread_local BlockRun* g_run = nullptr;
thread_local cudaError_t g_last_error = cudaSuccess;

std::mutex g_attr_mu;
std::map<const void*, int> g_smem_limit;  // per kernel, set by cudaFuncSetAttribute

void Yield() {
  Fiber& f = g_run->fibers[g_run->current];
  trainyard_emu_switch(&f.sp, g_run->scheduler_sp);
}

// Arrives at `b` and waits until every live member has arrived.
void Arrive(Barrier& b) {
  ++g_run->progress;
  const uint64_t generation = b.generation;
  if (++b.arrived == b.live) {
    b.arrived = 0;
    ++b.generation;
    return;
  }
  while (b.generation == generation) Yield();
}

void Leave(Barrier& b) {
  --b.live;
  if (b.arrived > 0 && b.arrived == b.live) {
    b.arrived = 0;
    ++b.generation;
  }
}

int ThreadIndex() {
  return static_cast<int>(threadIdx.x + blockDim.x * (threadIdx.y + blockDim.y * threadIdx.z));
}

[[noreturn]] void FiberMain() {
  BlockRun& run = *g_run;
  (*run.body)();
  Fiber& f = run.fibers[run.current];
  f.done = true;
  ++run.progress;
  Leave(run.block);
  Leave(run.warps[ThreadIndex() / 32].barrier);
  void* unused;
  trainyard_emu_switch(&unused, run.scheduler_sp);
  __builtin_unreachable();
}

void RunBlock(BlockRun& run, int threads) {
  run.fibers.assign(threads, Fiber{});
  run.warps.assign((threads + 31) / 32, Warp{});
  for (int w = 0; w < static_cast<int>(run.warps.size()); ++w) {
    run.warps[w].lanes = std::min(32, threads - 32 * w);
    run.warps[w].barrier.live = run.warps[w].lanes;
  }
  run.block = Barrier{};
  run.block.live = threads;
  run.poisoned.clear();
  run.async.assign(threads, AsyncCopies{});
  while (static_cast<int>(run.stacks.size()) < threads) {
    void* s = mmap(nullptr, kStackBytes, PROT_READ | PROT_WRITE,
                   MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (s == MAP_FAILED) Fatal("cannot map a fiber stack");
    run.stacks.push_back(s);
  }
  for (int i = 0; i < threads; ++i) {
    Fiber& f = run.fibers[i];
    f.tid = make_uint3(i % blockDim.x, i / blockDim.x % blockDim.y, i / (blockDim.x * blockDim.y));
    f.stack = run.stacks[i];
#if defined(__SANITIZE_ADDRESS__)
    // A finished fiber never returned from its frames, whose redzones are still poisoned.
    ASAN_UNPOISON_MEMORY_REGION(f.stack, kStackBytes);
#endif
    // The first switch to the fiber pops six zero registers and returns into FiberMain, with
    // the stack aligned as after a call (FiberMain never returns).
    void** sp = reinterpret_cast<void**>(static_cast<char*>(f.stack) + kStackBytes);
    *--sp = nullptr;
    *--sp = reinterpret_cast<void*>(&FiberMain);
    for (int r = 0; r < 6; ++r) *--sp = nullptr;
    f.sp = sp;
  }
  if (run.smem != nullptr) std::memset(run.smem, 0xFF, run.smem_storage.size() - 128);
  // Threads run in index order in some blocks and in reverse order in others, so that a
  // missing barrier shows up whichever of two threads is meant to go first. With
  // TRAINYARD_CUDA_EMU_SHUFFLE=<seed>, every block runs its threads in a random order instead.
  static thread_local uint64_t block_count = 0;
  static const char* const shuffle_seed = std::getenv("TRAINYARD_CUDA_EMU_SHUFFLE");
  static thread_local std::mt19937_64 rng(shuffle_seed ? std::strtoull(shuffle_seed, nullptr, 10)
                                                       : 0);
  std::vector<int>& order = run.order;
  order.resize(threads);
  std::iota(order.begin(), order.end(), 0);
  if (shuffle_seed != nullptr) {
    std::shuffle(order.begin(), order.end(), rng);
  } else if ((block_count++ & 1) != 0) {
    std::reverse(order.begin(), order.end());
  }
  int remaining = threads;
  while (remaining > 0) {
    const uint64_t before = run.progress;
    for (const int i : order) {
      Fiber& f = run.fibers[i];
      if (f.done) continue;
      run.current = i;
      threadIdx = f.tid;
      trainyard_emu_switch(&run.scheduler_sp, f.sp);
      if (f.done) --remaining;
    }
    if (remaining > 0 && run.progress == before) {
      threadIdx = run.fibers[run.current].tid;
      Fatal("deadlock: threads wait at barriers that the others never reach");
    }
  }
}

cudaError_t CheckConfig(dim3 grid, dim3 block, size_t smem, const void* kernel) {
  const uint64_t threads = uint64_t{block.x} * block.y * block.z;
  if (threads == 0 || threads > 1024 || block.z > 64) return cudaErrorInvalidConfiguration;
  if (grid.x == 0 || grid.y == 0 || grid.z == 0) return cudaErrorInvalidConfiguration;
  if (grid.x > 0x7fffffffu || grid.y > 65535 || grid.z > 65535) {
    return cudaErrorInvalidConfiguration;
  }
  int limit = kDefaultSmemLimit;
  {
    std::lock_guard<std::mutex> lock(g_attr_mu);
    auto it = g_smem_limit.find(kernel);
    if (it != g_smem_limit.end()) limit = it->second;
  }
  if (smem > static_cast<size_t>(limit)) return cudaErrorInvalidValue;
  return cudaSuccess;
}

}  // namespace

cudaError_t LaunchBlocks(dim3 grid, dim3 block, size_t dynamic_smem, const void* kernel,
                         const std::function<void()>& body) {
  const cudaError_t err = CheckConfig(grid, block, dynamic_smem, kernel);
  if (err != cudaSuccess) {
    g_last_error = err;
    return err;
  }
  if (g_run != nullptr) Fatal("kernel launch from inside a kernel");
  Queue();
  ++g_launches;
  static thread_local BlockRun run;
  g_run = &run;
  run.body = &body;
  run.smem = nullptr;
  if (dynamic_smem > 0) {
    run.smem_storage.assign(dynamic_smem + 128, 0);
    const auto base = reinterpret_cast<uintptr_t>(run.smem_storage.data());
    run.smem = reinterpret_cast<unsigned char*>((base + 127) / 128 * 128);
  }
  gridDim = grid;
  blockDim = block;
  const int threads = static_cast<int>(block.x * block.y * block.z);
  for (unsigned z = 0; z < grid.z; ++z) {
    for (unsigned y = 0; y < grid.y; ++y) {
      for (unsigned x = 0; x < grid.x; ++x) {
        blockIdx = make_uint3(x, y, z);
        RunBlock(run, threads);
      }
    }
  }
  g_run = nullptr;
  return cudaSuccess;
}

void Misaligned(const char* type, const void* p, size_t alignment) {
  char what[200];
  std::snprintf(what, sizeof(what),
                "misaligned address: %p accessed as %s (needs %zu-byte alignment)", p, type,
                alignment);
  Fatal(what);
}

unsigned char* DynamicShared() { return g_run->smem; }

void PoisonShared(void* array, size_t bytes) {
  for (const auto& [p, unused] : g_run->poisoned) {
    if (p == array) return;
  }
  g_run->poisoned.emplace_back(array, bytes);
  std::memset(array, 0xFF, bytes);
}

void CheckShared(const void* p, size_t bytes, const char* what) {
  const auto at = reinterpret_cast<uintptr_t>(p);
  const auto in = [&](const void* start, size_t size) {
    const auto begin = reinterpret_cast<uintptr_t>(start);
    return at >= begin && at + bytes <= begin + size;
  };
  if (g_run->smem != nullptr &&
      in(g_run->smem, g_run->smem_storage.size() - (g_run->smem - g_run->smem_storage.data()))) {
    return;
  }
  for (const auto& [array, size] : g_run->poisoned) {
    if (in(array, size)) return;
  }
  char message[160];
  std::snprintf(message, sizeof(message), "%s %p is not in the block's shared memory", what, p);
  Fatal(message);
}

void AsyncCopy16(void* dst, const void* src, bool fill) {
  CheckShared(dst, 16, "cp.async destination");
  AsyncCopy copy{.dst = dst, .bytes = {}};
  if (fill) std::memcpy(copy.bytes, src, 16);
  std::memset(dst, 0xFF, 16);  // undefined until a wait covers the copy
  g_run->async[ThreadIndex()].open.push_back(copy);
}

void AsyncCommit() {
  AsyncCopies& mine = g_run->async[ThreadIndex()];
  mine.committed.push_back(std::move(mine.open));
  mine.open.clear();
}

void AsyncWait(int pending) {
  AsyncCopies& mine = g_run->async[ThreadIndex()];
  while (static_cast<int>(mine.committed.size()) > pending) {
    for (const AsyncCopy& copy : mine.committed.front()) std::memcpy(copy.dst, copy.bytes, 16);
    mine.committed.pop_front();
  }
}

int LaneId() { return ThreadIndex() % 32; }

const uint64_t* WarpExchange(uint64_t value, unsigned mask) {
  Warp& w = g_run->warps[ThreadIndex() / 32];
  if (mask == 0xffffffffu && (w.lanes < 32 || w.barrier.live < 32)) {
    Fatal("full-mask warp collective in a warp whose lanes are not all present (exited lanes)");
  }
  const int parity = static_cast<int>(w.barrier.generation & 1);
  w.slots[parity][LaneId()] = value;
  Arrive(w.barrier);
  return w.slots[parity];
}

}  // namespace trainyard::emu

void __syncthreads() {
  if (trainyard::emu::g_run == nullptr) return;
  trainyard::emu::Arrive(trainyard::emu::g_run->block);
}

void __syncwarp(unsigned mask) { trainyard::emu::WarpExchange(0, mask); }

unsigned __activemask() {
  const auto& w = trainyard::emu::g_run->warps[trainyard::emu::ThreadIndex() / 32];
  unsigned bits = 0;
  const int base = trainyard::emu::ThreadIndex() / 32 * 32;
  for (int l = 0; l < w.lanes; ++l) {
    if (!trainyard::emu::g_run->fibers[base + l].done) bits |= 1u << l;
  }
  return bits;
}

unsigned __ballot_sync(unsigned mask, int predicate) {
  const uint64_t* s = trainyard::emu::WarpExchange(predicate != 0 ? 1 : 0, mask);
  unsigned bits = 0;
  for (int l = 0; l < 32; ++l) {
    if ((mask >> l & 1) && s[l] != 0) bits |= 1u << l;
  }
  return bits;
}

// ---- The runtime API. Streams and events exist only as handles: all work is synchronous.

struct CUstream_st {};
struct CUevent_st {
  std::chrono::steady_clock::time_point when;
  int64_t work = 0;  // the host thread's queued work when it was recorded
};

namespace trainyard::emu {
int64_t HostWaits() { return g_waits; }
int64_t Launches() { return g_launches; }
}  // namespace trainyard::emu

namespace {
using trainyard::emu::Queue;
using trainyard::emu::WaitFor;
cudaError_t Fail(cudaError_t err) {
  trainyard::emu::g_last_error = err;
  return err;
}
}  // namespace

namespace {
cudaError_t Allocate(void** ptr, size_t size, bool pinned) {
  if (ptr == nullptr) return Fail(cudaErrorInvalidValue);
  *ptr = nullptr;
  if (size == 0) return cudaSuccess;
  // Exactly `size` bytes (256-aligned like the device's), so that a sanitizer build catches
  // any access past the end.
  if (posix_memalign(ptr, 256, size) != 0) {
    *ptr = nullptr;
    return Fail(cudaErrorMemoryAllocation);
  }
  trainyard::emu::Track(*ptr, size, pinned);
  return cudaSuccess;
}
}  // namespace

cudaError_t cudaMalloc(void** ptr, size_t size) { return Allocate(ptr, size, false); }
cudaError_t cudaMallocAsync(void** ptr, size_t size, cudaStream_t) { return cudaMalloc(ptr, size); }
cudaError_t cudaFreeAsync(void* ptr, cudaStream_t) {
  trainyard::emu::Untrack(ptr);
  std::free(ptr);
  return cudaSuccess;
}
// cudaFree waits for the device; cudaFreeAsync is ordered on the stream instead.
cudaError_t cudaFree(void* ptr) {
  WaitFor(trainyard::emu::g_queued);
  return cudaFreeAsync(ptr, nullptr);
}
// Pinned host memory: host memory here as everything is, told apart from pageable memory by
// being tracked like the device's, and from the device's by its kind.
cudaError_t cudaMallocHost(void** ptr, size_t size) { return Allocate(ptr, size, true); }
cudaError_t cudaFreeHost(void* ptr) { return cudaFree(ptr); }
// As CUDA 11 and later answer: memory CUDA did not allocate is "unregistered", not an error.
cudaError_t cudaPointerGetAttributes(cudaPointerAttributes* attributes, const void* ptr) {
  if (attributes == nullptr) return Fail(cudaErrorInvalidValue);
  *attributes = {};
  void* const p = const_cast<void*>(ptr);
  const auto allocation = trainyard::emu::AllocationOf(ptr);
  if (!allocation) {
    attributes->type = cudaMemoryTypeUnregistered;
    attributes->device = -2;
    attributes->hostPointer = p;
    return cudaSuccess;
  }
  attributes->type = allocation->second.pinned ? cudaMemoryTypeHost : cudaMemoryTypeDevice;
  attributes->device = 0;
  attributes->devicePointer = p;
  attributes->hostPointer = allocation->second.pinned ? p : nullptr;
  return cudaSuccess;
}
// The device's stream-ordered pool: one handle; its attributes change nothing here (memory is
// the host's).
struct CUmemPoolHandle_st {};
cudaError_t cudaDeviceGetDefaultMemPool(cudaMemPool_t* pool, int device) {
  static CUmemPoolHandle_st the_pool;
  if (pool == nullptr) return Fail(cudaErrorInvalidValue);
  if (device != 0) return Fail(cudaErrorInvalidDevice);
  *pool = &the_pool;
  return cudaSuccess;
}
cudaError_t cudaMemPoolSetAttribute(cudaMemPool_t pool, cudaMemPoolAttr, void* value) {
  return pool == nullptr || value == nullptr ? Fail(cudaErrorInvalidValue) : cudaSuccess;
}
cudaError_t cudaMemGetInfo(size_t* free_bytes, size_t* total) {
  *free_bytes = size_t{64} << 30;
  *total = size_t{80} << 30;
  return cudaSuccess;
}
namespace {
cudaError_t Copy(void* dst, const void* src, size_t count) {
  if (count > 0 && (dst == nullptr || src == nullptr)) return Fail(cudaErrorInvalidValue);
  if (count > 0) std::memmove(dst, src, count);
  Queue();
  return cudaSuccess;
}
}  // namespace
cudaError_t cudaMemcpy(void* dst, const void* src, size_t count, cudaMemcpyKind) {
  const cudaError_t err = Copy(dst, src, count);
  WaitFor(trainyard::emu::g_queued);
  return err;
}
// Into pageable host memory the copy returns only once it is done, like the device's.
cudaError_t cudaMemcpyAsync(void* dst, const void* src, size_t count, cudaMemcpyKind,
                            cudaStream_t) {
  const cudaError_t err = Copy(dst, src, count);
  if (count > 0 && (trainyard::emu::Pageable(dst) || trainyard::emu::Pageable(src))) {
    WaitFor(trainyard::emu::g_queued);
  }
  return err;
}
cudaError_t cudaMemcpy2DAsync(void* dst, size_t dpitch, const void* src, size_t spitch,
                              size_t width, size_t height, cudaMemcpyKind, cudaStream_t) {
  if (width > dpitch || width > spitch) return Fail(cudaErrorInvalidPitchValue);
  if (width == 0 || height == 0) return cudaSuccess;
  if (dst == nullptr || src == nullptr) return Fail(cudaErrorInvalidValue);
  for (size_t r = 0; r < height; ++r) {
    std::memmove(static_cast<char*>(dst) + r * dpitch, static_cast<const char*>(src) + r * spitch,
                 width);
  }
  Queue();  // one copy, waited for once when it lands in pageable memory
  if (trainyard::emu::Pageable(dst)) WaitFor(trainyard::emu::g_queued);
  return cudaSuccess;
}
cudaError_t cudaMemsetAsync(void* ptr, int value, size_t count, cudaStream_t) {
  if (count > 0 && ptr == nullptr) return Fail(cudaErrorInvalidValue);
  if (count > 0) std::memset(ptr, value, count);
  Queue();
  return cudaSuccess;
}
cudaError_t cudaMemset(void* ptr, int value, size_t count) {
  const cudaError_t err = cudaMemsetAsync(ptr, value, count, nullptr);
  WaitFor(trainyard::emu::g_queued);
  return err;
}
cudaError_t cudaDeviceSynchronize() {
  WaitFor(trainyard::emu::g_queued);
  return cudaSuccess;
}
cudaError_t cudaStreamSynchronize(cudaStream_t) {
  WaitFor(trainyard::emu::g_queued);
  return cudaSuccess;
}
cudaError_t cudaStreamCreate(cudaStream_t* stream) {
  *stream = new CUstream_st;
  return cudaSuccess;
}
cudaError_t cudaStreamCreateWithFlags(cudaStream_t* stream, unsigned int) {
  return cudaStreamCreate(stream);
}
cudaError_t cudaStreamDestroy(cudaStream_t stream) {
  delete stream;
  return cudaSuccess;
}
cudaError_t cudaStreamWaitEvent(cudaStream_t, cudaEvent_t, unsigned int) { return cudaSuccess; }
cudaError_t cudaEventCreate(cudaEvent_t* event) {
  *event = new CUevent_st;
  return cudaSuccess;
}
cudaError_t cudaEventCreateWithFlags(cudaEvent_t* event, unsigned int) {
  return cudaEventCreate(event);
}
cudaError_t cudaEventRecord(cudaEvent_t event, cudaStream_t) {
  event->when = std::chrono::steady_clock::now();
  event->work = trainyard::emu::g_queued;
  return cudaSuccess;
}
// Every queued operation has run by the time a call returns here, so an event is always done;
// asking is not waiting.
cudaError_t cudaEventQuery(cudaEvent_t) { return cudaSuccess; }
cudaError_t cudaEventSynchronize(cudaEvent_t event) {
  WaitFor(event->work);
  return cudaSuccess;
}
cudaError_t cudaEventElapsedTime(float* ms, cudaEvent_t start, cudaEvent_t end) {
  *ms = std::chrono::duration<float, std::milli>(end->when - start->when).count();
  return cudaSuccess;
}
cudaError_t cudaEventDestroy(cudaEvent_t event) {
  delete event;
  return cudaSuccess;
}
cudaError_t cudaGetLastError() {
  const cudaError_t err = trainyard::emu::g_last_error;
  trainyard::emu::g_last_error = cudaSuccess;
  return err;
}
cudaError_t cudaPeekAtLastError() { return trainyard::emu::g_last_error; }
const char* cudaGetErrorName(cudaError_t err) {
  switch (err) {
    case cudaSuccess:
      return "cudaSuccess";
    case cudaErrorInvalidValue:
      return "cudaErrorInvalidValue";
    case cudaErrorMemoryAllocation:
      return "cudaErrorMemoryAllocation";
    case cudaErrorInvalidConfiguration:
      return "cudaErrorInvalidConfiguration";
    case cudaErrorInvalidDevice:
      return "cudaErrorInvalidDevice";
    default:
      return "cudaErrorUnknown";
  }
}
const char* cudaGetErrorString(cudaError_t err) {
  switch (err) {
    case cudaSuccess:
      return "no error";
    case cudaErrorInvalidValue:
      return "invalid argument";
    case cudaErrorMemoryAllocation:
      return "out of memory";
    case cudaErrorInvalidConfiguration:
      return "invalid configuration argument";
    case cudaErrorInvalidDevice:
      return "invalid device ordinal";
    default:
      return "unknown error";
  }
}
cudaError_t cudaGetDeviceCount(int* count) {
  *count = 1;
  return cudaSuccess;
}
cudaError_t cudaGetDevice(int* device) {
  *device = 0;
  return cudaSuccess;
}
cudaError_t cudaSetDevice(int device) {
  return device == 0 ? cudaSuccess : Fail(cudaErrorInvalidDevice);
}
cudaError_t cudaGetDeviceProperties(cudaDeviceProp* prop, int device) {
  if (device != 0) return Fail(cudaErrorInvalidDevice);
  *prop = cudaDeviceProp{};
  std::snprintf(prop->name, sizeof(prop->name), "CPU emulation");
  prop->major = 9;
  prop->minor = 0;
  prop->totalGlobalMem = size_t{80} << 30;
  prop->sharedMemPerBlock = trainyard::emu::kDefaultSmemLimit;
  prop->sharedMemPerBlockOptin = trainyard::emu::kOptInSmemLimit;
  prop->warpSize = 32;
  prop->maxThreadsPerBlock = 1024;
  prop->multiProcessorCount = 132;
  prop->maxThreadsPerMultiProcessor = 2048;
  return cudaSuccess;
}
// The attributes cudaGetDeviceProperties above fills in; any other fails (invalid value), so
// that code depending on one is noticed here rather than handed a made-up value.
cudaError_t cudaDeviceGetAttribute(int* value, cudaDeviceAttr attr, int device) {
  if (value == nullptr) return Fail(cudaErrorInvalidValue);
  cudaDeviceProp prop;
  const cudaError_t err = cudaGetDeviceProperties(&prop, device);
  if (err != cudaSuccess) return err;
  switch (attr) {
    case cudaDevAttrMultiProcessorCount:
      *value = prop.multiProcessorCount;
      return cudaSuccess;
    case cudaDevAttrMaxThreadsPerMultiProcessor:
      *value = prop.maxThreadsPerMultiProcessor;
      return cudaSuccess;
    case cudaDevAttrMaxThreadsPerBlock:
      *value = prop.maxThreadsPerBlock;
      return cudaSuccess;
    case cudaDevAttrWarpSize:
      *value = prop.warpSize;
      return cudaSuccess;
    case cudaDevAttrComputeCapabilityMajor:
      *value = prop.major;
      return cudaSuccess;
    case cudaDevAttrComputeCapabilityMinor:
      *value = prop.minor;
      return cudaSuccess;
    case cudaDevAttrMaxSharedMemoryPerBlock:
      *value = static_cast<int>(prop.sharedMemPerBlock);
      return cudaSuccess;
    case cudaDevAttrMaxSharedMemoryPerBlockOptin:
      *value = static_cast<int>(prop.sharedMemPerBlockOptin);
      return cudaSuccess;
    default:
      return Fail(cudaErrorInvalidValue);
  }
}
cudaError_t cudaFuncSetAttribute(const void* func, cudaFuncAttribute attr, int value) {
  if (attr != cudaFuncAttributeMaxDynamicSharedMemorySize) return cudaSuccess;
  if (value < 0 || value > trainyard::emu::kOptInSmemLimit) return Fail(cudaErrorInvalidValue);
  std::lock_guard<std::mutex> lock(trainyard::emu::g_attr_mu);
  trainyard::emu::g_smem_limit[func] = value;
  return cudaSuccess;
}

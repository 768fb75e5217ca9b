// A CPU emulation of the parts of the CUDA execution model that the kernels in kernels/cuda/
// use, so that their logic runs (slowly) on a machine without a GPU. Translated kernel sources
// (see translate.py) include this header instead of <cuda_runtime.h>.
//
// Model: a launch runs its blocks one after another; each block's threads are fibers on the
// launching OS thread, switched cooperatively at __syncthreads and at warp collectives. So the
// threads of a block really interleave at every barrier (a missing barrier shows up as a wrong
// result), __shared__ arrays can be plain statics (one block is resident at a time), and
// atomics need no hardware support. A barrier that can never complete (divergent
// __syncthreads, a warp collective some lanes skip) aborts with a message instead of hanging.
// Memory is host memory: device pointers are host pointers and every copy is synchronous.
#ifndef TRAINYARD_TOOLS_CUDA_EMU_EMU_H_
#define TRAINYARD_TOOLS_CUDA_EMU_EMU_H_

#include <cuda_bf16.h>
#include <cuda_runtime_api.h>
#include <vector_functions.h>
#include <vector_types.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <tuple>
#include <type_traits>
#include <typeinfo>
#include <utility>

// The built-in variables of the running (emulated) thread.
extern thread_local uint3 threadIdx;
extern thread_local uint3 blockIdx;
extern thread_local dim3 blockDim;
extern thread_local dim3 gridDim;
inline constexpr int warpSize = 32;

namespace trainyard::emu {

// Runs `body` as every thread of every block of the grid; returns the launch error (also left
// for cudaGetLastError, like the runtime).
cudaError_t LaunchBlocks(dim3 grid, dim3 block, size_t dynamic_smem, const void* kernel,
                         const std::function<void()>& body);

// The block's dynamic shared memory (extern __shared__), 128-byte aligned, poisoned (0xFF
// bytes, NaN in fp32 and bf16) at the start of every block.
unsigned char* DynamicShared();

// Fills a static __shared__ array with 0xFF bytes the first time a thread of the current block
// reaches its declaration (translate.py calls it right after each one).
void PoisonShared(void* array, size_t bytes);

// Aborts unless `bytes` at `p` lie in the block's shared memory (dynamic, or a static __shared__
// array the block has reached).
void CheckShared(const void* p, size_t bytes, const char* what);

// cp.async as the device runs it, for one thread: AsyncCopy16 reads the 16 source bytes (none
// with `fill` false: zeros) and fills the shared destination with poison, AsyncCommit closes the
// thread's group of copies issued since the last one, and AsyncWait(n) lands the thread's oldest
// committed groups until at most n remain. So a read before the wait that covers a copy, or of
// another thread's copy without a barrier after that thread's wait, reads NaNs.
void AsyncCopy16(void* dst, const void* src, bool fill);
void AsyncCommit();
void AsyncWait(int pending);

// Warp collectives: the calling lane publishes `bytes` of `value`, waits for every live lane of
// its warp, and gets back the slot array of the warp (32 slots of 8 bytes) valid until the
// lane's next collective.
const uint64_t* WarpExchange(uint64_t value, unsigned mask);

// The kernel launch behind a translated `kernel<<<grid, block, smem, stream>>>(args...)`: the
// arguments are converted to the kernel's parameter types once, and each thread gets its own
// copy (a kernel may modify its by-value parameters).
template <typename... Params, typename... Args>
void Launch(dim3 grid, dim3 block, size_t smem, cudaStream_t, void (*kernel)(Params...),
            Args&&... args) {
  const std::tuple<std::decay_t<Params>...> params(std::forward<Args>(args)...);
  LaunchBlocks(grid, block, smem, reinterpret_cast<const void*>(kernel), [&] {
    std::tuple<std::decay_t<Params>...> mine = params;
    std::apply(kernel, mine);
  });
}

// A reinterpret_cast to a pointer to a vector type (uint4, float4, ...), which the device can
// only access at its natural alignment: aborts, naming the type, when `p` is misaligned, like
// the device's misaligned-address fault. translate.py routes the casts that are
// dereferenced at once here.
[[noreturn]] void Misaligned(const char* type, const void* p, size_t alignment);
template <typename P, typename Q>
P AlignedCast(Q* p) {
  using T = std::remove_cv_t<std::remove_pointer_t<P>>;
  if (reinterpret_cast<uintptr_t>(p) % alignof(T) != 0) Misaligned(typeid(T).name(), p, alignof(T));
  return reinterpret_cast<P>(p);
}

template <typename T>
uint64_t ToSlot(T v) {
  static_assert(sizeof(T) <= 8 && std::is_trivially_copyable_v<T>);
  uint64_t s = 0;
  std::memcpy(&s, &v, sizeof(T));
  return s;
}
template <typename T>
T FromSlot(uint64_t s) {
  T v;
  std::memcpy(&v, &s, sizeof(T));
  return v;
}
int LaneId();

// How many times the calling host thread has waited for the device: every call that blocks
// until work queued before it has run (a stream, device or event synchronisation, a synchronous
// cudaMemcpy, a cudaMemcpyAsync to or from pageable host memory (from it, the driver may
// synchronise with the stream before staging the copy), cudaFree and cudaFreeHost), counted
// only when that work had not been waited for already, as a device would make the host wait.
// Memory from cudaMallocHost is pinned; host memory from anywhere else is pageable.
int64_t HostWaits();
// Kernel launches by the calling host thread.
int64_t Launches();

}  // namespace trainyard::emu

// Synchronisation.
void __syncthreads();
void __syncwarp(unsigned mask = 0xffffffffu);
inline void __threadfence() {}
inline void __threadfence_block() {}
unsigned __activemask();

template <typename T>
T __shfl_sync(unsigned mask, T v, int src, int width = 32) {
  const uint64_t* s = trainyard::emu::WarpExchange(trainyard::emu::ToSlot(v), mask);
  const int lane = trainyard::emu::LaneId();
  return trainyard::emu::FromSlot<T>(s[(lane / width) * width + (src % width)]);
}
template <typename T>
T __shfl_xor_sync(unsigned mask, T v, int lane_mask, int width = 32) {
  const uint64_t* s = trainyard::emu::WarpExchange(trainyard::emu::ToSlot(v), mask);
  const int lane = trainyard::emu::LaneId();
  const int src = lane ^ lane_mask;
  return trainyard::emu::FromSlot<T>(s[src / width == lane / width ? src : lane]);
}
template <typename T>
T __shfl_down_sync(unsigned mask, T v, unsigned delta, int width = 32) {
  const uint64_t* s = trainyard::emu::WarpExchange(trainyard::emu::ToSlot(v), mask);
  const int lane = trainyard::emu::LaneId();
  const int src = lane + static_cast<int>(delta);
  return trainyard::emu::FromSlot<T>(s[src / width == lane / width ? src : lane]);
}
template <typename T>
T __shfl_up_sync(unsigned mask, T v, unsigned delta, int width = 32) {
  const uint64_t* s = trainyard::emu::WarpExchange(trainyard::emu::ToSlot(v), mask);
  const int lane = trainyard::emu::LaneId();
  const int src = lane - static_cast<int>(delta);
  return trainyard::emu::FromSlot<T>(s[src >= 0 && src / width == lane / width ? src : lane]);
}
unsigned __ballot_sync(unsigned mask, int predicate);
inline int __any_sync(unsigned mask, int p) { return __ballot_sync(mask, p) != 0; }
inline int __all_sync(unsigned mask, int p) { return __ballot_sync(mask, !p) == 0; }

// Atomics: the threads of a launch are fibers of one OS thread that switch only at barriers, so
// a plain read-modify-write is atomic.
template <typename T>
T atomicAdd(T* p, T v) {
  T old = *p;
  *p = old + v;
  return old;
}
// sm_90's vector atomic add (one access on the device, which faults unless it is 8-byte
// aligned; componentwise here).
inline float2 atomicAdd(float2* p, float2 v) {
  if (reinterpret_cast<uintptr_t>(p) % alignof(float2) != 0) {
    ::trainyard::emu::Misaligned("float2", p, 8);
  }
  const float2 old = *p;
  p->x = old.x + v.x;
  p->y = old.y + v.y;
  return old;
}
template <typename T>
T atomicMax(T* p, T v) {
  T old = *p;
  if (v > old) *p = v;
  return old;
}
template <typename T>
T atomicMin(T* p, T v) {
  T old = *p;
  if (v < old) *p = v;
  return old;
}
template <typename T>
T atomicExch(T* p, T v) {
  T old = *p;
  *p = v;
  return old;
}
template <typename T>
T atomicCAS(T* p, T compare, T v) {
  T old = *p;
  if (old == compare) *p = v;
  return old;
}

// Device math. The fast intrinsics are computed exactly; a kernel whose result depends on
// their reduced precision is outside what this emulation checks.
using std::isfinite;
using std::isinf;
using std::isnan;
inline float __expf(float x) { return std::exp(x); }
inline float __logf(float x) { return std::log(x); }
inline float __powf(float x, float y) { return std::pow(x, y); }
inline float __fdividef(float x, float y) { return x / y; }
inline float __frcp_rn(float x) { return 1.0f / x; }
inline float rsqrtf(float x) { return 1.0f / std::sqrt(x); }
inline double rsqrt(double x) { return 1.0 / std::sqrt(x); }
inline float __saturatef(float x) { return x < 0.0f ? 0.0f : (x > 1.0f ? 1.0f : x); }
inline float __fmaf_rn(float a, float b, float c) { return std::fma(a, b, c); }
inline float __fadd_rn(float a, float b) { return a + b; }
inline float __fmul_rn(float a, float b) { return a * b; }
inline int __float2int_rn(float x) { return static_cast<int>(std::nearbyint(x)); }
inline int __float_as_int(float x) {
  return trainyard::emu::FromSlot<int>(trainyard::emu::ToSlot(x));
}
inline float __int_as_float(int x) {
  return trainyard::emu::FromSlot<float>(trainyard::emu::ToSlot(x));
}
inline unsigned __float_as_uint(float x) {
  return trainyard::emu::FromSlot<unsigned>(trainyard::emu::ToSlot(x));
}
inline float __uint_as_float(unsigned x) {
  return trainyard::emu::FromSlot<float>(trainyard::emu::ToSlot(x));
}
inline int __popc(unsigned x) { return __builtin_popcount(x); }
inline int __ffs(int x) { return __builtin_ffs(x); }
inline int __clz(int x) { return x == 0 ? 32 : __builtin_clz(static_cast<unsigned>(x)); }
template <typename T>
T __ldg(const T* p) {
  return *p;
}
// CUDA's min/max overloads for mixed integer and floating types (the common type, like the
// device library).
template <typename A, typename B>
auto min(A a, B b) -> std::common_type_t<A, B> {
  using C = std::common_type_t<A, B>;
  return static_cast<C>(b) < static_cast<C>(a) ? static_cast<C>(b) : static_cast<C>(a);
}
template <typename A, typename B>
auto max(A a, B b) -> std::common_type_t<A, B> {
  using C = std::common_type_t<A, B>;
  return static_cast<C>(a) < static_cast<C>(b) ? static_cast<C>(b) : static_cast<C>(a);
}

// What <cuda_runtime.h> adds to the C API for C++ callers.
template <typename T>
cudaError_t cudaFuncSetAttribute(T* entry, cudaFuncAttribute attr, int value) {
  return ::cudaFuncSetAttribute(reinterpret_cast<const void*>(entry), attr, value);
}

#endif  // TRAINYARD_TOOLS_CUDA_EMU_EMU_H_

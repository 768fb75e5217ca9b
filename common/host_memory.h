// Large, long-lived host buffers (parameters, moments, checkpoint snapshots), zero-filled and on
// huge pages where the kernel allows.
//
// Such buffers are touched whole every step; on 4 KiB pages each costs a TLB entry, and in some
// virtual machines a trap the first time the kernel writes it (a read(2) into it): restoring a
// 1.5 GB checkpoint with pread took 2.4 s on 4 KiB pages and 0.14 s on huge pages here.
//
// Threading: plain functions.
#ifndef TRAINYARD_COMMON_HOST_MEMORY_H_
#define TRAINYARD_COMMON_HOST_MEMORY_H_

#include <cstddef>
#include <cstdlib>
#include <memory>

namespace trainyard {

struct FreeHostMemory {
  void operator()(void* p) const { std::free(p); }
};

// `bytes` of zeroed memory aligned to `alignment` (a power of two), every page touched now, so
// that no later use faults: on huge pages (madvise, a hint) when it is a huge page or more. The
// size is rounded up to the alignment used. Throws std::bad_alloc.
std::unique_ptr<void, FreeHostMemory> AllocateHostMemory(size_t bytes, size_t alignment);

}  // namespace trainyard

#endif  // TRAINYARD_COMMON_HOST_MEMORY_H_

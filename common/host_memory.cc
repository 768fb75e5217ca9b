#include "common/host_memory.h"

#include <sys/mman.h>

#include <algorithm>
#include <cstring>
#include <new>

namespace trainyard {
namespace {

constexpr size_t kHugePage = size_t{2} << 20;

}  // namespace

std::unique_ptr<void, FreeHostMemory> AllocateHostMemory(size_t bytes, size_t alignment) {
  if (bytes >= kHugePage) alignment = std::max(alignment, kHugePage);
  const size_t rounded = (bytes + alignment - 1) / alignment * alignment;
  std::unique_ptr<void, FreeHostMemory> p(std::aligned_alloc(alignment, rounded));
  if (p == nullptr) throw std::bad_alloc();
  if (alignment >= kHugePage) (void)::madvise(p.get(), rounded, MADV_HUGEPAGE);
  std::memset(p.get(), 0, rounded);
  return p;
}

}  // namespace trainyard

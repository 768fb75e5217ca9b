// Buffer: an owned, typed span of memory on one backend's device (RAII).
#ifndef TRAINYARD_WORKER_BUFFER_H_
#define TRAINYARD_WORKER_BUFFER_H_

#include <cstdint>
#include <functional>
#include <utility>

namespace trainyard::worker {

// Move-only owner of `count` elements of T. The deleter returns the memory to the backend that
// allocated it. Not thread-safe; the owner decides who touches the memory.
template <typename T>
class Buffer {
 public:
  Buffer() = default;
  Buffer(T* data, int64_t count, std::function<void(void*)> deleter)
      : data_(data), count_(count), deleter_(std::move(deleter)) {}
  Buffer(Buffer&& other) noexcept { *this = std::move(other); }
  Buffer& operator=(Buffer&& other) noexcept {
    if (this != &other) {
      Release();
      data_ = std::exchange(other.data_, nullptr);
      count_ = std::exchange(other.count_, 0);
      deleter_ = std::move(other.deleter_);
    }
    return *this;
  }
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;
  ~Buffer() { Release(); }

  T* data() { return data_; }
  const T* data() const { return data_; }
  int64_t size() const { return count_; }
  bool empty() const { return count_ == 0; }

 private:
  void Release() {
    if (data_ != nullptr && deleter_) deleter_(data_);
    data_ = nullptr;
    count_ = 0;
  }

  T* data_ = nullptr;
  int64_t count_ = 0;
  std::function<void(void*)> deleter_;
};

}  // namespace trainyard::worker

#endif  // TRAINYARD_WORKER_BUFFER_H_

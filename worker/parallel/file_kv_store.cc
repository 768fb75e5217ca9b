// KeyValueStore over a shared directory: one file per key (the key hex-encoded, so any byte
// string is a valid name), written to a temporary name and renamed, so a reader never sees half
// a value.
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <sstream>
#include <thread>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "worker/parallel/kv_store.h"

namespace trainyard::worker::parallel {
namespace {

namespace fs = std::filesystem;

class FileKeyValueStore final : public KeyValueStore {
 public:
  explicit FileKeyValueStore(std::string dir) : dir_(std::move(dir)) {}

  absl::Status Set(const std::string& key, const std::string& value) override {
    std::error_code ec;
    fs::create_directories(dir_, ec);
    const fs::path final_path = Path(key);
    const fs::path tmp = absl::StrCat(final_path.string(), ".tmp.", getpid(), ".",
                                      std::hash<std::thread::id>()(std::this_thread::get_id()));
    {
      std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
      out.write(value.data(), static_cast<std::streamsize>(value.size()));
      if (!out.good()) {
        return absl::UnavailableError(absl::StrCat("kv store: cannot write ", tmp.string()));
      }
    }
    fs::rename(tmp, final_path, ec);
    if (ec) {
      return absl::UnavailableError(
          absl::StrCat("kv store: rename to ", final_path.string(), ": ", ec.message()));
    }
    return absl::OkStatus();
  }

  absl::StatusOr<std::string> Get(const std::string& key,
                                  std::chrono::milliseconds timeout) override {
    if (absl::Status s = Wait({key}, timeout); !s.ok()) return s;
    std::ifstream in(Path(key), std::ios::binary);
    std::stringstream ss;
    ss << in.rdbuf();
    return ss.str();
  }

  absl::Status Wait(const std::vector<std::string>& keys,
                    std::chrono::milliseconds timeout) override {
    const auto deadline = std::chrono::steady_clock::now() + timeout;
    for (const std::string& key : keys) {
      while (!fs::exists(Path(key))) {
        if (std::chrono::steady_clock::now() > deadline) {
          return absl::DeadlineExceededError(absl::StrCat(
              "kv store: key '", key, "' did not appear within ", timeout.count(), " ms"));
        }
        std::this_thread::sleep_for(std::chrono::milliseconds(2));
      }
    }
    return absl::OkStatus();
  }

 private:
  fs::path Path(const std::string& key) const {
    return fs::path(dir_) / absl::BytesToHexString(key);
  }

  std::string dir_;
};

}  // namespace

std::unique_ptr<KeyValueStore> MakeFileKeyValueStore(const std::string& directory) {
  return std::make_unique<FileKeyValueStore>(directory);
}

}  // namespace trainyard::worker::parallel

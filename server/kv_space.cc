#include "server/kv_space.h"

#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "common/status.h"

namespace trainyard::server {

std::string KvSpace::PrefixFor(const std::string& job_id, int attempt_id) {
  return absl::StrCat("jobs/", job_id, "/attempts/", attempt_id, "/");
}

absl::StatusOr<std::string> KvSpace::PrefixOf(const std::string& key) {
  if (key.size() > kMaxKeyBytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("key of ", key.size(), " bytes is over the limit of ", kMaxKeyBytes));
  }
  std::vector<absl::string_view> parts = absl::StrSplit(key, absl::MaxSplits('/', 4));
  if (parts.size() != 5 || parts[0] != "jobs" || parts[1].empty() || parts[2] != "attempts" ||
      parts[3].empty() || parts[4].empty()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "key '", key, "' does not start with a kv_prefix \"jobs/<job>/attempts/<n>/\""));
  }
  return absl::StrCat("jobs/", parts[1], "/attempts/", parts[3], "/");
}

absl::StatusOr<std::pair<std::string, int>> KvSpace::AttemptOf(const std::string& key) {
  TY_ASSIGN_OR_RETURN(const std::string prefix, PrefixOf(key));
  const std::vector<absl::string_view> parts = absl::StrSplit(prefix, '/');
  int attempt = 0;
  if (!absl::SimpleAtoi(parts[3], &attempt)) {
    return absl::InvalidArgumentError(
        absl::StrCat("key '", key, "': the attempt in its prefix is not a number"));
  }
  return std::make_pair(std::string(parts[1]), attempt);
}

void KvSpace::Open(const std::string& prefix) {
  absl::MutexLock lock(&mu_);
  spaces_.try_emplace(prefix);
}

std::function<void()> KvSpace::CloseDeferred(const std::string& prefix) {
  std::vector<Waiter> waiters;
  {
    absl::MutexLock lock(&mu_);
    auto it = spaces_.find(prefix);
    if (it == spaces_.end()) return [] {};
    waiters = std::move(it->second.waiters);
    spaces_.erase(it);
  }
  return [waiters = std::move(waiters)]() mutable {
    for (Waiter& waiter : waiters) {
      waiter.done(absl::FailedPreconditionError(
          absl::StrCat("the attempt of '", waiter.key, "' has ended")));
    }
  };
}

absl::Status KvSpace::Set(const std::string& key, std::string value) {
  absl::StatusOr<std::string> prefix = PrefixOf(key);
  if (!prefix.ok()) return prefix.status();
  if (value.size() > kMaxValueBytes) {
    return absl::InvalidArgumentError(absl::StrCat("value of '", key, "' is ", value.size(),
                                                   " bytes, over the limit of ", kMaxValueBytes));
  }
  std::vector<Waiter> ready;
  {
    absl::MutexLock lock(&mu_);
    auto it = spaces_.find(*prefix);
    if (it == spaces_.end()) {
      return absl::FailedPreconditionError(
          absl::StrCat("no live attempt owns '", *prefix, "' (it has ended or never existed)"));
    }
    Space& space = it->second;
    auto existing = space.values.find(key);
    const size_t old_bytes =
        existing == space.values.end() ? 0 : key.size() + existing->second.size();
    if (existing == space.values.end() && space.values.size() >= kMaxKeysPerSpace) {
      return absl::ResourceExhaustedError(
          absl::StrCat("the space ", *prefix, " already holds ", kMaxKeysPerSpace, " keys"));
    }
    const size_t new_bytes = space.bytes - old_bytes + key.size() + value.size();
    if (new_bytes > kMaxBytesPerSpace) {
      return absl::ResourceExhaustedError(
          absl::StrCat("the space ", *prefix, " would exceed ", kMaxBytesPerSpace, " bytes"));
    }
    space.bytes = new_bytes;
    space.values[key] = value;
    auto keep = space.waiters.begin();
    for (auto w = space.waiters.begin(); w != space.waiters.end(); ++w) {
      if (w->key == key) {
        ready.push_back(std::move(*w));
      } else {
        if (keep != w) *keep = std::move(*w);
        ++keep;
      }
    }
    space.waiters.erase(keep, space.waiters.end());
  }
  for (Waiter& waiter : ready) waiter.done(std::optional<std::string>(value));
  return absl::OkStatus();
}

void KvSpace::Get(const std::string& key, absl::Time deadline, GetCallback done) {
  absl::StatusOr<std::string> prefix = PrefixOf(key);
  if (!prefix.ok()) {
    done(prefix.status());
    return;
  }
  absl::StatusOr<std::optional<std::string>> answer;
  {
    absl::MutexLock lock(&mu_);
    auto it = spaces_.find(*prefix);
    if (it == spaces_.end()) {
      answer = absl::FailedPreconditionError(
          absl::StrCat("no live attempt owns '", *prefix, "' (it has ended or never existed)"));
    } else if (auto value = it->second.values.find(key); value != it->second.values.end()) {
      answer = std::optional<std::string>(value->second);
    } else if (deadline <= clock_->Now()) {
      answer = std::optional<std::string>();
    } else {
      it->second.waiters.push_back(Waiter{key, deadline, std::move(done)});
      return;
    }
  }
  done(std::move(answer));
}

void KvSpace::ExpireWaiters(absl::Time now) {
  std::vector<Waiter> expired;
  {
    absl::MutexLock lock(&mu_);
    for (auto& [prefix, space] : spaces_) {
      auto keep = space.waiters.begin();
      for (auto w = space.waiters.begin(); w != space.waiters.end(); ++w) {
        if (w->deadline <= now) {
          expired.push_back(std::move(*w));
        } else {
          if (keep != w) *keep = std::move(*w);
          ++keep;
        }
      }
      space.waiters.erase(keep, space.waiters.end());
    }
  }
  for (Waiter& waiter : expired) waiter.done(std::optional<std::string>());
}

void KvSpace::FailAll(const absl::Status& status) {
  std::vector<Waiter> all;
  {
    absl::MutexLock lock(&mu_);
    for (auto& [prefix, space] : spaces_) {
      for (Waiter& w : space.waiters) all.push_back(std::move(w));
      space.waiters.clear();
    }
  }
  for (Waiter& waiter : all) waiter.done(status);
}

size_t KvSpace::open_spaces() const {
  absl::MutexLock lock(&mu_);
  return spaces_.size();
}

}  // namespace trainyard::server

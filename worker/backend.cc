#include "worker/backend.h"

#include <utility>

#include "common/clock.h"

namespace trainyard::worker {
namespace {

class HostSum final : public DeviceSum {
 public:
  void AddHost(double value) override { sum_ += value; }
  absl::StatusOr<double> Take() override { return std::exchange(sum_, 0.0); }

 private:
  double sum_ = 0.0;
};

class HostTimer final : public DeviceTimer {
 public:
  void Start() override { started_ = RealClock()->NowNanosMonotonic(); }
  void Stop() override { nanos_ += RealClock()->NowNanosMonotonic() - started_; }
  absl::StatusOr<double> Take() override { return std::exchange(nanos_, 0) / 1e9; }

 private:
  int64_t started_ = 0;
  int64_t nanos_ = 0;
};

}  // namespace

std::unique_ptr<DeviceSum> Backend::NewDeviceSum() { return std::make_unique<HostSum>(); }
std::unique_ptr<DeviceTimer> Backend::NewDeviceTimer() { return std::make_unique<HostTimer>(); }

void Backend::ExpertsForward(const ExpertMlp& mlp, const Act* in, Act* hidden, Act* act, Act* out) {
  const int64_t width = mlp.width, ffn = mlp.ffn, fc = mlp.fc_out();
  for (int64_t j = 0; j < mlp.experts(); ++j) {
    const int64_t r0 = mlp.offsets[j], rows = mlp.offsets[j + 1] - r0;
    if (rows == 0) continue;
    const Act* x = At(in, r0 * width);
    Act* h = At(hidden, r0 * fc);
    Act* a = At(act, r0 * ffn);
    const float* fc_b = mlp.fc_b != nullptr ? mlp.fc_b + j * fc : nullptr;
    if (mlp.gated) {
      Linear(h, x, mlp.fc_w + j * fc * width, fc_b, rows, fc, width);
      Glu(a, h, rows, ffn, mlp.gate);
    } else {
      LinearGelu(a, h, x, mlp.fc_w + j * fc * width, fc_b, rows, ffn, width);
    }
    Linear(At(out, r0 * width), a, mlp.proj_w + j * width * ffn,
           mlp.proj_b != nullptr ? mlp.proj_b + j * width : nullptr, rows, width, ffn);
  }
}

void Backend::ExpertsBackward(const ExpertMlp& mlp, const ExpertMlpGrads& grads, const Act* dout,
                              const Act* in, const Act* hidden, const Act* act, Act* dact,
                              Act* dhidden, Act* din) {
  const int64_t width = mlp.width, ffn = mlp.ffn, fc = mlp.fc_out();
  auto at = [](float* base, int64_t offset) { return base != nullptr ? base + offset : nullptr; };
  for (int64_t j = 0; j < mlp.experts(); ++j) {
    const int64_t r0 = mlp.offsets[j], rows = mlp.offsets[j + 1] - r0;
    if (rows == 0) continue;
    Act* da = At(dact, r0 * ffn);
    Act* dh = At(dhidden, r0 * fc);
    LinearBackward(da, at(grads.proj_w, j * width * ffn), at(grads.proj_b, j * width),
                   At(dout, r0 * width), At(act, r0 * ffn), mlp.proj_w + j * width * ffn, rows,
                   width, ffn);
    if (mlp.gated) {
      GluBackward(dh, da, At(hidden, r0 * fc), rows, ffn, mlp.gate);
    } else {
      GeluBackward(dh, da, At(hidden, r0 * fc), rows * ffn);
    }
    LinearBackward(At(din, r0 * width), at(grads.fc_w, j * fc * width), at(grads.fc_b, j * fc), dh,
                   At(in, r0 * width), mlp.fc_w + j * fc * width, rows, fc, width);
  }
}

}  // namespace trainyard::worker

#include "worker/parallel/pipeline.h"

#include <algorithm>
#include <chrono>
#include <limits>

#include "absl/strings/str_cat.h"
#include "common/status.h"

namespace trainyard::worker {

std::vector<PipelineStage> BalanceStages(const config::ModelConfig& c, int seq_len, int stages) {
  const double width = c.width, ffn = c.ffn_hidden;
  const double attn = static_cast<double>(c.heads) * c.head_dim();
  const double fc = c.family == config::ModelFamily::kGpt2 ? ffn : 2 * ffn;
  // Per token: matmul parameters (a multiply-add each) plus the attention scores and values.
  const double block =
      c.qkv_width() * width + width * attn + fc * width + width * ffn + 2.0 * seq_len * width;
  const double head = static_cast<double>(c.vocab) * width;
  const int layers = c.layers;
  auto cost = [&](int first, int last_excl, bool is_last) {
    return (last_excl - first) * block + (is_last ? head : 0.0);
  };
  // best[s][l]: the least possible maximum stage cost placing layers [0, l) on stages [0, s).
  const double inf = std::numeric_limits<double>::infinity();
  std::vector<std::vector<double>> best(stages + 1, std::vector<double>(layers + 1, inf));
  std::vector<std::vector<int>> cut(stages + 1, std::vector<int>(layers + 1, 0));
  best[0][0] = 0.0;
  for (int s = 1; s <= stages; ++s) {
    for (int l = s; l <= layers; ++l) {
      for (int k = s - 1; k < l; ++k) {
        const double c2 = std::max(best[s - 1][k], cost(k, l, s == stages));
        if (c2 < best[s][l]) {
          best[s][l] = c2;
          cut[s][l] = k;
        }
      }
    }
  }
  std::vector<PipelineStage> out(stages);
  int end = layers;
  for (int s = stages; s >= 1; --s) {
    const int begin = cut[s][end];
    out[s - 1] = PipelineStage{begin, end - begin, s == 1, s == stages};
    end = begin;
  }
  return out;
}

int InFlight(int stage, int stages, int micro_batches) {
  return std::min(stages - stage - 1, micro_batches) + 1;
}

absl::Status RunOneForwardOneBackward(parallel::Communicator& pp, Backend& backend, int m,
                                      int64_t count, const StageWork& work, ScheduleStats* stats) {
  const int p = pp.size(), s = pp.rank();
  const bool first = s == 0, last = s == p - 1;
  const int warmup = std::min(p - s - 1, m);
  const int slots = warmup + 1;
  const DType dtype = backend.act_dtype();
  std::vector<Buffer<Act>> in(slots), out(slots);
  for (int k = 0; k < slots; ++k) {
    if (!first) in[k] = backend.AllocAct(count);
    if (!last) out[k] = backend.AllocAct(count);
  }
  Buffer<Act> dout = last ? Buffer<Act>() : backend.AllocAct(count);
  Buffer<Act> din = first ? Buffer<Act>() : backend.AllocAct(count);
  auto slot = [&](int i) { return i % slots; };
  // Tags: 2i for micro-batch i's activation, 2i + 1 for its gradient.
  auto fwd_tag = [](int i) { return static_cast<uint32_t>(2 * i); };
  auto bwd_tag = [](int i) { return static_cast<uint32_t>(2 * i + 1); };
  auto timed = [&](auto&& transfer) -> absl::Status {
    const auto start = std::chrono::steady_clock::now();
    absl::Status status = transfer();
    stats->wait_seconds +=
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    return status;
  };
  auto recv_forward = [&](int i) {
    return first ? absl::OkStatus() : timed([&] {
      return pp.Recv(in[slot(i)].data(), count, dtype, s - 1, fwd_tag(i));
    });
  };
  auto send_forward = [&](int i) {
    return last ? absl::OkStatus() : timed([&] {
      return pp.Send(out[slot(i)].data(), count, dtype, s + 1, fwd_tag(i));
    });
  };
  auto recv_backward = [&](int i) {
    return last ? absl::OkStatus()
                : timed([&] { return pp.Recv(dout.data(), count, dtype, s + 1, bwd_tag(i)); });
  };
  auto send_backward = [&](int i) {
    return first ? absl::OkStatus()
                 : timed([&] { return pp.Send(din.data(), count, dtype, s - 1, bwd_tag(i)); });
  };
  auto forward = [&](int i) {
    return work.forward(i, slot(i), first ? nullptr : in[slot(i)].data(),
                        last ? nullptr : out[slot(i)].data());
  };
  auto backward = [&](int i) {
    return work.backward(i, slot(i), last ? nullptr : dout.data(), first ? nullptr : din.data());
  };

  for (int i = 0; i < warmup; ++i) {
    TY_RETURN_IF_ERROR(recv_forward(i));
    TY_RETURN_IF_ERROR(forward(i));
    TY_RETURN_IF_ERROR(send_forward(i));
  }
  if (m > warmup) TY_RETURN_IF_ERROR(recv_forward(warmup));
  for (int j = 0; j < m - warmup; ++j) {
    const int f = warmup + j, b = j;
    TY_RETURN_IF_ERROR(forward(f));
    if (!last) {
      TY_RETURN_IF_ERROR(timed([&] {
        return pp.SendRecv(out[slot(f)].data(), count, s + 1, fwd_tag(f), dout.data(), count, s + 1,
                           bwd_tag(b), dtype);
      }));
    }
    TY_RETURN_IF_ERROR(backward(b));
    if (j == m - warmup - 1) {
      TY_RETURN_IF_ERROR(send_backward(b));
    } else if (!first) {
      TY_RETURN_IF_ERROR(timed([&] {
        return pp.SendRecv(din.data(), count, s - 1, bwd_tag(b), in[slot(f + 1)].data(), count,
                           s - 1, fwd_tag(f + 1), dtype);
      }));
    }
  }
  for (int i = m - warmup; i < m; ++i) {
    TY_RETURN_IF_ERROR(recv_backward(i));
    TY_RETURN_IF_ERROR(backward(i));
    TY_RETURN_IF_ERROR(send_backward(i));
  }
  return absl::OkStatus();
}

}  // namespace trainyard::worker

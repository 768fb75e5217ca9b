#include "planner/explain.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "planner/planner.h"

namespace trainyard::planner {
namespace {

constexpr int kRunnersUp = 4;

double LinkRatio(const DeviceProfile& d) {
  return d.intra_node.bytes_per_second / d.inter_node.bytes_per_second;
}

std::string WhyCommunication(const Plan& plan, const Candidate& loser, const Candidate& chosen) {
  const double d_dp = loser.exposed.dp - chosen.exposed.dp;
  const double d_tp = loser.exposed.tp - chosen.exposed.tp;
  const double d_pp = loser.exposed.pp - chosen.exposed.pp;
  const double d_cp = loser.exposed.cp - chosen.exposed.cp;
  const double d_ep = loser.exposed.ep - chosen.exposed.ep;
  const double ratio = LinkRatio(plan.device);
  if (d_ep > d_dp && d_ep > d_tp && d_ep > d_pp && d_ep > d_cp) {
    return absl::StrFormat(
        "ep %d carries %s of tokens and their gradients to the experts' ranks and back per rank "
        "and step (balanced routing), exposing %s more",
        loser.mesh.ep, HumanBytes(loser.bytes_ep), HumanSeconds(d_ep));
  }
  if (d_cp > d_dp && d_cp > d_tp && d_cp > d_pp) {
    return absl::StrFormat(
        "cp %d sends %s of keys, values and their gradients around its ring per rank and step, "
        "exposing %s more than attention hides",
        loser.mesh.cp, HumanBytes(loser.bytes_cp), HumanSeconds(d_cp));
  }
  if (d_dp >= d_tp && d_dp >= d_pp) {
    if (loser.dp_crosses_nodes && !chosen.dp_crosses_nodes && ratio > 1.01) {
      return absl::StrFormat(
          "its data-parallel reductions cross nodes over %.0f× slower links, exposing %s more per "
          "step",
          ratio, HumanSeconds(d_dp));
    }
    if (loser.mesh.zero == 3) {
      return absl::StrFormat(
          "ZeRO-3 gathers every parameter group again for each micro-batch, exposing %s more "
          "communication per step",
          HumanSeconds(d_dp));
    }
    return absl::StrFormat("its data-parallel reductions (%s per rank per step) expose %s more",
                           HumanBytes(loser.bytes_dp), HumanSeconds(d_dp));
  }
  if (d_tp >= d_pp) {
    return absl::StrFormat(
        "tp %d puts %s of activation collectives per rank and step on the critical path (%s "
        "more)",
        loser.mesh.tp, HumanBytes(loser.bytes_tp), HumanSeconds(d_tp));
  }
  if (loser.pp_crosses_nodes && !chosen.pp_crosses_nodes && ratio > 1.01) {
    return absl::StrFormat("its pipeline transfers cross nodes over %.0f× slower links (%s more)",
                           ratio, HumanSeconds(d_pp));
  }
  return absl::StrFormat("its pipeline transfers add %s per step", HumanSeconds(d_pp));
}

bool SameSplit(const config::ParallelismSpec& a, const config::ParallelismSpec& b) {
  return a.dp == b.dp && a.cp == b.cp && a.tp == b.tp && a.pp == b.pp && a.ep == b.ep;
}

bool SameMesh(const config::ParallelismSpec& a, const config::ParallelismSpec& b) {
  return SameSplit(a, b) && a.zero == b.zero;
}

// A chosen cp mesh: why it splits the sequences. When no mesh without context parallelism fits,
// the smallest of them against the choice's activations (or that there is none); else nothing
// (the fastest of them is among the runners-up).
std::string WhyContextParallel(const Plan& plan, const Candidate& chosen) {
  if (chosen.mesh.cp == 1) return "";
  const Candidate* smallest = nullptr;
  for (const Candidate& c : plan.candidates) {
    if (c.mesh.cp != 1) continue;
    if (c.fits) return "";
    if (smallest == nullptr || c.memory.total() < smallest->memory.total()) smallest = &c;
  }
  const int64_t seq_len = plan.seq_len;
  std::string out = absl::StrFormat(
      " Context parallelism: cp %d splits each sequence of %d tokens over %d ranks (%d each), "
      "which brings activations to %s per rank",
      chosen.mesh.cp, seq_len, chosen.mesh.cp, seq_len / chosen.mesh.cp,
      HumanBytes(chosen.memory.activations));
  if (smallest == nullptr) return out + "; no mesh without it is valid for these resources.";
  return out + absl::StrFormat(
                   "; without it no mesh fits: the smallest, %s, needs %s per rank (activations "
                   "%s), over the %s a rank has.",
                   MeshName(smallest->mesh), HumanBytes(smallest->memory.total()),
                   HumanBytes(smallest->memory.activations), HumanBytes(smallest->capacity));
}

// Under `schedule: auto`: the chosen mesh's schedule against the others the mesh can run.
std::string WhySchedule(const Plan& plan, const Candidate& chosen) {
  if (!chosen.mesh.automatic_schedule || chosen.mesh.pp == 1) return "";
  std::string out = absl::StrFormat(
      " Schedule auto: %s, the fastest of the schedules this mesh can run within the memory "
      "(step %s, bubble %.0f%%, %s per rank)",
      ScheduleText(chosen.mesh), HumanSeconds(chosen.step.total), 100 * chosen.bubble_fraction,
      HumanBytes(chosen.memory.total()));
  for (const Candidate& c : plan.candidates) {
    if (&c == &chosen || !SameMesh(c.mesh, chosen.mesh)) continue;
    if (c.fits) {
      absl::StrAppendFormat(&out, "; %s: step %s, bubble %.0f%%", ScheduleText(c.mesh),
                            HumanSeconds(c.step.total), 100 * c.bubble_fraction);
    } else {
      absl::StrAppendFormat(&out, "; %s: needs %s per rank, over the %s a rank has",
                            ScheduleText(c.mesh), HumanBytes(c.memory.total()),
                            HumanBytes(c.capacity));
    }
  }
  return out + ".";
}

}  // namespace

std::string HumanBytes(double bytes) {
  if (bytes >= 1024.0 * 1024 * 1024) return absl::StrFormat("%.2f GiB", bytes / (1 << 30));
  if (bytes >= 1024.0 * 1024) return absl::StrFormat("%.1f MiB", bytes / (1 << 20));
  if (bytes >= 1024.0) return absl::StrFormat("%.1f KiB", bytes / 1024);
  return absl::StrFormat("%.0f B", bytes);
}

std::string HumanCount(double value) {
  if (value >= 1e9) return absl::StrFormat("%.2fG", value / 1e9);
  if (value >= 1e6) return absl::StrFormat("%.2fM", value / 1e6);
  if (value >= 1e4) return absl::StrFormat("%.1fk", value / 1e3);
  return absl::StrFormat("%.0f", value);
}

std::string HumanSeconds(double seconds) {
  if (seconds >= 1) return absl::StrFormat("%.2f s", seconds);
  if (seconds >= 1e-3) return absl::StrFormat("%.2f ms", seconds * 1e3);
  return absl::StrFormat("%.0f µs", seconds * 1e6);
}

std::string WhyLost(const Plan& plan, const Candidate& loser, const Candidate& chosen) {
  if (!loser.fits) {
    return absl::StrFormat("needs %s on its most loaded rank, over the %s a rank has on %s",
                           HumanBytes(loser.memory.total()), HumanBytes(loser.capacity),
                           plan.device.name);
  }
  const double d_compute = loser.step.compute - chosen.step.compute;
  const double d_comm = loser.step.communication - chosen.step.communication;
  const double d_bubble = loser.step.bubble - chosen.step.bubble;
  std::string why;
  if (d_bubble >= d_compute && d_bubble >= d_comm && d_bubble > 0) {
    why = absl::StrFormat("pp %d idles %.0f%% of each step in the %s bubble (%s more)",
                          loser.mesh.pp, 100 * loser.bubble_fraction, ScheduleText(loser.mesh),
                          HumanSeconds(d_bubble));
  } else if (d_comm >= d_compute && d_comm > 0) {
    why = WhyCommunication(plan, loser, chosen);
  } else if (d_compute > 0 && loser.mesh.zero < chosen.mesh.zero && loser.mesh.dp > 1) {
    why = absl::StrFormat(
        "without ZeRO-%d's sharding every rank updates more optimizer state (%s more per step)",
        chosen.mesh.zero, HumanSeconds(d_compute));
  } else if (d_compute > 0) {
    why = absl::StrFormat("its busiest rank computes %s longer per step", HumanSeconds(d_compute));
  } else if (loser.mesh.cp > chosen.mesh.cp) {
    why = "predicted as fast; the mesh with fewer context-parallel ranks won";
  } else {
    why = "predicted as fast; the fewer model-parallel ranks and the lower ZeRO stage won";
  }
  return absl::StrFormat("%s; step %s vs %s", why, HumanSeconds(loser.step.total),
                         HumanSeconds(chosen.step.total));
}

std::string Explain(const Plan& plan) {
  const std::vector<Candidate>& all = plan.candidates;
  if (!plan.chosen) {
    const Candidate& smallest = all.front();
    return absl::StrFormat(
        "Nothing fits: the smallest footprint, %s, needs %s on its most loaded rank, over the %s "
        "a rank has on %s.",
        MeshName(smallest.mesh), HumanBytes(smallest.memory.total()), HumanBytes(smallest.capacity),
        plan.device.name);
  }
  const Candidate& chosen = all[*plan.chosen];
  const int fitting = static_cast<int>(
      std::count_if(all.begin(), all.end(), [](const Candidate& c) { return c.fits; }));
  std::string out = absl::StrFormat(
      "Chose %s: %s (step %s, %s tokens/s, MFU %.1f%%), %s of %s per rank.", MeshName(chosen.mesh),
      fitting > 1 ? absl::StrCat("the fastest of the ", fitting, " meshes that fit")
                  : std::string("the only mesh that fits"),
      HumanSeconds(chosen.step.total), HumanCount(chosen.tokens_per_second), 100 * chosen.mfu,
      HumanBytes(chosen.memory.total()), HumanBytes(chosen.capacity));
  out += WhyContextParallel(plan, chosen);
  // The best mesh of each other dp × cp × tp × pp split, and the chosen split's best other ZeRO
  // stage; for a chosen cp mesh, the best mesh without context parallelism among them.
  std::vector<const Candidate*> losers;
  const Candidate* other_stage = nullptr;
  auto same_split = [](const Candidate& a, const Candidate& b) {
    return SameSplit(a.mesh, b.mesh);
  };
  if (chosen.mesh.cp > 1) {
    for (int i = *plan.chosen + 1; i < fitting; ++i) {
      if (all[i].mesh.cp != 1) continue;
      losers.push_back(&all[i]);
      break;
    }
  }
  for (int i = *plan.chosen + 1; i < fitting; ++i) {
    if (SameMesh(all[i].mesh, chosen.mesh)) continue;  // another schedule: WhySchedule
    if (same_split(all[i], chosen)) {
      if (other_stage == nullptr) other_stage = &all[i];
      continue;
    }
    const bool seen = std::any_of(losers.begin(), losers.end(),
                                  [&](const Candidate* l) { return same_split(*l, all[i]); });
    if (!seen && losers.size() < kRunnersUp - 1) losers.push_back(&all[i]);
  }
  if (other_stage != nullptr) losers.push_back(other_stage);
  // The fastest mesh that does not fit, when it would have beaten the choice.
  const Candidate* fastest_unfit = nullptr;
  for (int i = fitting; i < static_cast<int>(all.size()); ++i) {
    if (fastest_unfit == nullptr || all[i].step.total < fastest_unfit->step.total) {
      fastest_unfit = &all[i];
    }
  }
  if (fastest_unfit != nullptr && fastest_unfit->step.total < chosen.step.total) {
    losers.push_back(fastest_unfit);
  }
  for (const Candidate* loser : losers) {
    absl::StrAppend(&out, " ", MeshName(loser->mesh), ": ", WhyLost(plan, *loser, chosen), ".");
  }
  return out + WhySchedule(plan, chosen);
}

}  // namespace trainyard::planner

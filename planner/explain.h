// The words of a plan: the choice and one sentence per runner-up, and the byte and time figures
// they quote.
//
// Threading: plain functions.
#ifndef TRAINYARD_PLANNER_EXPLAIN_H_
#define TRAINYARD_PLANNER_EXPLAIN_H_

#include <cstdint>
#include <string>

namespace trainyard::planner {

struct Candidate;
struct Plan;

// "Chose <mesh>: <why>." then "<mesh>: <why it lost>." for the runners-up: the best mesh of up
// to three other dp × cp × tp × pp splits (for a chosen cp mesh, the best without context
// parallelism among them), the chosen split's best other ZeRO stage, and the fastest mesh that
// does not fit when it would have been faster. A chosen cp mesh that is the only way to fit says
// so: "Context parallelism: cp N splits each sequence …; without it no mesh fits: …".
std::string Explain(const Plan& plan);

// Why `loser` lost to `chosen`, in one sentence without the mesh's name.
std::string WhyLost(const Plan& plan, const Candidate& loser, const Candidate& chosen);

// "1.50 GiB", "12.0 MiB", "512 B"; "12.3 ms", "1.20 s", "45 µs".
std::string HumanBytes(double bytes);
std::string HumanSeconds(double seconds);
// "950", "12.3k", "4.56M".
std::string HumanCount(double value);

}  // namespace trainyard::planner

#endif  // TRAINYARD_PLANNER_EXPLAIN_H_

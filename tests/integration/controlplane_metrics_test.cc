// A real Prometheus (Debian's `prometheus` package) scrapes the coordinator's /metrics while a
// job runs; its query API must show the job's step counter increasing.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <optional>
#include <string>
#include <thread>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "gtest/gtest.h"
#include "tests/integration/child_process.h"
#include "tests/integration/controlplane_util.h"

namespace trainyard::testenv {
namespace {

std::string FindPrometheus() {
  if (const char* path = std::getenv("PATH"); path != nullptr) {
    std::string dirs = path;
    size_t start = 0;
    while (start <= dirs.size()) {
      const size_t end = std::min(dirs.find(':', start), dirs.size());
      const std::string candidate = dirs.substr(start, end - start) + "/prometheus";
      if (access(candidate.c_str(), X_OK) == 0) return candidate;
      start = end + 1;
    }
  }
  return access("/usr/bin/prometheus", X_OK) == 0 ? "/usr/bin/prometheus" : "";
}

std::string UrlEncode(const std::string& text) {
  std::string out;
  for (unsigned char c : text) {
    if (isalnum(c) || c == '-' || c == '_' || c == '.' || c == '~') {
      out += static_cast<char>(c);
    } else {
      out += absl::StrFormat("%%%02X", c);
    }
  }
  return out;
}

// GET http://127.0.0.1:port/path over HTTP/1.0; the body, or "" on any failure.
std::string HttpGet(int port, const std::string& path) {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return "";
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  address.sin_port = htons(port);
  timeval timeout{5, 0};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &timeout, sizeof(timeout));
  std::string response;
  if (connect(fd, reinterpret_cast<sockaddr*>(&address), sizeof(address)) == 0) {
    const std::string request =
        absl::StrCat("GET ", path, " HTTP/1.0\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n");
    if (write(fd, request.data(), request.size()) == static_cast<ssize_t>(request.size())) {
      char buffer[4096];
      for (ssize_t n; (n = read(fd, buffer, sizeof(buffer))) > 0;) response.append(buffer, n);
    }
  }
  close(fd);
  const size_t body = response.find("\r\n\r\n");
  return body == std::string::npos ? "" : response.substr(body + 4);
}

// The value of the first sample in a Prometheus instant-query answer:
// {"status":"success","data":{"resultType":"vector","result":[{"metric":{...},"value":[t,"v"]}]}}
std::optional<double> FirstSample(const std::string& json) {
  const size_t value = json.find("\"value\":[");
  if (value == std::string::npos) return std::nullopt;
  const size_t open = json.find('"', json.find(',', value));
  const size_t close = json.find('"', open + 1);
  if (open == std::string::npos || close == std::string::npos) return std::nullopt;
  double sample = 0;
  if (!absl::SimpleAtod(json.substr(open + 1, close - open - 1), &sample)) return std::nullopt;
  return sample;
}

TEST(ControlPlaneMetricsTest, PrometheusScrapesTheStepCounterIncreasing) {
  const std::string prometheus = FindPrometheus();
  if (prometheus.empty()) {
    GTEST_SKIP() << "the prometheus binary is not installed (Debian package 'prometheus'); "
                    "skipping the scrape test";
  }
  ControlPlane cp("cp_metrics");
  cp.StartServer({.local_agent = true, .local_slots = 1, .metrics = true});
  const std::string metrics = cp.metrics_address();
  ASSERT_FALSE(metrics.empty());

  const int web_port = FreeLoopbackPort();
  const std::string config = cp.dir() + "/prometheus.yml";
  std::ofstream(config) << "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\n"
                        << "scrape_configs:\n  - job_name: trainyard\n"
                        << "    static_configs:\n      - targets: ['" << metrics << "']\n";
  ChildProcess server(
      {prometheus, "--config.file=" + config, "--storage.tsdb.path=" + cp.dir() + "/tsdb",
       absl::StrCat("--web.listen-address=127.0.0.1:", web_port), "--log.level=warn"},
      cp.dir() + "/prometheus.out", cp.dir() + "/prometheus.err");
  ASSERT_TRUE(server.running());

  const std::string job_id =
      cp.Submit(cp.WriteSpec("job.yaml", TinySpec({.name = "scraped", .steps = 1000000})));
  ASSERT_TRUE(cp.WaitForStep(job_id, 1, 120));
  const std::string query = absl::StrCat(
      "/api/v1/query?query=", UrlEncode("trainyard_job_step{job_id=\"" + job_id + "\"}"));
  std::optional<double> first, later;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(90);
  while (std::chrono::steady_clock::now() < deadline && !(first && later && *later > *first)) {
    std::this_thread::sleep_for(std::chrono::milliseconds(500));
    ASSERT_TRUE(server.running()) << ReadWholeFile(cp.dir() + "/prometheus.err");
    const std::optional<double> sample = FirstSample(HttpGet(web_port, query));
    if (!sample) continue;
    if (!first) {
      first = sample;
    } else {
      later = sample;
    }
  }
  ASSERT_TRUE(first.has_value()) << "Prometheus never returned the step of " << job_id << ": "
                                 << HttpGet(web_port, query)
                                 << ReadWholeFile(cp.dir() + "/prometheus.err");
  ASSERT_TRUE(later.has_value());
  EXPECT_GT(*later, *first) << "the scraped step counter did not increase";
  EXPECT_EQ(cp.Cli({"cancel", job_id}).exit_code, 0);
  EXPECT_EQ(cp.Cli({"watch", job_id}, 60).exit_code, 4);
}

}  // namespace
}  // namespace trainyard::testenv

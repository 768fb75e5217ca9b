#!/usr/bin/env python3
"""DeployMetricsTest: deploy/prometheus and deploy/grafana against a live coordinator.

1. `promtool check config`, `check rules` and `test rules` (deploy/prometheus/rules_test.yml).
2. Starts a coordinator (the embedded default: loopback, a local agent) in a temp directory,
   runs a checkpointing job and a tiny mixture-of-experts job to the end, and scrapes /metrics:
   every metric the rules and the dashboard query must be one it exports.
3. Starts a real Prometheus that scrapes that coordinator with deploy/prometheus/rules.yml, and
   runs every dashboard query and every rule through its query API: each must evaluate, the
   rules must load healthy, and the panels about jobs, training, checkpoints, nodes and MoE
   routing must return data.
Every process is stopped by its pid at the end, also on failure. Skips (77) without promtool or
prometheus.

Usage: metrics_test.py SOURCE_DIR BUILD_DIR
"""
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.parse
import urllib.request

SRC, BUILD = sys.argv[1], sys.argv[2]
PROM_DIR = os.path.join(SRC, "deploy", "prometheus")
DASHBOARD = os.path.join(SRC, "deploy", "grafana", "trainyard-dashboard.json")
SERVER = os.path.join(BUILD, "server", "trainyard-server")
CLI = os.path.join(BUILD, "tools", "cli", "trainyard")
# Series Prometheus makes itself, not the coordinator.
PROMETHEUS_OWN = {"up"}


def skip(why):
    print("SKIPPED:", why)
    sys.exit(77)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_for(what, predicate, seconds):
    deadline = time.time() + seconds
    while time.time() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.2)
    raise AssertionError(f"timed out after {seconds}s waiting for {what}")


def http_get(url):
    with urllib.request.urlopen(url, timeout=10) as r:
        return r.read().decode()


def rule_exprs():
    """Every alert expression of rules.yml (read with promtool's own parser would need Go; the
    file is plain enough that its `expr:` blocks are read here)."""
    exprs, current = [], None
    for line in open(os.path.join(PROM_DIR, "rules.yml"), encoding="utf-8"):
        m = re.match(r"^(\s*)expr:\s*(.*)$", line)
        if m:
            if current is not None:
                exprs.append(current[1])
            indent, rest = len(m.group(1)), m.group(2)
            current = [indent, "" if rest in (">-", "|", ">") else rest]
            continue
        if current is not None:
            if line.strip() and len(line) - len(line.lstrip()) > current[0]:
                current[1] += " " + line.strip()
            else:
                exprs.append(current[1])
                current = None
    if current is not None:
        exprs.append(current[1])
    return [e.strip() for e in exprs]


def dashboard_exprs():
    dash = json.load(open(DASHBOARD, encoding="utf-8"))
    out = []
    for panel in dash["panels"]:
        for target in panel.get("targets", []):
            out.append((panel["title"], target["expr"]))
    for var in dash.get("templating", {}).get("list", []):
        query = var.get("query")
        if isinstance(query, dict):
            query = query.get("query", "")
        m = re.match(r"label_values\((\w+)", query or "")
        if m:
            out.append((f"variable {var['name']}", m.group(1)))
    return out


# PromQL's own words: operators, aggregations and the functions the rules and panels use.
PROMQL_WORDS = {
    "and", "or", "unless", "bool", "offset", "by", "without", "on", "ignoring", "group_left",
    "group_right", "sum", "avg", "min", "max", "count", "stddev", "stdvar", "topk", "bottomk",
    "quantile", "count_values", "rate", "irate", "increase", "delta", "idelta", "deriv",
    "histogram_quantile", "absent", "absent_over_time", "clamp_min", "clamp_max", "abs", "time",
    "vector", "scalar", "sort", "sort_desc", "label_replace", "changes", "resets",
    "avg_over_time", "max_over_time", "min_over_time", "sum_over_time", "quantile_over_time",
}


def metric_names(expr):
    """The metric names an expression selects: what is left of its words once strings, label
    matchers, ranges, label lists and PromQL's own words are taken out."""
    e = re.sub(r'"[^"]*"', '""', expr)
    e = re.sub(r"\{[^}]*\}", " ", e)
    e = re.sub(r"\[[^\]]*\]", " ", e)
    e = re.sub(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", " ", e)
    return {w for w in re.findall(r"[a-zA-Z_:][a-zA-Z0-9_:]*", e) if w not in PROMQL_WORDS}


def family_of(name, families):
    if name in families:
        return name
    for suffix in ("_bucket", "_sum", "_count"):
        if name.endswith(suffix) and name[: -len(suffix)] in families:
            return name[: -len(suffix)]
    return None


def main():
    for tool in ("promtool", "prometheus"):
        if shutil.which(tool) is None:
            skip(f"{tool} is not installed (tools/setup.sh installs Debian's prometheus)")
    for binary in (SERVER, CLI):
        if not os.access(binary, os.X_OK):
            raise AssertionError(f"{binary} is not built")

    # 1. promtool.
    for args in (["check", "config", "prometheus.yml"], ["check", "rules", "rules.yml"],
                 ["test", "rules", "rules_test.yml"]):
        r = subprocess.run(["promtool", *args], cwd=PROM_DIR, capture_output=True, text=True)
        if r.returncode != 0:
            raise AssertionError(f"promtool {' '.join(args)}:\n{r.stdout}{r.stderr}")
        print("ok: promtool", " ".join(args))

    exprs = [("rule", e) for e in rule_exprs()] + dashboard_exprs()
    if len([e for e in exprs if e[0] == "rule"]) < 5:
        raise AssertionError(f"read only {len(exprs)} rule expressions from rules.yml")

    tmp = tempfile.mkdtemp(prefix="trainyard-metrics-")
    procs = []
    try:
        # 2. A live coordinator and a job that checkpoints.
        state = os.path.join(tmp, "state")
        server = subprocess.Popen([SERVER, "--state-dir", state, "--agent-slots", "1",
                                   "--agent-memory-tier-mb", "0"],
                                  stdout=subprocess.DEVNULL,
                                  stderr=open(os.path.join(tmp, "server.log"), "w"))
        procs.append(server)
        addr_file = os.path.join(state, "server.addr")
        metrics_file = os.path.join(state, "metrics.addr")
        wait_for("the coordinator", lambda: os.path.exists(metrics_file) and
                 os.path.getsize(metrics_file) > 0 and os.path.exists(addr_file), 30)
        metrics_addr = open(metrics_file).read().strip()
        env = dict(os.environ, TRAINYARD_SERVER=open(addr_file).read().strip(),
                   TRAINYARD_TOKEN_FILE=os.path.join(state, "admin.token"))
        spec = os.path.join(tmp, "job.yaml")
        with open(spec, "w") as f:
            f.write(open(os.path.join(SRC, "config", "examples", "tiny.yaml")).read())
            f.write(f"checkpoint: {{dir: {tmp}/ckpt, every_steps: 100}}\n")
        moe_spec = os.path.join(tmp, "moe.yaml")
        with open(moe_spec, "w") as f:
            f.write("name: tiny-moe\n"
                    "model: {preset: gpt2-debug, z_loss_coeff: 0.0001, moe: {experts: 4, "
                    "top_k: 2, balance: bias, z_loss_coeff: 0.001}}\n"
                    "data: {source: markov, markov: {vocab: 32, train_tokens: 50000, "
                    "val_tokens: 2000}}\n"
                    "training: {steps: 20, batch: 4, seq_len: 16, eval_every: 0, log_every: 10, "
                    "threads: 1}\n")
        for job_spec in (spec, moe_spec):
            r = subprocess.run([CLI, "submit", job_spec, "--watch"], env=env, capture_output=True,
                               text=True, timeout=300)
            if r.returncode != 0:
                raise AssertionError(f"the job did not succeed:\n{r.stdout[-2000:]}{r.stderr}")
        text = http_get(f"http://{metrics_addr}/metrics")
        if not re.search(r'^trainyard_moe_expert_tokens_max_share\{.*job_name="tiny-moe".*'
                         r'layer="1"\} ', text, re.M):
            raise AssertionError("no trainyard_moe_expert_tokens_max_share series of the MoE "
                                 "job's layer 1")
        for family, job in (("trainyard_job_val_loss", "tiny"),
                            ("trainyard_job_logit_z_loss", "tiny-moe"),
                            ("trainyard_job_grad_norm", "tiny-moe")):
            if not re.search(rf'^{family}\{{.*job_name="{job}".*\}} ', text, re.M):
                raise AssertionError(f"no {family} series of the job {job}")
        families = {line.split()[2] for line in text.splitlines() if line.startswith("# TYPE ")}
        missing = []
        for where, expr in exprs:
            for name in sorted(metric_names(expr)):
                if name in PROMETHEUS_OWN:
                    continue
                if family_of(name, families) is None:
                    missing.append(f"{where}: {name}")
        if missing:
            raise AssertionError("metrics the coordinator does not export:\n  " +
                                 "\n  ".join(missing))
        print(f"ok: all {len(exprs)} queries name only metrics the coordinator exports "
              f"({len(families)} families)")

        # 3. A real Prometheus scraping it, with the rules.
        prom_port = free_port()
        prom_dir = os.path.join(tmp, "prometheus")
        os.makedirs(prom_dir)
        shutil.copy(os.path.join(PROM_DIR, "rules.yml"), prom_dir)
        with open(os.path.join(prom_dir, "prometheus.yml"), "w") as f:
            f.write("global: {scrape_interval: 1s, evaluation_interval: 1s}\n"
                    "rule_files: [rules.yml]\n"
                    "scrape_configs:\n"
                    "  - job_name: trainyard-coordinator\n"
                    f"    static_configs: [{{targets: ['{metrics_addr}']}}]\n")
        prom = subprocess.Popen(
            ["prometheus", f"--config.file={prom_dir}/prometheus.yml",
             f"--storage.tsdb.path={prom_dir}/data", f"--web.listen-address=127.0.0.1:{prom_port}"],
            stdout=subprocess.DEVNULL, stderr=open(os.path.join(tmp, "prometheus.log"), "w"))
        procs.append(prom)
        api = f"http://127.0.0.1:{prom_port}/api/v1"

        def query(expr):
            url = f"{api}/query?" + urllib.parse.urlencode({"query": expr})
            try:
                return json.loads(http_get(url))
            except urllib.error.HTTPError as e:
                # A refused query answers JSON with its error; a Prometheus still starting
                # answers 503 with plain text ("Service Unavailable"): not ready yet.
                try:
                    return json.loads(e.read().decode())
                except ValueError:
                    return None
            except (urllib.error.URLError, ConnectionError):
                return None

        def scraped():
            r = query('up{job="trainyard-coordinator"} == 1')
            return r and r.get("status") == "success" and r["data"]["result"]

        wait_for("Prometheus to scrape the coordinator", scraped, 60)
        time.sleep(3)  # a few samples, so that rate() and increase() have two points
        with_data, problems = set(), []
        for where, expr in exprs:
            e = expr.replace("$__rate_interval", "1m").replace("$job", ".*")
            r = query(e)
            if r is None or r.get("status") != "success":
                problems.append(f"{where}: {e}: {r and r.get('error')}")
            elif r["data"]["result"]:
                with_data.add(where)
        if problems:
            raise AssertionError("queries Prometheus refused:\n  " + "\n  ".join(problems))
        must_have_data = {"Jobs by state", "Loss", "Tokens per second", "Step time by phase",
                          "Goodput", "Checkpoint interval and steps since the last",
                          "Heartbeat age", "Coordinator up", "variable job",
                          "Expert load CV by MoE layer", "Busiest expert's share by MoE layer",
                          "Dead experts and dropped tokens by MoE layer",
                          "Router losses by MoE layer", "Selection bias spread by MoE layer",
                          "Gradient norm", "Learning rate", "Logit z-loss"}
        empty = sorted(must_have_data - with_data)
        if empty:
            raise AssertionError(f"panels without data from a live coordinator: {empty}")
        groups = json.loads(http_get(f"{api}/rules"))["data"]["groups"]
        rules = [rule for g in groups for rule in g["rules"]]
        unhealthy = [f"{r['name']}: {r.get('lastError')}" for r in rules if r["health"] != "ok"]
        if len(rules) < 5 or unhealthy:
            raise AssertionError(f"{len(rules)} rules loaded; unhealthy: {unhealthy}")
        print(f"ok: Prometheus evaluated {len(exprs)} queries ({len(with_data)} with data) and "
              f"{len(rules)} healthy rules against the live coordinator")
    finally:
        for p in reversed(procs):
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        for p in procs:
            try:
                p.wait(timeout=15)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    try:
        main()
    except AssertionError as e:
        print("FAILED:", e, file=sys.stderr)
        sys.exit(1)

"""The deployment files, checked offline (no container engine or cluster runs on these machines):

- Dockerfile: hadolint clean (.hadolint.yaml says why what it ignores is ignored); every final
  target runs as a non-root user with a HEALTHCHECK, from a base pinned by version;
- docker-compose.yml: valid against the compose-spec schema, two GPU workers of one GPU each,
  PostgreSQL on a volume with a healthcheck, the secrets from .env, Prometheus scraping every
  service's /metrics (`promtool check config`);
- k8s/: both overlays render (`kubectl kustomize`) and pass `kubernetes-validate --strict`; the GPU
  workers sit on the overlay's nvidia.com/gpu.product, one GPU each, as many as the controller
  lists, with grpc.health.v1 probes; every container has probes, requests and limits;
- k8s/monitoring: the alert rules pass `promtool check rules` and their unit tests
  (`promtool test rules`); `specpilot stack up` is started,
  every /metrics it serves passes `promtool check metrics`, and every metric the dashboard and the
  rules name is one of those the services export.

Each tool comes from pyproject.toml's dev extra (pinned) or, for promtool, from .ci/run (Debian's
prometheus package); a test whose tool is missing is skipped with the reason.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
K8S = ROOT / "k8s"
DASHBOARD = K8S / "monitoring" / "specpilot-dashboard.json"
RULES = K8S / "monitoring" / "specpilot-alerts.yml"
OVERLAYS = {"h100": ("NVIDIA-H100-80GB-HBM3", "h100-sxm"),
            "rtxpro6000": ("NVIDIA-RTX-PRO-6000-Blackwell-Server-Edition", "rtx-pro-6000")}
TARGETS = ("controller", "memory-api", "celery-worker", "planner", "gpu-worker")


def tool(name: str) -> str:
    """The pinned tool in this interpreter's environment first (pip's kubectl, hadolint, ...), then PATH."""
    here = Path(sys.executable).parent / name
    found = str(here) if here.is_file() else shutil.which(name)
    if not found:
        pytest.skip(f"{name} is not installed (pip install -e '.[dev]'; promtool: apt-get install prometheus)")
    return found


def run(*argv, stdin: str | None = None, cwd: Path = ROOT) -> subprocess.CompletedProcess:
    return subprocess.run(argv, input=stdin, capture_output=True, text=True, cwd=cwd, timeout=120)


# ------------------------------------------------------------------ PromQL metric names
PROMQL_WORDS = {"by", "without", "on", "ignoring", "group_left", "group_right", "offset", "bool", "and", "or",
                "unless", "inf", "nan", "atan2"}


def metric_names(expr: str) -> set[str]:
    """The metric names a PromQL expression selects: identifiers outside strings, label matchers,
    range selectors and grouping lists that are neither functions, aggregations nor keywords."""
    e = re.sub(r'"(?:[^"\\]|\\.)*"|\'(?:[^\'\\]|\\.)*\'', '""', expr)      # strings
    e = re.sub(r"\{[^}]*\}", " ", e)                                       # label matchers
    e = re.sub(r"\[[^\]]*\]", " ", e)                                      # ranges, subqueries
    e = re.sub(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", " ", e)  # label lists
    e = re.sub(r"\boffset\s+-?(\d+(ms|[smhdwy]))+", " ", e)                  # offset durations
    e = re.sub(r"\b\d+(\.\d+)?(e[+-]?\d+)?\b", " ", e)                     # numbers
    names = set()
    for m in re.finditer(r"[A-Za-z_:][A-Za-z0-9_:]*", e):
        word, rest = m.group(0), e[m.end():].lstrip()
        if word.lower() in PROMQL_WORDS or rest.startswith("("):
            continue
        names.add(word)
    return names


def dashboard_exprs() -> list[str]:
    panels = json.loads(DASHBOARD.read_text())["panels"]
    found = [t["expr"] for p in panels for t in p.get("targets", [])]
    found += [t["expr"] for p in panels for sub in p.get("panels", []) for t in sub.get("targets", [])]
    return found


def rule_exprs() -> list[str]:
    return [r["expr"] for g in yaml.safe_load(RULES.read_text())["groups"] for r in g["rules"]]


def unexported(exprs: list[str], exported: set[str]) -> dict[str, set[str]]:
    return {e: metric_names(e) - exported for e in exprs if metric_names(e) - exported}


def exported_names(exposition: str) -> set[str]:
    """Every series name an exposition can carry: its samples' names and, per `# TYPE`, the family's
    (a histogram's _bucket, _sum, _count; a counter's _total)."""
    names = set()
    for line in exposition.splitlines():
        if line.startswith("# TYPE "):
            _, _, name, kind = line.split(None, 3)
            names.add(name)
            if kind in ("histogram", "summary"):
                names |= {name + s for s in ("_bucket", "_sum", "_count", "_created")}
            if kind == "counter" and not name.endswith("_total"):
                names.add(name + "_total")
        elif line and not line.startswith("#"):
            names.add(re.match(r"[A-Za-z_:][A-Za-z0-9_:]*", line).group(0))
    return names


def test_metric_names_are_read_from_promql():
    expr = ('histogram_quantile(0.9, sum by (le) (rate(specpilot_judge_duration_seconds_bucket{job="c"}[6h]))) '
            '/ on (job) group_left max without (instance) (specpilot_queue_depth offset 5m) > bool 1e3 '
            'and absent(specpilot_gpu_worker_up) or vector(1)')
    assert metric_names(expr) == {"specpilot_judge_duration_seconds_bucket", "specpilot_queue_depth",
                                  "specpilot_gpu_worker_up"}
    # a rule naming a metric no service exports is reported (what the stack test asserts is empty)
    assert unexported(["rate(specpilot_no_such_metric_total[5m]) > 0"], {"specpilot_queue_depth"}) == {
        "rate(specpilot_no_such_metric_total[5m]) > 0": {"specpilot_no_such_metric_total"}}
    assert exported_names("# TYPE h histogram\n# TYPE c_total counter\nc_total 1.0\n") >= {"h_bucket", "c_total"}


# ------------------------------------------------------------------ images
def stages() -> dict[str, list[str]]:
    """Dockerfile stages by name: their instructions (continuation lines joined)."""
    text = re.sub(r"\\\n", " ", (ROOT / "Dockerfile").read_text())
    out, current = {}, None
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        m = re.match(r"FROM\s+(\S+)\s+AS\s+(\S+)", line, re.I)
        if m:
            current = m.group(2)
            out[current] = [line]
        elif current:
            out[current].append(line)
    return out


def test_dockerfile_is_hadolint_clean():
    proc = run(tool("hadolint"), "--config", str(ROOT / ".hadolint.yaml"), "--no-color", "Dockerfile")
    assert proc.returncode == 0 and not proc.stdout.strip(), proc.stdout + proc.stderr
    bad = run(tool("hadolint"), "--config", str(ROOT / ".hadolint.yaml"), "--no-color", "-",
              stdin="FROM python:latest\nRUN cd /tmp && pip install x\n")
    assert bad.returncode != 0 and "DL3007" in bad.stdout  # it does fail


def test_every_service_target_is_non_root_healthchecked_and_pinned():
    text = (ROOT / "Dockerfile").read_text()
    st = stages()
    args = dict(re.findall(r"^ARG (\w+)=(\S+)", text, re.M))
    for name, lines in st.items():
        base = lines[0].split()[1]
        base = args.get(base.strip("${}"), base) if base.startswith("${") else base
        if base in st:
            continue
        assert re.fullmatch(r"[\w./-]+:\d[\w.-]*(@sha256:[0-9a-f]{64})?", base), f"stage {name}: base {base} unpinned"

    def chain(name):  # the stage and the stages it is built FROM
        while name in st:
            yield name
            name = st[name][0].split()[1]

    for target in TARGETS:
        assert target in st, f"no target {target}"
        assert any(line.startswith("HEALTHCHECK") for line in st[target]), f"{target}: no HEALTHCHECK"
        users = [line.split()[1] for s in chain(target) for line in st[s] if line.startswith("USER")]
        assert users and users[0] not in ("root", "0", "0:0"), f"{target}: runs as root"
        installs = " ".join(line for s in chain(target) for line in st[s] if "apt-get install" in line)
        assert not re.search(r"\b(build-essential|gcc|g\+\+|make|python3-dev|python3-venv|curl)\b", installs), \
            f"{target}: build tools in a final stage: {installs}"
    ignored = (ROOT / ".dockerignore").read_text().split()
    assert {".git", ".venv", ".env", "tests"} <= set(ignored)


# ------------------------------------------------------------------ docker-compose
def compose() -> dict:
    return yaml.safe_load((ROOT / "docker-compose.yml").read_text())


def test_compose_file_is_valid_against_the_compose_spec(tmp_path):
    check = tool("check-jsonschema")
    proc = run(check, "--builtin-schema", "vendor.compose-spec", "docker-compose.yml")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    broken = tmp_path / "compose.yml"
    broken.write_text((ROOT / "docker-compose.yml").read_text().replace("    restart: unless-stopped\n",
                                                                       "    restartt: unless-stopped\n", 1))
    assert run(check, "--builtin-schema", "vendor.compose-spec", str(broken)).returncode != 0  # it does fail


def test_compose_services_gpus_secrets_and_scrapes():
    c = compose()
    services = c["services"]
    assert {"redis", "postgres", "memory-api", "controller", "celery-worker", "planner", "gpu-worker-0",
            "gpu-worker-1", "prometheus", "grafana"} <= set(services)
    pg = services["postgres"]
    assert any(v.startswith("postgres:") for v in pg["volumes"]) and "postgres" in c["volumes"]
    assert pg["healthcheck"]["test"][:2] == ["CMD", "pg_isready"]
    ids = []
    for name in ("gpu-worker-0", "gpu-worker-1"):
        [dev] = services[name]["deploy"]["resources"]["reservations"]["devices"]
        assert dev["driver"] == "nvidia" and "gpu" in dev["capabilities"] and len(dev["device_ids"]) == 1
        ids += dev["device_ids"]
        assert services[name]["build"]["target"] == "gpu-worker" and "--kind" in services[name]["command"]
    assert len(set(ids)) == 2
    env = services["controller"]["environment"]
    assert env["SPECPILOT_GPU_WORKERS"] == "gpu-worker-0:50051,gpu-worker-1:50051"
    # the secrets come from .env; .env.example names every variable the file needs, with no value
    text = (ROOT / "docker-compose.yml").read_text()
    needed = set(re.findall(r"\$\{(\w+):\?", text))
    example = dict(line.split("=", 1) for line in (ROOT / ".env.example").read_text().splitlines()
                   if line and not line.startswith("#"))
    assert {"SPECPILOT_TOKEN", "POSTGRES_PASSWORD"} <= needed <= set(example)
    assert all(example[k] == "" for k in needed)
    tracked = run("git", "ls-files", ".env", "k8s/base/secrets.env").stdout
    assert tracked == "", f"secrets are committed: {tracked}"
    # Prometheus scrapes every process's /metrics
    prom = yaml.safe_load((ROOT / "deploy" / "compose" / "prometheus.yml").read_text())
    targets = {t for job in prom["scrape_configs"] for sc in job["static_configs"] for t in sc["targets"]}
    assert targets == {"controller:8700", "memory-api:8710", "gpu-worker-0:9100", "gpu-worker-1:9100",
                       "celery-worker:9101", "planner:9101"}
    mounts = " ".join(services["prometheus"]["volumes"] + services["grafana"]["volumes"])
    assert "k8s/monitoring/specpilot-alerts.yml" in mounts and "k8s/monitoring/specpilot-dashboard.json" in mounts
    datasource = yaml.safe_load((ROOT / "deploy/compose/grafana/provisioning/datasources/prometheus.yml").read_text())
    assert datasource["datasources"][0]["url"] == "http://prometheus:9090"


def test_compose_prometheus_config_passes_promtool():
    proc = run(tool("promtool"), "check", "config", "--syntax-only", "deploy/compose/prometheus.yml")
    assert proc.returncode == 0, proc.stdout + proc.stderr


# ------------------------------------------------------------------ Kubernetes
def render(overlay: str, tmp_path: Path) -> list[dict]:
    copy = tmp_path / "k8s"
    shutil.copytree(K8S, copy)
    example = (copy / "base" / "secrets.env.example").read_text()
    (copy / "base" / "secrets.env").write_text(re.sub(r"^(\w+)=$", r"\1=test-value", example, flags=re.M))
    proc = run(tool("kubectl"), "kustomize", str(copy / "overlays" / overlay))
    assert proc.returncode == 0, proc.stderr
    return [d for d in yaml.safe_load_all(proc.stdout) if d]


def validate_strict(docs: list[dict], tmp_path: Path) -> subprocess.CompletedProcess:
    path = tmp_path / "rendered.yaml"
    path.write_text(yaml.safe_dump_all(docs))
    return run(tool("kubernetes-validate"), "--strict", "--quiet", str(path))


def test_a_base_without_its_secrets_file_does_not_render(tmp_path):
    shutil.copytree(K8S, tmp_path / "k8s")
    proc = run(tool("kubectl"), "kustomize", str(tmp_path / "k8s" / "overlays" / "h100"))
    assert proc.returncode != 0 and "secrets.env" in proc.stderr


@pytest.mark.parametrize("overlay", sorted(OVERLAYS))
def test_overlay_renders_and_validates_strictly(overlay, tmp_path):
    docs = render(overlay, tmp_path)
    proc = validate_strict(docs, tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    # --strict does fail on an unknown field
    bad = [json.loads(json.dumps(d)) for d in docs]
    next(d for d in bad if d["kind"] == "StatefulSet")["spec"]["template"]["spec"]["containers"][0]["gpus"] = 1
    assert validate_strict(bad, tmp_path).returncode != 0


@pytest.mark.parametrize("overlay", sorted(OVERLAYS))
def test_overlay_gpu_workers_probes_resources_and_secrets(overlay, tmp_path):
    from specpilot.services.planner.costmodel import DEVICES

    product, kind = OVERLAYS[overlay]
    docs = render(overlay, tmp_path)
    by = {(d["kind"], d["metadata"]["name"]): d for d in docs}
    config = next(d for d in docs if d["kind"] == "ConfigMap" and d["metadata"]["name"].startswith("specpilot-config"))
    assert config["data"]["SPECPILOT_GPU_KIND"] == kind and kind in DEVICES
    sts = by[("StatefulSet", "gpu-worker")]
    pod = sts["spec"]["template"]["spec"]
    assert pod["nodeSelector"] == {"nvidia.com/gpu.product": product}
    assert {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"} in pod["tolerations"]
    [worker] = pod["containers"]
    assert worker["resources"]["limits"]["nvidia.com/gpu"] == 1
    assert worker["args"][worker["args"].index("--kind") + 1] == "$(SPECPILOT_GPU_KIND)"
    port = next(p["containerPort"] for p in worker["ports"] if p["name"] == "grpc")
    for probe in ("readinessProbe", "livenessProbe"):
        assert worker[probe]["grpc"]["port"] == port  # grpc.health.v1, served by the worker
    n = sts["spec"]["replicas"]
    assert config["data"]["SPECPILOT_GPU_WORKERS"].split(",") == [f"gpu-worker-{i}.gpu-worker:{port}" for i in range(n)]
    assert by[("Service", "gpu-worker")]["spec"]["clusterIP"] == "None"
    # every container: probes, requests and limits; ours HTTP (or gRPC) probes on their own ports
    for d in docs:
        if d["kind"] not in ("Deployment", "StatefulSet"):
            continue
        for c in d["spec"]["template"]["spec"]["containers"]:
            where = f"{d['metadata']['name']}/{c['name']}"
            assert c.get("readinessProbe") and c.get("livenessProbe"), f"{where}: no probes"
            assert c["resources"].get("requests") and c["resources"].get("limits"), f"{where}: no requests/limits"
            if c["image"].startswith("specpilot/"):
                names = {p["name"] for p in c["ports"]}
                for probe in ("readinessProbe", "livenessProbe"):
                    assert "grpc" in c[probe] or c[probe]["httpGet"]["port"] in names, f"{where}: {probe}"
    # PostgreSQL on a claim; the token from the Secret
    claims = [v["persistentVolumeClaim"]["claimName"] for v in
              by[("Deployment", "postgres")]["spec"]["template"]["spec"]["volumes"]]
    assert claims and all(("PersistentVolumeClaim", c) in by for c in claims)
    secret = next(d for d in docs if d["kind"] == "Secret")
    assert {"SPECPILOT_TOKEN", "POSTGRES_PASSWORD"} <= set(secret["data"])
    controller = by[("Deployment", "controller")]["spec"]["template"]["spec"]["containers"][0]
    token = next(e for e in controller["env"] if e["name"] == "SPECPILOT_TOKEN")
    assert token["valueFrom"]["secretKeyRef"]["name"] == secret["metadata"]["name"]
    rounds = next(c for c in by[("Deployment", "controller")]["spec"]["template"]["spec"]["containers"]
                  if c["name"] == "rounds-worker")
    assert rounds["args"] == ["-Q", "rounds.$(SPECPILOT_GPU_KIND)"]
    # the ServiceMonitor (no schema offline) selects our Services, and each endpoint port is one of theirs
    monitor = next(d for d in docs if d["kind"] == "ServiceMonitor")
    selected = [d for d in docs if d["kind"] == "Service" and
                monitor["spec"]["selector"]["matchLabels"].items() <= d["metadata"].get("labels", {}).items()]
    ports = {p["name"] for s in selected for p in s["spec"]["ports"]}
    assert {"controller", "memory-api", "gpu-worker"} <= {s["metadata"]["name"] for s in selected}
    assert {e["port"] for e in monitor["spec"]["endpoints"]} <= ports
    assert {("ConfigMap", "specpilot-grafana-dashboard"), ("ConfigMap", "specpilot-alert-rules")} <= set(by)


# ------------------------------------------------------------------ rules, dashboard and the exported metrics
def test_alert_rules_pass_promtool(tmp_path):
    promtool = tool("promtool")
    proc = run(promtool, "check", "rules", str(RULES))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    broken = tmp_path / "rules.yml"
    broken.write_text(RULES.read_text().replace("> 5", "> > 5", 1))
    assert run(promtool, "check", "rules", str(broken)).returncode != 0  # it does fail
    # each alert fires on the series that should fire it (and the unit tests notice a changed rule)
    tests = RULES.with_name("specpilot-alerts.test.yml")
    proc = run(promtool, "test", "rules", str(tests))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    shutil.copy(tests, tmp_path / tests.name)
    changed = RULES.read_text().replace("(specpilot_queue_depth) > 5", "(specpilot_queue_depth) > 50")
    assert changed != RULES.read_text()
    (tmp_path / RULES.name).write_text(changed)
    assert run(promtool, "test", "rules", str(tmp_path / tests.name)).returncode != 0
    names = {r["alert"] for g in yaml.safe_load(RULES.read_text())["groups"] for r in g["rules"]}
    assert {"SpecPilotGpuWorkerDown", "SpecPilotQueueBackingUp", "SpecPilotRoundFailed",
            "SpecPilotTooManyNoiseRejections"} <= names


def test_dashboard_shows_what_a_user_watches():
    dash = json.loads(DASHBOARD.read_text())
    assert dash["uid"] and any(v["type"] == "datasource" for v in dash["templating"]["list"])
    named = set().union(*(metric_names(e) for e in dashboard_exprs()))
    assert {"specpilot_rounds", "specpilot_verdicts_total", "specpilot_rejections_total",
            "specpilot_judge_duration_seconds_bucket", "specpilot_incumbent_tau",
            "specpilot_incumbent_tokens_per_second", "specpilot_worker_healthy", "specpilot_queue_depth"} <= named
    ids = [p["id"] for p in dash["panels"]]
    assert len(ids) == len(set(ids))


def _e2e_helpers():
    spec = importlib.util.spec_from_file_location("specpilot_e2e_stack", ROOT / "tests" / "e2e" / "test_stack.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.fixture(scope="module")
def scrapes(tmp_path_factory):
    """{process: its /metrics text}, from every process `specpilot stack up` starts (Redis needed)."""
    import redis

    e2e = _e2e_helpers()
    url = e2e.REDIS.rsplit("/", 1)[0] + "/12"
    try:
        redis.Redis.from_url(url, socket_timeout=2).ping()
    except redis.RedisError as e:
        pytest.skip(f"Redis unreachable at {url}: {e}")
    data = tmp_path_factory.mktemp("deploy-stack")
    with e2e.running_stack(data, "--redis", url) as info:
        out, deadline = {}, time.time() + 120
        while len(out) < len(info["metrics"]) and time.time() < deadline:
            for name, u in info["metrics"].items():  # the Celery workers serve theirs once ready
                if name not in out:
                    try:
                        r = httpx.get(u, timeout=10)
                        if r.status_code == 200:
                            out[name] = r.text
                    except httpx.HTTPError:
                        pass
            time.sleep(0.5)
        missing = set(info["metrics"]) - set(out)
        assert not missing, f"no /metrics from {missing} within 120 s"
    redis.Redis.from_url(url).flushdb()
    return out


@pytest.mark.timeout(400)
def test_every_scrape_passes_promtool_and_every_named_metric_is_exported(scrapes):
    promtool = tool("promtool")
    assert {"controller", "memory-api", "gpu-worker-0", "gpu-worker-1", "rounds-worker", "planner-worker"} <= \
        set(scrapes)
    for name, text in scrapes.items():
        proc = run(promtool, "check", "metrics", stdin=text)
        assert proc.returncode == 0, f"{name}: {proc.stdout}{proc.stderr}"
    exported = set().union(*(exported_names(t) for t in scrapes.values()))
    assert unexported(dashboard_exprs(), exported) == {}
    assert unexported(rule_exprs(), exported) == {}


# ------------------------------------------------------------------ what the images' health checks and scrapes rely on
def healthcheck(target: str) -> subprocess.CompletedProcess:
    return run(sys.executable, "-m", "specpilot.entrypoints.healthcheck", target)


def test_healthcheck_answers_for_grpc_health_and_http_and_names_what_is_down():
    from specpilot.services.gpu_worker.server import serve

    server, servicer, port = serve("cpu:0", "cpu", 0)
    try:
        ok = healthcheck(f"grpc://127.0.0.1:{port}")
        assert ok.returncode == 0, ok.stderr
    finally:
        servicer.close()
        server.stop(grace=0)
    down = healthcheck(f"grpc://127.0.0.1:{port}")
    assert down.returncode == 1 and down.stderr.count("\n") == 1 and f"127.0.0.1:{port}" in down.stderr
    http = healthcheck(f"http://127.0.0.1:{port}/healthz")
    assert http.returncode == 1 and http.stderr.startswith("unhealthy: ")
    assert healthcheck("localhost:1").returncode == 2


def test_celery_metrics_bind_to_the_configured_host():
    from specpilot.entrypoints.stack_cli import free_port

    port = free_port()
    code = f"from specpilot.queue import serve_metrics; import time; serve_metrics({port}); time.sleep(60)"
    proc = subprocess.Popen([sys.executable, "-c", code], env={**os.environ, "SPECPILOT_METRICS_HOST": "127.0.0.2"})
    try:
        deadline = time.time() + 30
        while healthcheck(f"http://127.0.0.2:{port}/metrics").returncode and time.time() < deadline:
            time.sleep(0.3)
        assert healthcheck(f"http://127.0.0.2:{port}/metrics").returncode == 0
        assert healthcheck(f"http://127.0.0.1:{port}/metrics").returncode == 1  # not the default address
    finally:
        proc.kill()
        proc.wait()

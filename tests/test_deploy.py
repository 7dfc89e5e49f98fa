"""The Helm chart in deploy/helm/streamer: it renders (Helm's own engine, from the PyPI package
helm-python-sdk), every object validates against the Kubernetes schemas (kubernetes-validate,
offline), and the rules that keep streams alive hold against the real server: probes on its real
endpoints, a termination grace that outlasts its drain, the environment it actually reads, GPUs
requested, and the HPA's metric present in a real server's /metrics.
"""

from __future__ import annotations

import re
import urllib.error
import urllib.request
from pathlib import Path

import pytest
import yaml

from streamer.config import ENV_VARS, load_settings

ROOT = Path(__file__).resolve().parents[1]
CHART = ROOT / "deploy" / "helm" / "streamer"

KUBE_VERSIONS = ("1.29.0", "1.37.0")
"""The chart's lowest supported Kubernetes (Chart.yaml kubeVersion) and the newest schemas shipped."""

LIBRARY_ENV = {"HF_HOME", "HF_HUB_OFFLINE", "LOG_LEVEL"}
"""Environment the pod sets that is not a server setting: the Hugging Face cache, and the CLI's log level."""

FULL = {
    "gpu": {"count": 8},
    "model": {"id": "/models/large-v3-turbo", "offline": True, "vramLimitGB": 120,
              "volume": {"persistentVolumeClaim": {"claimName": "whisper-weights", "readOnly": True}},
              "cache": {"existingClaim": "hf-cache"}},
    "server": {"maxSessions": 512, "idleTimeoutSeconds": 120, "maxUploadMB": 500,
               "extraEnv": [{"name": "MAX_LOOP_LAG_S", "value": "1.5"}]},
    "apiKey": {"existingSecret": "streamer-api-key"},
    "drain": {"shutdownGraceSeconds": 60},
    "probes": {"liveness": {"periodSeconds": 10, "failureThreshold": 20}},
    "ingress": {"host": "stt.example.org", "tls": [{"secretName": "stt-tls", "hosts": ["stt.example.org"]}],
                "affinity": {"mode": "header"}},
    "autoscaling": {"engineBusy": {"enabled": True}, "maxReplicas": 40},
    "prometheusAdapter": {"namespace": "monitoring"},
    "serviceMonitor": {"labels": {"release": "kube-prometheus-stack"}},
}
"""Every optional part switched on, at a production shape (8-GPU pods, an API key, header affinity)."""

MINIMAL = {"autoscaling": {"enabled": False}, "ingress": {"enabled": False}, "serviceMonitor": {"enabled": False},
           "service": {"type": "LoadBalancer", "sessionAffinity": "ClientIP"},
           "prometheusAdapter": {"rules": False}, "podDisruptionBudget": {"enabled": False},
           "serviceAccount": {"create": False}}

VARIANTS = {"default": {}, "full": FULL, "minimal": MINIMAL}


@pytest.fixture(scope="module")
def helm():
    return pytest.importorskip(
        "helm_python", reason="helm-python-sdk (Helm's renderer, in the `test` extra) has no wheel for this platform")


def render(helm, values: dict) -> list[dict]:
    """`helm template streamer deploy/helm/streamer -n stt` with `values`: the objects, in order."""
    with helm.Chart.load(str(CHART)) as chart:
        manifests = chart.render(values, name="streamer", namespace="stt")
    return [doc for path, text in sorted(manifests.items()) if path.endswith(".yaml")
            for doc in yaml.safe_load_all(text) if doc]


@pytest.fixture(scope="module")
def rendered(helm) -> dict[str, list[dict]]:
    return {name: render(helm, values) for name, values in VARIANTS.items()}


def one(objects: list[dict], kind: str) -> dict:
    found = [o for o in objects if o["kind"] == kind]
    assert len(found) == 1, f"{len(found)} objects of kind {kind}"
    return found[0]


def container(objects: list[dict]) -> dict:
    return one(objects, "Deployment")["spec"]["template"]["spec"]["containers"][0]


def env_of(objects: list[dict]) -> dict[str, dict]:
    return {e["name"]: e for e in container(objects)["env"]}


def plain_env(objects: list[dict]) -> dict[str, str]:
    return {k: e["value"] for k, e in env_of(objects).items() if "value" in e}


def check_service_monitor(sm: dict) -> None:
    """No offline schema exists for the Prometheus Operator's CRD: its fields are checked by hand
    against the operator's v1 API (selector, namespaceSelector, endpoints[].port/path/interval/
    scrapeTimeout/authorization)."""
    assert sm["apiVersion"] == "monitoring.coreos.com/v1" and set(sm) == {"apiVersion", "kind", "metadata", "spec"}
    spec = sm["spec"]
    assert set(spec) <= {"selector", "namespaceSelector", "endpoints"} and spec["selector"]["matchLabels"]
    for endpoint in spec["endpoints"]:
        assert set(endpoint) <= {"port", "path", "interval", "scrapeTimeout", "authorization"}, endpoint
        assert re.fullmatch(r"\d+s", endpoint["interval"]) and re.fullmatch(r"\d+s", endpoint["scrapeTimeout"])
        if "authorization" in endpoint:
            auth = endpoint["authorization"]
            assert auth["type"] == "Bearer" and set(auth["credentials"]) == {"name", "key"}


@pytest.mark.parametrize("variant", VARIANTS)
def test_every_object_validates_against_the_kubernetes_schemas(rendered, variant):
    import kubernetes_validate

    objects = rendered[variant]
    kinds = sorted(o["kind"] for o in objects)
    expected = {"default": ["ConfigMap", "Deployment", "HorizontalPodAutoscaler", "Ingress", "PodDisruptionBudget",
                            "Service", "ServiceAccount", "ServiceMonitor"],
                "minimal": ["Deployment", "Service"]}
    expected["full"] = expected["default"]
    assert kinds == expected[variant]
    for obj in objects:
        if obj["kind"] == "ServiceMonitor":
            check_service_monitor(obj)
            continue
        for version in KUBE_VERSIONS:
            kubernetes_validate.validate(obj, version, strict=True)  # raises on any error


def test_helm_lint_is_clean(helm):
    for values in VARIANTS.values():
        report = helm.lint(str(CHART), values, strict=True, namespace="stt")
        problems = [m for m in report["messages"] if m["severity"] >= 2]
        assert not report["errors"] and not problems, report


def test_the_pod_requests_gpus_and_runs_one_engine_core_per_gpu(rendered):
    for variant, gpus in (("default", 1), ("full", 8)):
        c = container(rendered[variant])
        assert c["resources"]["requests"]["nvidia.com/gpu"] == gpus == c["resources"]["limits"]["nvidia.com/gpu"]
        assert "cpu" not in c["resources"]["limits"]  # no CFS throttling of the audio path
        assert plain_env(rendered[variant])["DEVICE"] == "cuda"  # every GPU the device plugin shows the pod
        settings = load_settings(plain_env(rendered[variant]))
        assert settings.model.device == "cuda"
    assert load_settings(plain_env(rendered["full"])).engine.vram_limit_gb == 120.0


def test_the_pod_sets_only_environment_the_server_reads(rendered):
    """A variable the server ignores is a setting that silently does nothing (a drain that stays
    at its default, say)."""
    for objects in rendered.values():
        env = env_of(objects)
        unknown = set(env) - set(ENV_VARS) - LIBRARY_ENV
        assert not unknown, f"the server reads no {sorted(unknown)} (streamer/config.py ENV_VARS)"
        settings = load_settings(plain_env(objects))
        assert settings.server.host == "0.0.0.0"
        assert settings.server.port == container(objects)["ports"][0]["containerPort"]
    full = load_settings(plain_env(rendered["full"]))
    assert (full.model.model, full.server.max_sessions, full.server.idle_timeout_s, full.server.shutdown_grace_s) \
        == ("/models/large-v3-turbo", 512, 120.0, 60.0)


def test_volumes_have_one_source_and_every_mount_a_volume(rendered):
    """Helm merges maps of values into the defaults: a volume given as a map could end up with two sources."""
    for objects in rendered.values():
        pod = one(objects, "Deployment")["spec"]["template"]["spec"]
        volumes = {v["name"]: set(v) - {"name"} for v in pod["volumes"]}
        assert all(len(sources) == 1 for sources in volumes.values()), volumes
        assert {m["name"] for m in pod["containers"][0]["volumeMounts"]} == set(volumes)
    pod = one(rendered["full"], "Deployment")["spec"]["template"]["spec"]
    assert {v["name"]: v for v in pod["volumes"]}["hf-cache"] == \
        {"name": "hf-cache", "persistentVolumeClaim": {"claimName": "hf-cache"}}


def test_no_secret_in_the_chart(rendered):
    for objects in rendered.values():
        assert not [o for o in objects if o["kind"] == "Secret"]
        key = env_of(objects).get("API_KEY")
        assert key is None or set(key) == {"name", "valueFrom"}
    ref = env_of(rendered["full"])["API_KEY"]["valueFrom"]["secretKeyRef"]
    assert ref == {"name": "streamer-api-key", "key": "api-key"}
    # /metrics needs the key too: the ServiceMonitor presents it from the same Secret.
    auth = one(rendered["full"], "ServiceMonitor")["spec"]["endpoints"][0]["authorization"]
    assert auth["credentials"] == ref
    assert "authorization" not in one(rendered["default"], "ServiceMonitor")["spec"]["endpoints"][0]


def test_grace_period_outlasts_prestop_and_the_servers_own_drain(rendered, engine):
    """terminationGracePeriodSeconds >= preStop + the real server's longest exit after SIGTERM:
    its stream drain (`ServerState.drain`: grace + 1 s) then uvicorn's graceful shutdown
    (`timeout_graceful_shutdown` of the server `streamer serve` builds), read from the server itself."""
    from streamer.server.app import build_server, create_app

    for objects in rendered.values():
        pod = one(objects, "Deployment")["spec"]["template"]["spec"]
        settings = load_settings(plain_env(objects))
        server = build_server(create_app(settings, engine), "127.0.0.1", 0)
        grace = settings.server.shutdown_grace_s
        server_exit = (grace + 1.0) + server.config.timeout_graceful_shutdown
        pre_stop = pod["containers"][0]["lifecycle"]["preStop"]["exec"]["command"]
        assert pre_stop[0] == "sleep"
        assert pod["terminationGracePeriodSeconds"] >= int(pre_stop[1]) + server_exit
        liveness = pod["containers"][0]["livenessProbe"]
        assert liveness["periodSeconds"] * liveness["failureThreshold"] > pod["terminationGracePeriodSeconds"], \
            "a draining pod answers 503: liveness must not restart it before the drain ends"
    assert load_settings(plain_env(rendered["full"])).server.shutdown_grace_s == 60.0  # SHUTDOWN_GRACE_S is read


def test_probes_and_metrics_point_at_real_endpoints(rendered, engine):
    """Every probe path answers 200 on a real server once its engine is up, and 503 while it drains;
    the ServiceMonitor's path is the real /metrics; every port the objects name exists."""
    from streamer.server.app import create_app, running

    objects = rendered["default"]
    c = container(objects)
    paths = {c[probe]["httpGet"]["path"] for probe in ("startupProbe", "readinessProbe", "livenessProbe")}
    assert {c[probe]["httpGet"]["port"] for probe in ("startupProbe", "readinessProbe", "livenessProbe")} == {"http"}
    assert [p["name"] for p in c["ports"]] == ["http"]
    service = one(objects, "Service")
    assert service["spec"]["ports"][0]["targetPort"] == "http"
    ingress_backend = one(objects, "Ingress")["spec"]["rules"][0]["http"]["paths"][0]["backend"]["service"]
    assert ingress_backend == {"name": service["metadata"]["name"], "port": {"name": "http"}}
    monitor = one(objects, "ServiceMonitor")["spec"]["endpoints"][0]
    assert monitor["port"] == "http"
    app = create_app(load_settings({}), engine)
    with running(app) as url:
        for path in paths | {monitor["path"]}:
            assert urllib.request.urlopen(url + path, timeout=10).status == 200, path
        app.state.streamer.shutting_down = True  # as during a drain: out of the Service
        for path in paths:
            with pytest.raises(urllib.error.HTTPError) as refused:
                urllib.request.urlopen(url + path, timeout=10)
            assert refused.value.code == 503


def test_selectors_match_the_pods(rendered):
    for objects in rendered.values():
        deployment = one(objects, "Deployment")
        labels = deployment["spec"]["template"]["metadata"]["labels"]
        selectors = [deployment["spec"]["selector"]["matchLabels"], one(objects, "Service")["spec"]["selector"]]
        selectors += [o["spec"]["selector"]["matchLabels"] for o in objects
                      if o["kind"] in ("PodDisruptionBudget", "ServiceMonitor")]
        for selector in selectors:
            assert selector.items() <= labels.items()
        for hpa in (o for o in objects if o["kind"] == "HorizontalPodAutoscaler"):
            assert hpa["spec"]["scaleTargetRef"]["name"] == deployment["metadata"]["name"]
            assert "replicas" not in deployment["spec"]  # the HPA owns the count


def adapter_rules(objects: list[dict]) -> dict[str, str]:
    """prometheus-adapter's rules in the chart: exposed metric name -> Prometheus series it reads."""
    config = yaml.safe_load(one(objects, "ConfigMap")["data"]["config.yaml"])
    rules = {}
    for rule in config["rules"]:
        series = re.match(r"([a-zA-Z_:][a-zA-Z0-9_:]*)\{", rule["seriesQuery"]).group(1)
        assert re.fullmatch(rule["name"]["matches"], series)
        assert rule["resources"]["overrides"]["pod"] == {"resource": "pod"}  # a per-pod metric, as the HPA reads it
        assert "<<.GroupBy>>" in rule["metricsQuery"]
        rules[rule["name"]["as"]] = series
    return rules


def test_hpa_metrics_exist_in_a_real_servers_metrics(rendered, engine):
    """Each HPA metric is served by an adapter rule in the chart, and the series that rule reads
    is in a real server's /metrics with a sample, on an idle server too (no series: no scaling)."""
    from streamer.server.app import create_app, running

    objects = rendered["full"]
    rules = adapter_rules(objects)
    hpa = one(objects, "HorizontalPodAutoscaler")
    wanted = [m["pods"]["metric"]["name"] for m in hpa["spec"]["metrics"]]
    assert wanted == ["streamer_live_streams", "streamer_engine_busy"]
    assert one(rendered["default"], "HorizontalPodAutoscaler")["spec"]["metrics"][0]["pods"]["target"] \
        == {"type": "AverageValue", "averageValue": "48"}
    assert hpa["spec"]["metrics"][0]["pods"]["target"]["averageValue"] == str(48 * 8)  # per GPU x GPUs per pod
    assert hpa["spec"]["metrics"][1]["pods"]["target"]["averageValue"] == "6400m"
    assert one(objects, "ConfigMap")["metadata"]["namespace"] == "monitoring"
    app = create_app(load_settings({}), engine)
    with running(app) as url:
        text = urllib.request.urlopen(url + "/metrics", timeout=10).read().decode()
    samples = {line.split("{")[0].split(" ")[0] for line in text.splitlines() if line and not line.startswith("#")}
    for name in wanted:
        assert name in rules, f"no prometheus-adapter rule in the chart exposes {name}"
        assert rules[name] in samples, f"{rules[name]} (for the HPA's {name}) is not in /metrics"
    assert 'streamer_sessions{transport="stream"} 0.0' in text


def test_ingress_keeps_websockets_open_and_routes_resumes_back(rendered):
    for variant in ("default", "full"):
        objects = rendered[variant]
        notes = one(objects, "Ingress")["metadata"]["annotations"]
        settings = load_settings(plain_env(objects))
        for key in ("proxy-read-timeout", "proxy-send-timeout"):
            timeout = int(notes[f"nginx.ingress.kubernetes.io/{key}"])
            assert timeout >= 10 * settings.server.idle_timeout_s and timeout > settings.server.manual_idle_timeout_s
        body = notes["nginx.ingress.kubernetes.io/proxy-body-size"]
        assert body.endswith("m") and int(body[:-1]) > settings.server.max_upload_mb
    cookie = one(rendered["default"], "Ingress")["metadata"]["annotations"]
    assert cookie["nginx.ingress.kubernetes.io/affinity"] == "cookie"
    assert cookie["nginx.ingress.kubernetes.io/affinity-mode"] == "persistent"
    assert cookie["nginx.ingress.kubernetes.io/session-cookie-name"] == "streamer-affinity"
    assert one(rendered["minimal"], "Service")["spec"]["sessionAffinity"] == "ClientIP"  # no Ingress: L4 affinity
    header = one(rendered["full"], "Ingress")["metadata"]["annotations"]
    assert header["nginx.ingress.kubernetes.io/upstream-hash-by"] == "$http_x_streamer_affinity"
    assert "nginx.ingress.kubernetes.io/affinity" not in header


@pytest.mark.parametrize("values, message", [
    ({"gpu": {"count": 0}}, "/gpu/count"),  # values.schema.json
    ({"gpus": 8}, "'gpus' not allowed"),  # a misspelt key is an error, not a silent default
    ({"server": {"workers": "4"}}, "/server/workers"),
    ({"ingress": {"affinity": {"mode": "ip"}}}, "/ingress/affinity/mode"),
    ({"probes": {"liveness": {"periodSeconds": 5, "failureThreshold": 3}}}, "probes.liveness"),  # the template's check
])
def test_unsafe_values_refuse_to_render(helm, values, message):
    with pytest.raises(Exception, match=re.escape(message)):
        render(helm, values)

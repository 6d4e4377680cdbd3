"""Kubernetes manifests: schema-valid (kubernetes-validate --strict, offline), consistent by
construction (ports, selectors, topology, GPUs, probes, policies, non-root), and the committed
kustomize tree and docs are what `spd k8s render` produces."""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from kubernetes_validate import utils as kv

from spd.cli import main as spd_main
from spd.commands import http as http_command
from spd.commands import workers
from spd.k8s import manifests
from spd.k8s import render as r
from spd.k8s.render import GPU, RenderConfig, render
from spd.runtime.topology import Topology

ROOT = Path(__file__).resolve().parents[1]
K8S = ROOT / "k8s"
VARIANTS = {name: RenderConfig(**kw) for name, kw in manifests.TREE_VARIANTS.items()}
VERSIONS = ("1.33.0", kv.latest_version())  # oldest we claim, newest kubernetes-validate ships
WORKLOADS = ("StatefulSet", "Deployment")


def by_kind(objs, kind):
    return [o for o in objs if o["kind"] == kind]


def one(objs, kind, name):
    (obj,) = [o for o in objs if o["kind"] == kind and o["metadata"]["name"] == name]
    return obj


def pod_templates(objs):
    return {o["metadata"]["name"]: o["spec"]["template"] for o in objs if o["kind"] in WORKLOADS}


def matches(selector: dict, labels: dict) -> bool:
    return all(labels.get(k) == v for k, v in selector.items())


def container_ports(template) -> dict[str, int]:
    return {p["name"]: p["containerPort"] for c in template["spec"]["containers"] for p in c.get("ports", [])}


def config_of(objs) -> dict:
    return by_kind(objs, "ConfigMap")[0]["data"]


@pytest.fixture(params=list(VARIANTS), scope="module")
def variant(request):
    cfg = VARIANTS[request.param]
    return request.param, cfg.resolved(), render(cfg)


# ----------------------------------------------------------------------------------------------- schema

@pytest.mark.parametrize("version", VERSIONS)
def test_every_rendered_manifest_validates_strictly(variant, version):
    _, _, objs = variant
    for obj in objs:
        kv.validate(obj, version, strict=True)  # raises on any unknown field, wrong type, missing field


def test_strict_validation_catches_a_misspelt_field():
    sts = json.loads(json.dumps(one(render(RenderConfig()), "StatefulSet", "spd-stage")))
    sts["spec"]["template"]["spec"]["containers"][0]["readinesProbe"] = {}
    with pytest.raises(kv.ValidationError):
        kv.validate(sts, kv.latest_version(), strict=True)


def test_the_kubernetes_validate_cli_passes_the_committed_tree_offline():
    files = sorted(str(p) for p in K8S.rglob("*.yaml") if p.name != "kustomization.yaml")
    exe = Path(sys.executable).with_name("kubernetes-validate")
    cmd = [str(exe), "--strict", "-k", kv.latest_version(), *files]
    # In a network namespace of its own (no interface up) when we may make one: proof that it is offline.
    if shutil.which("unshare") and subprocess.run(["unshare", "-n", "true"], capture_output=True).returncode == 0:
        cmd = ["unshare", "-n", *cmd]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stdout + out.stderr
    passed = [line for line in out.stdout.splitlines() if " passed for resource " in line]
    assert len(passed) == len(files), out.stdout + out.stderr
    assert "WARN" not in out.stdout + out.stderr and "ERROR" not in out.stdout + out.stderr


# ----------------------------------------------------------------------------------------------- invariants

def test_one_gpu_per_gpu_pod_and_none_elsewhere(variant):
    name, cfg, objs = variant
    for workload, template in pod_templates(objs).items():
        containers = template["spec"]["containers"] + template["spec"].get("initContainers", [])
        gpus = [int(c["resources"]["limits"].get(GPU, 0)) for c in containers]
        for c in containers:
            req, lim = c["resources"].get("requests", {}), c["resources"]["limits"]
            assert req.get(GPU) in (None, lim.get(GPU)), f"{workload}: GPU requests must equal limits"
        wants_gpu = not cfg.cpu and workload in (cfg.stage, cfg.drafter, cfg.spare)
        assert sum(gpus) == (1 if wants_gpu else 0), f"{name}/{workload}: {gpus}"
        tolerations = template["spec"].get("tolerations", [])
        assert any(t["key"] == GPU for t in tolerations) == wants_gpu


def test_stage_count_topology_and_headless_dns_agree(variant):
    _, cfg, objs = variant
    sts = one(objs, "StatefulSet", cfg.stage)
    data = config_of(objs)
    topo = Topology.from_json(data["SPD_TOPOLOGY"])
    assert sts["spec"]["replicas"] == cfg.n == int(data["SPD_N"]) == topo.n
    svc = one(objs, "Service", sts["spec"]["serviceName"])
    assert svc["spec"]["clusterIP"] == "None" and svc["spec"]["publishNotReadyAddresses"] is True
    assert svc["spec"]["selector"] == sts["spec"]["selector"]["matchLabels"]
    zmq = container_ports(sts["spec"]["template"])["zmq"]
    assert next(p["port"] for p in svc["spec"]["ports"] if p["name"] == "zmq") == zmq
    ns, domain = sts["metadata"]["namespace"], cfg.cluster_domain
    # pod K of the StatefulSet is stage K+1 (the ordinal rule of `spd stage` without --index)
    assert list(topo.stages) == [f"tcp://{sts['metadata']['name']}-{k}.{svc['metadata']['name']}.{ns}.svc.{domain}:{zmq}"
                                 for k in range(cfg.n)]
    for k in range(cfg.n):
        env = {"HOSTNAME": f"{sts['metadata']['name']}-{k}", "KUBERNETES_SERVICE_HOST": "10.0.0.1"}
        assert workers.stage_index(None, env) == k + 1
    # the drafter's and the orchestrator's inboxes: headless Services selecting exactly their pods
    templates = pod_templates(objs)
    for endpoint, workload in ((topo.drafter, cfg.drafter), (topo.orchestrator, cfg.orchestrator)):
        host, port = endpoint.removeprefix("tcp://").rsplit(":", 1)
        service, namespace, rest = host.split(".", 2)
        assert (namespace, rest) == (ns, f"svc.{domain}")
        s = one(objs, "Service", service)
        assert s["spec"]["clusterIP"] == "None" and s["spec"]["publishNotReadyAddresses"] is True
        assert [w for w, t in templates.items() if matches(s["spec"]["selector"], t["metadata"]["labels"])] == [workload]
        assert int(port) == container_ports(templates[workload])["zmq"]


def test_selectors_match_labels(variant):
    _, _, objs = variant
    templates = pod_templates(objs)
    for o in objs:
        if o["kind"] in WORKLOADS:
            sel = o["spec"]["selector"]["matchLabels"]
            assert matches(sel, o["spec"]["template"]["metadata"]["labels"])
            others = [w for w, t in templates.items() if w != o["metadata"]["name"] and matches(sel, t["metadata"]["labels"])]
            assert not others, f"{o['metadata']['name']}'s selector also selects {others}"
    for svc in by_kind(objs, "Service"):
        assert [w for w, t in templates.items() if matches(svc["spec"]["selector"], t["metadata"]["labels"])], \
            f"service {svc['metadata']['name']} selects no pods"
    for o in by_kind(objs, "PodDisruptionBudget") + by_kind(objs, "NetworkPolicy"):
        sel = (o["spec"]["selector"] if o["kind"] == "PodDisruptionBudget" else o["spec"]["podSelector"])["matchLabels"]
        assert [w for w, t in templates.items() if matches(sel, t["metadata"]["labels"])]
    pipeline = one(objs, "PodDisruptionBudget", "spd-pipeline")["spec"]["selector"]["matchLabels"]
    assert all(matches(pipeline, t["metadata"]["labels"]) for t in templates.values())


def test_ports_are_consistent_between_containers_services_probes_and_args(variant):
    _, cfg, objs = variant
    templates = pod_templates(objs)
    for svc in by_kind(objs, "Service"):
        for t in (t for t in templates.values() if matches(svc["spec"]["selector"], t["metadata"]["labels"])):
            ports = container_ports(t)
            for p in svc["spec"]["ports"]:
                assert p["targetPort"] in ports, f"{svc['metadata']['name']}: no container port {p['targetPort']}"
                assert ports[p["targetPort"]] == p["port"]
    for t in templates.values():
        ports = container_ports(t)
        for c in t["spec"]["containers"]:
            for kind in ("startupProbe", "readinessProbe", "livenessProbe"):
                probe = c.get(kind)
                if probe is None:
                    assert c["name"] == "http" and kind == "startupProbe"  # the gateway starts in a second
                elif "httpGet" in probe:
                    assert probe["httpGet"]["port"] in ports and probe["httpGet"]["path"] in ("/health", "/live")
                elif "grpc" in probe:
                    assert probe["grpc"]["port"] in ports.values()
                    assert probe["grpc"]["port"] in (ports.get("health"), ports.get("grpc"))
                else:
                    assert probe["tcpSocket"]["port"] in ports
            args = c["args"]
            flag = {a: args[i + 1] for i, a in enumerate(args[:-1]) if a.startswith("--")}
            if c["name"] in ("stage", "drafter", "spare"):
                assert int(flag["--health-port"]) == ports["health"] and flag["--health-host"] == "0.0.0.0"
                assert all(c[k]["grpc"]["port"] == ports["health"] for k in ("startupProbe", "readinessProbe", "livenessProbe"))
            elif c["name"] == "http":  # the gateway forwards to the orchestrator in its own pod
                assert int(flag["--port"]) == ports["http"] == r.HTTP_PORT
                assert flag["--grpc"] == f"127.0.0.1:{ports['grpc']}" and flag["--host"] == "0.0.0.0"
                continue
            else:
                assert int(flag["--port"]) == ports["grpc"] and int(flag["--metrics-port"]) == ports["metrics"]
                assert c["readinessProbe"]["grpc"]["port"] == ports["grpc"]  # SERVING = every worker registered
                ann = t["metadata"]["annotations"]
                assert ann["prometheus.io/scrape"] == "true" and int(ann["prometheus.io/port"]) == ports["metrics"]
            # every worker's own inbox port is its topology port (a spare's is the one it advertises)
            assert ports["zmq"] == r.ZMQ_PORT
            if c["name"] == "spare":
                assert flag["--endpoint"] == f"tcp://$(POD_IP):{ports['zmq']}"


def test_network_policy_keeps_zmq_among_pipeline_pods_and_opens_the_api(variant):
    _, cfg, objs = variant
    templates = pod_templates(objs)
    policies = by_kind(objs, "NetworkPolicy")
    pipeline_sel = one(objs, "PodDisruptionBudget", "spd-pipeline")["spec"]["selector"]["matchLabels"]

    def allowed(template, port: int) -> list[list | None]:
        """The `from` lists of the ingress rules admitting port on this pod (None: from anywhere)."""
        out = []
        for pol in policies:
            if not matches(pol["spec"]["podSelector"]["matchLabels"], template["metadata"]["labels"]):
                continue
            assert "Ingress" in pol["spec"]["policyTypes"]
            for rule in pol["spec"].get("ingress", []):
                if any(p["port"] == port for p in rule.get("ports", [])) or not rule.get("ports"):
                    out.append(rule.get("from"))
        return out

    for workload, t in templates.items():
        assert any(matches(p["spec"]["podSelector"]["matchLabels"], t["metadata"]["labels"]) for p in policies)
        ports = container_ports(t)
        for name in ("zmq", "health"):
            if name in ports:
                rules = allowed(t, ports[name])
                assert rules, f"{workload}: {name} unreachable"
                for frm in rules:  # never from anywhere; only from pods selected by the pipeline selector
                    assert frm and all(set(f) == {"podSelector"} and f["podSelector"]["matchLabels"] == pipeline_sel for f in frm)
        if "grpc" in ports:
            assert None in allowed(t, ports["grpc"]), "the gRPC API must be open to clients"
            assert None in allowed(t, ports["metrics"])
            assert None in allowed(t, ports["http"]), "the OpenAI-compatible API must be open to clients"
    pipe = one(objs, "NetworkPolicy", "spd-pipeline")
    assert set(pipe["spec"]["policyTypes"]) == {"Ingress", "Egress"}
    egress_ports = {p["port"] for rule in pipe["spec"]["egress"] for p in rule["ports"]}
    assert egress_ports == {r.ZMQ_PORT, r.HEALTH_PORT, 53}


def test_non_root_read_only_no_capabilities_everywhere(variant):
    _, _, objs = variant
    for workload, t in pod_templates(objs).items():
        spec = t["spec"]
        assert spec["securityContext"]["runAsNonRoot"] is True and spec["securityContext"]["runAsUser"] != 0
        assert spec["automountServiceAccountToken"] is False
        for c in spec["containers"] + spec.get("initContainers", []):
            sc = c["securityContext"]
            assert sc["runAsNonRoot"] is True and sc["runAsUser"] != 0, workload
            assert sc["allowPrivilegeEscalation"] is False and sc["readOnlyRootFilesystem"] is True
            assert sc["capabilities"] == {"drop": ["ALL"]} and sc["seccompProfile"]["type"] == "RuntimeDefault"
            res = c["resources"]
            assert {"cpu", "memory"} <= set(res["requests"]) and "memory" in res["limits"]
        mounts = {m["mountPath"]: m for c in spec["containers"] for m in c["volumeMounts"]}
        assert "/tmp" in mounts  # the only writable place (HOME, caches)
    ns = by_kind(objs, "Namespace")[0]
    assert ns["metadata"]["labels"]["pod-security.kubernetes.io/enforce"] == "restricted"


def test_weights_come_from_a_read_only_volume_never_a_download(variant):
    name, cfg, objs = variant
    data = config_of(objs)
    assert data["HF_HUB_OFFLINE"] == "1" and data["TRANSFORMERS_OFFLINE"] == "1"
    assert data["SPD_MODEL_DIR"].startswith("/models/")
    for t in pod_templates(objs).values():
        vols = {v["name"]: v for v in t["spec"]["volumes"]}
        for c in t["spec"]["containers"]:
            (m,) = [m for m in c["volumeMounts"] if m["name"] == "weights"]
            assert m["mountPath"] == "/models" and m["readOnly"] is True
        if cfg.weights == "pvc":
            assert vols["weights"]["persistentVolumeClaim"] == {"claimName": cfg.weights_claim, "readOnly": True}
        else:
            (init,) = t["spec"]["initContainers"]
            assert "emptyDir" in vols["weights"] and init["image"] == cfg.weights_image
            assert init["command"][:1] == ["cp"] and init["volumeMounts"][0]["name"] == "weights"
    assert (cfg.weights == "image") == cfg.cpu  # the committed variants: GPU from the PVC, cpu from an image


def _parser():
    parser = argparse.ArgumentParser(prog="spd")
    sub = parser.add_subparsers(dest="command", required=True)
    workers.add_parser(sub)
    http_command.add_parser(sub)
    return parser


def test_container_args_parse_with_the_real_cli_after_env_expansion(variant):
    _, cfg, objs = variant
    data = config_of(objs)
    for t in pod_templates(objs).values():
        for c in t["spec"]["containers"]:
            assert c["envFrom"][0] == {"configMapRef": {"name": cfg.config_map}}
            assert c["envFrom"][1:] == ([{"secretRef": {"name": cfg.auth_secret, "optional": True}}]
                                        if c["name"] == "orchestrator" else [])
            env = {**data, **{e["name"]: "10.0.0.7" for e in c.get("env", [])}}  # fieldRef values (POD_IP)
            refs = {m for a in c["args"] for m in re.findall(r"\$\(([A-Z_]+)\)", a)}
            assert refs <= set(env), f"{c['name']}: undefined {refs - set(env)}"
            args = [re.sub(r"\$\(([A-Z_]+)\)", lambda m: env[m.group(1)], a) for a in c["args"]]
            ns = _parser().parse_args(args)
            assert ns.command == c["name"]
            if c["name"] == "http":
                assert ns.model == cfg.model_dir  # /v1/models names the served model
                continue
            assert ns.max_concurrency == cfg.max_concurrency  # one value for the stages' shape and the slots
            if c["name"] == "stage":
                assert ns.index is None and ns.of == cfg.n  # the index comes from the pod's hostname
            if c["name"] == "spare":
                assert ns.endpoint == f"tcp://10.0.0.7:{r.ZMQ_PORT}" and ns.topology is None
            if c["name"] in ("stage", "drafter", "spare"):
                assert ns.device == ("cpu" if cfg.cpu else "cuda:0") and ns.dtype == cfg.dtype
                assert ns.model == cfg.model_dir and ns.draft == cfg.draft_dir
            else:
                assert ns.host == "0.0.0.0" and ns.schedule == cfg.schedule and ns.topology is None
                assert ns.worker_wait_s == cfg.worker_wait_s and ns.tls_cert is None  # kubelet gRPC probes speak no TLS


def test_stage_index_sources():
    k8s = {"KUBERNETES_SERVICE_HOST": "10.0.0.1"}
    assert workers.stage_index(3, {"SPD_STAGE_INDEX": "5", "HOSTNAME": "spd-stage-0", **k8s}) == 3
    assert workers.stage_index(None, {"SPD_STAGE_INDEX": "5", "HOSTNAME": "spd-stage-0", **k8s}) == 5
    assert workers.stage_index(None, {"HOSTNAME": "spd-stage-3", **k8s}) == 4
    assert workers.stage_index(None, {"HOSTNAME": "big-pipe-stage-11", **k8s}) == 12
    with pytest.raises(SystemExit):  # outside Kubernetes a hostname never picks the index
        workers.stage_index(None, {"HOSTNAME": "node-3"})
    with pytest.raises(SystemExit):
        workers.stage_index(None, {"HOSTNAME": "spd-stage", **k8s})


# ----------------------------------------------------------------------------------------------- committed files

def _stdout(argv: list[str]) -> str:
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        assert spd_main(argv) == 0
    return buf.getvalue()


def test_the_committed_kustomize_tree_is_current():
    stale = manifests.stale_tree_files(K8S, manifests.tree_files())
    assert not stale, f"regenerate with `spd k8s render --tree k8s`: {stale}"


def test_render_is_deterministic():
    assert manifests.to_yaml(render(RenderConfig(n=8))) == manifests.to_yaml(render(RenderConfig(n=8)))
    assert manifests.tree_files() == manifests.tree_files()


@pytest.mark.parametrize("name", list(VARIANTS))
def test_spd_k8s_render_prints_exactly_the_committed_overlay(name):
    v = VARIANTS[name]
    argv = ["k8s", "render", "--n", str(v.n), "--spares", str(v.spares)] + (["--cpu"] if v.cpu else [])
    text = _stdout(argv)
    docs = [d for d in yaml.safe_load_all(text) if d]
    assert docs == manifests.load_kustomize_dir(K8S / "overlays" / name)
    # byte for byte: the stream is the committed files' documents, in kustomization order
    assert text == "".join("---\n" + manifests.dump(d) for d in docs)
    files = []
    for d in (K8S / "base", K8S / "overlays" / name):
        files += [d / f for f in yaml.safe_load((d / "kustomization.yaml").read_text())["resources"] if not f.startswith("..")]
    assert text == "".join("---\n" + f.read_text().removeprefix(manifests.GENERATED) for f in files)


def test_render_out_writes_a_kustomization_of_the_same_objects(tmp_path):
    _stdout(["k8s", "render", "--n", "3", "--namespace", "inference", "--image", "reg.example/spd:1", "--out", str(tmp_path)])
    objs = manifests.load_kustomize_dir(tmp_path)
    assert objs == render(RenderConfig(n=3, namespace="inference", image="reg.example/spd:1"))
    assert Topology.from_json(config_of(objs)["SPD_TOPOLOGY"]).stages[2] == \
        "tcp://spd-stage-2.spd-stage.inference.svc.cluster.local:5555"


@pytest.mark.skipif(shutil.which("kubectl") is None, reason="kubectl (with kustomize) not installed")
@pytest.mark.parametrize("name", list(VARIANTS))
def test_kubectl_kustomize_builds_each_overlay_into_the_render(name):
    out = subprocess.run(["kubectl", "kustomize", str(K8S / "overlays" / name)], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    built = {(d["kind"], d["metadata"]["name"]): d for d in yaml.safe_load_all(out.stdout) if d}
    assert built == {(d["kind"], d["metadata"]["name"]): d for d in render(VARIANTS[name])}


def test_the_docs_show_what_render_n8_prints():
    """k8s/README.md quotes objects of `spd k8s render --n 8`; each quote must be current."""
    text = (K8S / "README.md").read_text()
    quotes = re.findall(r"<!-- render --n 8: (\w+)/([\w-]+) -->\n```yaml\n(.*?)```", text, re.S)
    assert {(kind, name) for kind, name, _ in quotes} == {("ConfigMap", "spd-config"), ("StatefulSet", "spd-stage")}
    objs = render(RenderConfig(n=8))
    for kind, name, body in quotes:
        assert body == manifests.dump(one(objs, kind, name)), f"k8s/README.md: {kind}/{name} is stale (spd k8s render --tree k8s)"
    assert manifests.refresh_readme(text) == text


def test_the_dockerfile_matches_what_the_manifests_expect():
    """It cannot be built here (no container engine): check the facts the manifests rely on."""
    text = (ROOT / "Dockerfile").read_text()
    stages = re.findall(r"^FROM (\S+)(?: AS (\S+))?$", text, re.M)
    assert stages[0] == ("${PYTHON_IMAGE}", "runtime") and "ARG PYTHON_IMAGE=python:3.11-slim" in text
    assert stages[-1] == ("runtime", "")  # the default target is the runtime image
    assert re.search(r"^ARG TORCH_VARIANT=\S+$", text, re.M)
    assert 'pip install --index-url "https://download.pytorch.org/whl/${TORCH_VARIANT}" "torch==${TORCH_VERSION}"' in text
    pinned = re.search(r'"torch==([^"]+)"', (ROOT / "pyproject.toml").read_text()).group(1)
    assert f"ARG TORCH_VERSION={pinned}" in text  # else `pip install .` would fetch another torch
    runtime = text.split("FROM runtime AS weights-build")[0]
    assert f"USER {r.UID}:{r.UID}" in runtime and f"--uid {r.UID}" in runtime  # = runAsUser in the pods
    assert 'ENTRYPOINT ["spd"]' in runtime and "HOME=/tmp" in runtime  # args start with the subcommand
    for src in re.findall(r"^COPY (?!--from)(\S+) ", runtime, re.M):
        assert (ROOT / src).exists(), src
    ignore = (ROOT / ".dockerignore").read_text().split()
    assert ignore[ignore.index("*") + 1:][:5] == ["!pyproject.toml", "!README.md", "!protos", "!client", "!services"]
    for objs in (render(cfg) for cfg in VARIANTS.values()):
        for t in pod_templates(objs).values():
            assert t["spec"]["securityContext"]["runAsUser"] == r.UID
            assert all("command" not in c for c in t["spec"]["containers"])  # keep the image's ENTRYPOINT

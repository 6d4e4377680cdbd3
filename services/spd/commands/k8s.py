"""`spd k8s render|apply|status|delete|chaos`: an SPD pipeline on Kubernetes, one pod per device."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from spd.core.schedule import SCHEDULES
from spd import settings


def _config_args(p) -> None:
    p.add_argument("--n", type=int, default=4, help="pipeline stages (stage pods)")
    p.add_argument("--cpu", action="store_true", help="dev cluster: no GPUs, CPU devices, float32")
    p.add_argument("--namespace", default="spd", help="namespace of every object")
    p.add_argument("--name", default="spd", help="prefix of every object (several pipelines per namespace)")
    p.add_argument("--image", default="spd-serve:0.1.0", help="container image of every pod")
    p.add_argument("--weights", choices=["pvc", "image"], help="weights from a read-only PVC (GPU default) or "
                   "copied by an init container from --weights-image (cpu default)")
    p.add_argument("--weights-claim", default="spd-weights", help="PVC with target/ and draft/")
    p.add_argument("--weights-image", default="spd-weights:0.1.0", help="image with /weights/target (and draft)")
    p.add_argument("--model-dir", default="/models/target", help="target HF directory inside the pods")
    p.add_argument("--draft-dir", default="", help="PDM directory inside the pods ('random': untrained); "
                   "default /models/draft on GPU, random on cpu")
    p.add_argument("--split", default="uniform", help="uniform | balanced | boundaries '0,6,...,L'")
    p.add_argument("--schedule", choices=SCHEDULES, default="pre", help="staircase schedule")
    p.add_argument("--dtype", default="", choices=["", "float32", "bfloat16", "float16"],
                   help="default bfloat16 on GPU, float32 on cpu")
    p.add_argument("--cluster-domain", default="cluster.local", help="DNS suffix of Services")
    p.add_argument("--no-namespace", action="store_true", help="do not render the Namespace object")
    p.add_argument("--max-concurrency", type=int, default=1, help="requests decoding at once (default 1)")
    p.add_argument("--spares", type=int, default=0, help="warm spare pods that take over a dead stage or drafter "
                   "(default 0)")


def _cluster_args(p) -> None:
    p.add_argument("--kubeconfig", help="default $KUBECONFIG or ~/.kube/config (in a pod: its service account)")
    p.add_argument("--context", help="kubeconfig context (default: the current one)")


def add_parser(sub) -> None:
    k8s = sub.add_parser("k8s", help="deploy an SPD pipeline on Kubernetes (render, apply, status, delete, chaos)")
    ks = k8s.add_subparsers(dest="k8s_command", required=True)
    r = ks.add_parser("render", help="print the manifests (multi-document YAML), or write them to --out")
    _config_args(r)
    r.add_argument("--out", type=Path, help="write one file per object and a kustomization.yaml into DIR")
    r.add_argument("--tree", type=Path, help="(re)generate the kustomize base and overlays n4, n8, cpu into DIR")
    r.add_argument("--check", action="store_true", help="with --tree: only report stale files (exit 1 if any)")
    r.set_defaults(run=run_render)
    a = ks.add_parser("apply", help="server-side apply the rendered manifests")
    _config_args(a)
    _cluster_args(a)
    a.add_argument("--dry-run", action="store_true", help="server-side dry run (validated, not persisted)")
    a.set_defaults(run=run_apply)
    s = ks.add_parser("status", help="pods per role with readiness")
    _config_args(s)
    _cluster_args(s)
    s.add_argument("--json", action="store_true", help="print JSON instead of a table")
    s.set_defaults(run=run_status)
    d = ks.add_parser("delete", help="delete the rendered objects (the namespace is kept)")
    _config_args(d)
    _cluster_args(d)
    d.add_argument("--delete-namespace", action="store_true", help="also delete the namespace (and its PVCs!)")
    d.set_defaults(run=run_delete)
    c = ks.add_parser("chaos", help="delete a random stage pod while a generation streams; did it complete?")
    _config_args(c)
    _cluster_args(c)
    c.add_argument("--address", default=settings.GRPC_ADDRESS, help="the orchestrator's gRPC address (e.g. after "
                   "`kubectl -n spd port-forward svc/spd-orchestrator 50051`)")
    c.add_argument("--prompt", default="Tell me a long story about a lighthouse keeper.", help="prompt of the chaos stream")
    c.add_argument("--max-tokens", type=int, default=256, help="tokens of the chaos stream")
    c.add_argument("--after-tokens", type=int, default=16, help="delete the pod once this many tokens streamed")
    c.add_argument("--seed", type=int, help="which stage pod (random.Random(seed))")
    c.add_argument("--grace", type=int, default=0, help="grace period of the delete, seconds (0: kill)")
    c.add_argument("--no-baseline", action="store_true", help="skip the fault-free run the tokens are compared with")
    c.add_argument("--wait-ready", type=float, default=0.0, help="then wait up to S seconds for the new pod to be Ready")
    c.add_argument("--timeout", type=float, default=900.0, help="deadline of each gRPC call, seconds")
    c.add_argument("--token", default=settings.token(), help="the API's bearer token ($SPD_TOKEN)")
    c.set_defaults(run=run_chaos)


def render_config(args):
    from spd.k8s.render import RenderConfig

    return RenderConfig(n=args.n, cpu=args.cpu, namespace=args.namespace, name=args.name, image=args.image,
                        weights=args.weights or "", weights_claim=args.weights_claim,
                        weights_image=args.weights_image, model_dir=args.model_dir, draft_dir=args.draft_dir,
                        split=args.split, schedule=args.schedule, dtype=args.dtype,
                        cluster_domain=args.cluster_domain, create_namespace=not args.no_namespace, spares=args.spares,
                        max_concurrency=args.max_concurrency)


def _objects(args) -> list[dict]:
    from spd.k8s.render import render

    try:
        return render(render_config(args))
    except ValueError as e:
        raise SystemExit(f"spd k8s: {e}") from None


def run_render(args) -> int:
    from spd.k8s import manifests

    if args.tree:
        files = manifests.tree_files(namespace=args.namespace, name=args.name, image=args.image)
        readme = args.tree / "README.md"
        if readme.is_file():  # its quotes of `spd k8s render --n N` objects
            files["README.md"] = manifests.refresh_readme(readme.read_text())
        if args.check:
            stale = manifests.stale_tree_files(args.tree, files)
            for rel in stale:
                print(f"stale: {args.tree / rel}", file=sys.stderr)
            return 1 if stale else 0
        for path in manifests.write_files(args.tree, files):
            print(path)
        return 0
    objs = _objects(args)
    if args.out:
        for path in manifests.write_files(args.out, manifests.out_files(objs)):
            print(path)
        return 0
    sys.stdout.write(manifests.to_yaml(objs))
    return 0


def _api(args):
    from spd.k8s.deploy import api_client

    return api_client(args.kubeconfig, args.context)


def run_apply(args) -> int:
    from spd.k8s.deploy import apply

    apply(_api(args), _objects(args), dry_run=args.dry_run)
    return 0


def run_status(args) -> int:
    from spd.k8s.deploy import status

    st = status(_api(args), render_config(args).resolved())
    print(json.dumps(st.as_dict(), indent=1) if args.json else st.table())
    return 0 if st.pipeline_ready else 1


def run_delete(args) -> int:
    from spd.k8s.deploy import delete

    delete(_api(args), _objects(args), keep_namespace=not args.delete_namespace)
    return 0


def run_chaos(args) -> int:
    from dataclasses import asdict

    from spd.k8s.deploy import chaos

    report = chaos(_api(args), render_config(args).resolved(), args.address, args.prompt, args.max_tokens,
                   args.after_tokens, args.seed, args.grace, not args.no_baseline, args.wait_ready, args.timeout,
                   token=args.token)
    print(json.dumps({**asdict(report), "ok": report.ok}, indent=1))
    if not report.deleted:
        print("spd k8s chaos: the stream ended before the pod was deleted; lower --after-tokens or raise "
              "--max-tokens", file=sys.stderr)
    return 0 if report.ok else 1

"""``specbuild deploy`` and ``monitoring``: a compiled release deployed to Kubernetes, or watched by a Prometheus
outside it."""

from __future__ import annotations

from typing import Any, Callable

import click

from specbuild.cli.common import console, json_option, main, print_json, reports_errors
from specbuild.cli.serving import launch_overrides
from specbuild.monitoring.alert_rules import DEFAULT_MIN_ACCEPTANCE
from specbuild.runtimes.pod_plans import CPU_IMAGE, REPLICA_CEILING, DeployOptions

DEPLOY = DeployOptions()  # `specbuild deploy`'s defaults


def _label(ctx: click.Context, param: click.Parameter, values: tuple[str, ...]) -> dict[str, str]:
    """``("release=prometheus",)`` -> ``{"release": "prometheus"}``."""
    labels = {}
    for value in values:
        key, sep, label = value.partition("=")
        if not sep or not key:
            raise click.BadParameter(f"{value!r} is not KEY=VALUE, e.g. release=prometheus")
        labels[key] = label
    return labels


def alert_options(command: Callable[..., Any]) -> Callable[..., Any]:
    """The alerts' thresholds (specbuild.monitoring.alert_rules), for ``deploy`` and ``monitoring``."""
    command = click.option("--ttft-p95", "ttft_p95_seconds", type=click.FloatRange(min=0, min_open=True),
                           default=None, metavar="SECONDS",
                           help="alert when the p95 time to first token stays above this  [default: the release's "
                           "runtime's]")(command)
    return click.option("--min-acceptance", type=click.FloatRange(0, 1, min_open=True, max_open=True), default=None,
                        help="alert when the acceptance rate stays below this (the release's break-even)  "
                        f"[default: {DEFAULT_MIN_ACCEPTANCE:g}]")(command)


@main.command()
@click.argument("repository", type=click.Path(file_okay=False), default="triton_repo")
@click.option("-o", "--out", "--k8s", "out_dir", required=True, metavar="DIR|-",
              help="folder to write the manifests into (one <kind>.yaml per object, and the prometheus-adapter "
                   "rule), or - for a YAML stream on stdout (kubectl apply -f -)")
@click.option("--replicas", type=click.IntRange(min=1), default=DEPLOY.replicas, show_default=True)
@click.option("--max-replicas", type=click.IntRange(min=1), default=None,
              help=f"HPA ceiling  [default: {REPLICA_CEILING} x replicas]")
@click.option("--namespace", default=DEPLOY.namespace, show_default=True)
@click.option("--pvc", default=None, help="PersistentVolumeClaim holding the release's engines and repository folders")
@click.option("--release-image", default=None, help="image with /release/<engines> and /release/<repository> "
              "(docker/Dockerfile.release), copied by an init container")
@click.option("--capture-storage-class", default=None, metavar="NAME",
              help="a release packaged with capture.enabled: the storage class of each pod's capture claim "
              "(capture.claim_size, read-write, kept when pods go)  [default: the cluster's default class]")
@click.option("--image", default=None, help="the serving image  [default: the release's triton.image; for a torch "
              f"release {CPU_IMAGE}, built from docker/Dockerfile.cpu]")
@click.option("--cpu", type=click.FloatRange(min=0, min_open=True), default=None,
              help="CPU cores per replica  [default: from the release]")
@click.option("--memory-gib", type=click.FloatRange(min=0, min_open=True), default=None,
              help="host memory per replica  [default: /dev/shm + engines + server, from the release]")
@click.option("--monitor-label", "monitor_labels", multiple=True, callback=_label, metavar="KEY=VALUE",
              help="label of the PodMonitor and PrometheusRule, for your Prometheus's podMonitorSelector and "
              "ruleSelector (repeatable)")
@click.option("--dashboard-label", "dashboard_labels", multiple=True, callback=_label, metavar="KEY=VALUE",
              help="label of the dashboard's ConfigMap, for Grafana's dashboard sidecar (repeatable)  "
              f"[default: {','.join(f'{key}={value}' for key, value in DEPLOY.dashboard_labels.items())}]")
@alert_options
@click.option("--openai-image", default=DEPLOY.openai_image, show_default=True,
              help="a GPU release: the image of the OpenAI-compatible API's container beside Triton "
              "(docker/Dockerfile.cpu)")
@click.option("--kserve", is_flag=True, help="write a KServe ServingRuntime + InferenceService instead")
@click.option("--set", "assignments", multiple=True, metavar="KEY=VALUE",
              help="launch settings (triton.image, triton.host, ports); the rest is the release's")
@click.option("--json", "json_mode", is_flag=True, help="the files written as JSON; with -o -, the objects as one "
              "JSON document (a v1 List, which kubectl applies too)")
@reports_errors
def deploy(repository: str, out_dir: str, replicas: int, max_replicas: int | None, namespace: str, pvc: str | None,
           release_image: str | None, capture_storage_class: str | None, image: str | None, cpu: float | None,
           memory_gib: float | None,
           monitor_labels: dict[str, str], dashboard_labels: dict[str, str], min_acceptance: float | None,
           ttft_p95_seconds: float | None, openai_image: str, kserve: bool, assignments: tuple[str, ...],
           json_mode: bool) -> None:
    """Write Kubernetes manifests serving the compiled release in REPOSITORY (default: triton_repo): a GPU release
    as compiled (its launch layout, on the GPU its engines were built on), a torch release on CPUs.

    Each replica gets CPU and memory requests and limits, a PodDisruptionBudget, a Prometheus Operator PodMonitor
    and a HorizontalPodAutoscaler on the requests in flight (prometheus-adapter rule written beside them); the
    release gets a PrometheusRule (recording rules and alerts) and the Grafana dashboard in a ConfigMap. A release
    that captures traffic (capture.enabled) is a StatefulSet: each pod writes its capture to a claim of its own.
    """
    from specbuild.package.manifest import read_release
    from specbuild.serve.k8s import release_manifests, to_yaml, write_manifests

    options = DeployOptions(namespace=namespace, replicas=replicas, max_replicas=max_replicas, pvc=pvc,
                            release_image=release_image, capture_storage_class=capture_storage_class, image=image,
                            cpu=cpu, memory_gib=memory_gib,
                            monitor_labels=monitor_labels, min_acceptance=min_acceptance,
                            ttft_p95_seconds=ttft_p95_seconds, openai_image=openai_image,
                            **({"dashboard_labels": dashboard_labels} if dashboard_labels else {}))
    objects = release_manifests(read_release(repository), launch_overrides(assignments), options, kserve=kserve)
    if out_dir == "-":
        if json_mode:
            print_json({"apiVersion": "v1", "kind": "List", "items": objects})
        else:
            click.echo(to_yaml(objects), nl=False)
        console.print("the prometheus-adapter rule the autoscaler needs is written with -o DIR", highlight=False)
        return
    paths = write_manifests(out_dir, objects)
    for path in paths:
        console.print(f"wrote {path}", highlight=False)
    if json_mode:
        print_json({"files": [str(path.resolve()) for path in paths], "kinds": [item["kind"] for item in objects]})


@main.command()
@click.argument("repository", type=click.Path(file_okay=False), default="triton_repo")
@click.option("-o", "--out", "out_dir", required=True, type=click.Path(file_okay=False), metavar="DIR",
              help="folder to write prometheus.yml, the rule file and the dashboard into (docker/compose.yaml's "
              "prometheus profile reads ../monitoring)")
@alert_options
@click.option("--set", "assignments", multiple=True, metavar="KEY=VALUE",
              help="launch settings (ports: triton.metrics_port is scraped); the rest is the release's")
@json_option
@reports_errors
def monitoring(repository: str, out_dir: str, min_acceptance: float | None, ttft_p95_seconds: float | None,
               assignments: tuple[str, ...], json_mode: bool) -> None:
    """Write a Prometheus for the release in REPOSITORY served outside Kubernetes (docker/compose.yaml, profile
    prometheus): its scrape configuration, its recording and alerting rules, and the Grafana dashboard to import."""
    from specbuild.monitoring.prometheus_config import write_monitoring
    from specbuild.monitoring.alert_rules import release_thresholds
    from specbuild.package.manifest import read_release
    from specbuild.serve.release_launch import release_launch_spec

    spec = release_launch_spec(read_release(repository).spec, launch_overrides(assignments))
    thresholds = release_thresholds(spec, min_acceptance=min_acceptance, ttft_p95_seconds=ttft_p95_seconds)
    paths = write_monitoring(out_dir, thresholds, spec.triton.metrics_port)
    if json_mode:
        print_json({"files": [str(path.resolve()) for path in paths]})
        return
    for path in paths:
        console.print(f"wrote {path}", highlight=False)

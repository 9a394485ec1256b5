"""The Grafana dashboard of a served release: a small typed builder and the dashboard it builds, generated at
development time into ``dashboard.json`` beside this file (shipped with the package; ``specbuild deploy`` puts it
into a ConfigMap for Grafana's dashboard sidecar, ``specbuild monitoring`` writes a copy to import).

Regenerate after changing a panel (a test checks the file is what this module builds)::

    python -m specbuild.monitoring.dashboard

Queries read the release chosen in the ``job`` variable through :mod:`specbuild.monitoring.promql`, rates over
Grafana's ``$__rate_interval``. The last row shows the TensorRT-LLM backend's own metrics and Triton's GPU metrics,
which only GPU releases export (:data:`GPU_ONLY_METRICS`).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator, Literal

from specbuild.monitoring.promql import BY_SOURCE, METRIC, Scope, Signals
from specbuild.speculation.stats import E2E, IN_FLIGHT, QUEUE, TPOT, TTFT, Metric

DASHBOARD_FILE = Path(__file__).with_name("dashboard.json")
JOB = "job"  # the variable holding the release's scrape job
RATE_INTERVAL = "$__rate_interval"
DATASOURCE = {"type": "prometheus", "uid": "${datasource}"}
GRID_WIDTH = 24
PANEL_HEIGHT = 8
Unit = Literal["short", "percentunit", "s", "reqps"]

TRITON_FAILURES = "nv_inference_request_failure"  # Triton's own, per model (every release)
# The TensorRT-LLM backend's gauges (NVIDIA/TensorRT-LLM triton_backend/inflight_batcher_llm/src/
# custom_metrics_reporter/custom_metrics_reporter.cc: families and their sub-labels) and Triton's GPU metrics:
# exported by a tensorrt-llm release's engine models (model="target", "draft"), not by a CPU or LLM-API release.
TRT_LLM_REQUESTS = "nv_trt_llm_request_metrics"  # request_type: active, max, scheduled, context, waiting
TRT_LLM_KV_CACHE = "nv_trt_llm_kv_cache_block_metrics"  # kv_cache_block_type: max, free, used, tokens_per, fraction
TRT_LLM_GENERAL = "nv_trt_llm_general_metrics"  # general_type: timestamp, iteration_counter
GPU_UTILIZATION = "nv_gpu_utilization"
GPU_MEMORY_USED = "nv_gpu_memory_used_bytes"
GPU_MEMORY_TOTAL = "nv_gpu_memory_total_bytes"
GPU_ONLY_METRICS = frozenset({TRT_LLM_REQUESTS, TRT_LLM_KV_CACHE, TRT_LLM_GENERAL, GPU_UTILIZATION, GPU_MEMORY_USED,
                              GPU_MEMORY_TOTAL})


@dataclass(frozen=True)
class Query:
    expr: str
    legend: str


@dataclass(frozen=True)
class Panel:
    """A time series panel."""

    title: str
    description: str
    queries: tuple[Query, ...]
    unit: Unit = "short"
    share: bool = False  # a value between 0 and 1: the axis spans exactly that
    stacked: bool = False
    width: int = 8


@dataclass(frozen=True)
class Row:
    title: str
    panels: tuple[Panel, ...]


@dataclass(frozen=True)
class Dashboard:
    uid: str
    title: str
    description: str
    rows: tuple[Row, ...]

    def queries(self) -> Iterator[tuple[Row, Panel, Query]]:
        for row in self.rows:
            for panel in row.panels:
                for query in panel.queries:
                    yield row, panel, query

    def model(self) -> dict[str, Any]:
        """Grafana's dashboard JSON model (schema version 39: Grafana 10.4 and later)."""
        panels: list[dict[str, Any]] = []
        y = 0
        for row in self.rows:
            panels.append({"id": len(panels) + 1, "type": "row", "title": row.title, "collapsed": False,
                           "gridPos": {"h": 1, "w": GRID_WIDTH, "x": 0, "y": y}, "panels": []})
            y, x = y + 1, 0
            for panel in row.panels:
                if x + panel.width > GRID_WIDTH:
                    y, x = y + PANEL_HEIGHT, 0
                panels.append(_panel(panel, len(panels) + 1, {"h": PANEL_HEIGHT, "w": panel.width, "x": x, "y": y}))
                x += panel.width
            y += PANEL_HEIGHT
        return {
            "uid": self.uid, "title": self.title, "description": self.description, "tags": ["specbuild"],
            "editable": True, "graphTooltip": 1, "schemaVersion": 39, "version": 1, "refresh": "30s",
            "time": {"from": "now-1h", "to": "now"}, "timezone": "", "links": [], "annotations": {"list": []},
            "templating": {"list": [
                {"name": "datasource", "label": "Prometheus", "type": "datasource", "query": "prometheus",
                 "current": {}, "hide": 0, "refresh": 1, "regex": "", "options": []},
                {"name": JOB, "label": "Release (scrape job)", "type": "query", "datasource": DATASOURCE,
                 "query": {"query": f"label_values({IN_FLIGHT.name}, job)", "refId": "job"},
                 "definition": f"label_values({IN_FLIGHT.name}, job)", "current": {}, "hide": 0, "refresh": 2,
                 "sort": 1, "multi": False, "includeAll": False, "regex": "", "options": []},
            ]},
            "panels": panels,
        }


def _panel(panel: Panel, panel_id: int, position: dict[str, int]) -> dict[str, Any]:
    defaults: dict[str, Any] = {"unit": panel.unit, "min": 0, "custom": {
        "drawStyle": "line", "lineWidth": 1, "fillOpacity": 20 if panel.stacked else 0, "showPoints": "never",
        "spanNulls": False, "stacking": {"mode": "normal" if panel.stacked else "none", "group": "A"}}}
    if panel.share:
        defaults["max"] = 1
    return {
        "id": panel_id, "type": "timeseries", "title": panel.title, "description": panel.description,
        "datasource": DATASOURCE, "gridPos": position,
        "fieldConfig": {"defaults": defaults, "overrides": []},
        "options": {"legend": {"displayMode": "list", "placement": "bottom", "showLegend": True},
                    "tooltip": {"mode": "multi", "sort": "none"}},
        "targets": [{"datasource": DATASOURCE, "expr": query.expr, "legendFormat": query.legend,
                     "refId": chr(ord("A") + index)} for index, query in enumerate(panel.queries)],
    }


def _quantiles(signals: Signals, metric: Metric, title: str, description: str) -> Panel:
    return Panel(title, description, tuple(Query(signals.quantile(metric, q), f"p{round(q * 100)}")
                                           for q in (0.5, 0.95, 0.99)), unit="s", width=6)


def specbuild_dashboard() -> Dashboard:
    scope = Scope((f'job=~"${JOB}"',))
    s = Signals(scope, RATE_INTERVAL)
    by_source = s.tokens_by_source()
    traffic = Row("Traffic", (
        Panel("Output tokens per second", "Tokens generated, over every replica.",
              (Query(s.rate(METRIC["output_tokens"]), "tokens/s"),)),
        Panel("Requests per second", "Requests finished by the serving model (failed and cancelled ones included).",
              (Query(s.rate(METRIC["requests"]), "finished"),), unit="reqps"),
        Panel("Requests in flight", "Being served now: the autoscaler's signal (its target is set by deploy).",
              (Query(s.in_flight(), "in flight"),)),
    ))
    speculation = Row("Speculation", (
        Panel("Acceptance", "Accepted / drafted tokens: over every draft source, and each source's own.",
              (Query(s.acceptance(), "all drafts"), Query(s.acceptance_by_source(), "{{source}}")),
              unit="percentunit", share=True),
        Panel("Acceptance per draft position", "Accepted / drafted at each position of a draft (0: the first).",
              (Query(s.acceptance_per_position(), "position {{position}}"),), unit="percentunit", share=True),
        Panel("Output tokens by source", "Accepted drafts of each draft source (model, lookup), and the "
              "target's own token of each round.", tuple(Query(expr, name) for name, expr in by_source.items()),
              stacked=True),
        Panel("Speculation's share of rounds", "Rounds that verified drafts (the rest ran the target alone: "
              "K=0, load policy, penalties), those each draft source drafted, and those whose K the load policy "
              "lowered (draft_len_schedule).",
              (Query(s.share_of_rounds(METRIC["drafts"]), "drafted"),
               Query(s.share_of_rounds(BY_SOURCE["drafts"], "source"), "by {{source}}"),
               Query(s.share_of_rounds(METRIC["load_rounds"]), "K lowered by load")), unit="percentunit",
              share=True),
        Panel("Tokens per round", "Tokens per target call over every round: 1 + accepted / rounds.",
              (Query(s.tokens_per_round(), "tokens per round"),)),
        Panel("Engine time per round", "Seconds in the draft and in the target per round.",
              (Query(s.seconds_per_round(METRIC["draft_seconds"]), "draft"),
               Query(s.seconds_per_round(METRIC["target_seconds"]), "target")), unit="s"),
    ))
    latency = Row("Latency", (
        _quantiles(s, TTFT, "Time to first token", "From a request's arrival at the serving model."),
        _quantiles(s, TPOT, "Time per output token", "After the first token."),
        _quantiles(s, E2E, "End-to-end latency", "From arrival to the last response."),
        _quantiles(s, QUEUE, "Queue before the first round", "From arrival to the first round's start."),
    ))
    failures = Row("Failures", (
        Panel("Errors, time-outs and cancellations", "Requests per second that failed, reached their time limit, "
              "or whose client went away.", (Query(s.rate(METRIC["errors"]), "errors"),
                                              Query(s.rate(METRIC["timed_out"]), "timed out"),
                                              Query(s.rate(METRIC["cancelled"]), "cancelled")), unit="reqps", width=6),
        Panel("Draft fallbacks and unspeculated requests", "Requests that went on with the target alone because "
              "the draft model failed, those that outgrew the draft's window (lookup still drafting), and those that "
              "asked for drafts but ran without (sampling penalties).",
              (Query(s.rate(METRIC["fallbacks"]), "fallbacks"), Query(s.rate(METRIC["draft_window"]), "draft window"),
               Query(s.rate(METRIC["unspeculated"]), "unspeculated")),
              unit="reqps", width=6),
        Panel("Failures per model (Triton)", "Triton's failed inferences per model: the ensemble's steps and the "
              "engines the serving model calls.",
              (Query(f"sum by (model) (rate({scope.of(TRITON_FAILURES)}[{RATE_INTERVAL}]))", "{{model}}"),),
              unit="reqps", width=6),
        Panel("Replicas scraped", "1 for each replica Prometheus reaches, 0 for one it cannot.",
              (Query(s.up(), "{{instance}}"),), width=6),
    ))
    engine_requests = scope.of(TRT_LLM_REQUESTS, 'request_type!="max"')
    kv_cache_used = scope.of(TRT_LLM_KV_CACHE, 'kv_cache_block_type="fraction"')
    iterations = scope.of(TRT_LLM_GENERAL, 'general_type="iteration_counter"')
    gpu = Row("TensorRT-LLM backend and GPUs (tensorrt-llm releases)", (
        Panel("Engine requests", "The TensorRT-LLM executor's requests per engine model, by state.",
              (Query(f"sum by (model, request_type) ({engine_requests})", "{{model}} {{request_type}}"),)),
        Panel("KV cache blocks used", "Share of each engine's KV-cache blocks in use.",
              (Query(f"max by (model) ({kv_cache_used})", "{{model}}"),), unit="percentunit", share=True),
        Panel("Engine iterations per second", "The executor's iteration counter, per engine model.",
              (Query(f"sum by (model) (rate({iterations}[{RATE_INTERVAL}]))", "{{model}}"),)),
        Panel("GPU utilization", "Triton's per-GPU utilization.",
              (Query(f"avg by (gpu_uuid) ({scope.of(GPU_UTILIZATION)})", "{{gpu_uuid}}"),), unit="percentunit",
              share=True, width=12),
        Panel("GPU memory used", "Triton's per-GPU memory in use, of the total.",
              (Query(f"max by (gpu_uuid) ({scope.of(GPU_MEMORY_USED)}) / max by (gpu_uuid) "
                     f"({scope.of(GPU_MEMORY_TOTAL)})", "{{gpu_uuid}}"),), unit="percentunit", share=True,
              width=12),
    ))
    return Dashboard("specbuild", "specbuild release",
                     "A specbuild release served by Triton: traffic, speculation, latency, failures "
                     "(generated by specbuild.monitoring.dashboard).", (traffic, speculation, latency, failures, gpu))


def render(dashboard: Dashboard) -> str:
    return json.dumps(dashboard.model(), indent=2) + "\n"


if __name__ == "__main__":
    DASHBOARD_FILE.write_text(render(specbuild_dashboard()), encoding="utf-8")

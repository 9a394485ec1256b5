"""Operating a served release: the PromQL of what to watch (promql.py), recording and alerting rules (alert_rules.py), the
Grafana dashboard's builder and the JSON it generates (dashboard.py, dashboard.json), and a Prometheus
configuration for a release served outside Kubernetes (prometheus_config.py)."""

"""Monitoring content shipped with the chart: alert rules and the Grafana dashboard (one source each).

Dev only: `python -m hpd_operator.monitoring` writes the chart's files/prometheus-rules.yaml and
files/dashboards/hybrid-pd.json from rules.py and dashboard.py; the chart ships those files. This package is not in
the operator's wheel (pyproject.toml) and nothing the operator runs imports it (an import-linter contract):
dashboard.py builds with grafana-foundation-sdk, a dev dependency. A new alert is an Alert row in rules.py.
"""

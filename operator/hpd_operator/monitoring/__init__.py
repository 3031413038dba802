"""Monitoring content shipped with the chart: alert rules and the Grafana dashboard (one source each)."""

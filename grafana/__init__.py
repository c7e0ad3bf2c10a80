"""Dashboards as code and their publisher."""

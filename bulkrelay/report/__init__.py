"""The report pages, for the operator's morning: a run's report and a job's history, each one
self-contained HTML made from Jinja2 templates (`templates/`, autoescaped) with script-free SVG charts.
What a page shows is gathered here from a run's records; `ops/report.py` is the command that writes it."""

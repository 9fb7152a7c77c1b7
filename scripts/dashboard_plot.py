"""Plots a Grafana dashboard's panels from Prometheus, the way Grafana would draw them.

    python dashboard_plot.py PROMETHEUS_URL START END DASHBOARD.json OUT.png

Each panel target's `expr` goes to Prometheus's /api/v1/query_range over [START, END] (Unix
seconds), with Grafana's variables filled in: every namespace and lock, and a 10 s
`$__rate_interval` (four 1 s scrapes, as Grafana's own rule would give). Series are named by the
target's `legendFormat`. Prints each series' last and largest value. scripts/dashboard.sh runs it.
"""

import json
import re
import sys
import urllib.parse
import urllib.request

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

VARIABLES = {"$__rate_interval": "10s", "$namespace": ".+", "$lock": ".+"}
UNITS = {"s": "seconds", "ops": "per second", "short": ""}


def promql(expr):
    """The target's expression with Grafana's variables filled in."""
    for var, value in VARIABLES.items():
        expr = expr.replace(var, value)
    if "$" in expr:
        sys.exit(f"an unknown Grafana variable in {expr}")
    return expr


def query_range(prom, expr, start, end):
    """The matrix Prometheus answers for `expr` over [start, end], one point a second."""
    params = urllib.parse.urlencode({"query": expr, "start": start, "end": end, "step": "1"})
    with urllib.request.urlopen(f"{prom}/api/v1/query_range?{params}") as resp:
        body = json.load(resp)
    if body["status"] != "success":
        sys.exit(f"{expr}: {body}")
    return body["data"]["result"]


def legend(fmt, labels):
    """Grafana's legendFormat: {{label}} replaced by the series' label value."""
    return re.sub(r"\{\{\s*(\w+)\s*\}\}", lambda m: labels.get(m.group(1), ""), fmt)


def plot_panel(ax, prom, panel, start, end):
    """Draws one panel's targets on `ax`; prints each series' last and largest value."""
    for target in panel["targets"]:
        for series in query_range(prom, promql(target["expr"]), start, end):
            points = [(float(t) - start, float(v)) for t, v in series["values"]]
            points = [(t, v) for t, v in points if v == v]  # NaN: no data at that instant
            if not points:
                continue
            name = legend(target.get("legendFormat", ""), series["metric"]) or str(series["metric"])
            ax.plot([t for t, _ in points], [v for _, v in points], label=name, linewidth=1.2)
            values = [v for _, v in points]
            print(f"{panel['title']:40} {name:30} last {values[-1]:10.4g}  max {max(values):10.4g}")
    ax.set_title(panel["title"], fontsize=10)
    ax.set_ylabel(UNITS.get(panel["fieldConfig"]["defaults"].get("unit"), ""), fontsize=8)
    ax.set_ylim(bottom=0)
    ax.tick_params(labelsize=7)
    ax.grid(alpha=0.3)
    if ax.get_legend_handles_labels()[0]:
        ax.legend(fontsize=6, loc="upper left")


def main():
    prom, start, end, dashboard, out = sys.argv[1:6]
    start, end = float(start), float(end)
    panels = json.load(open(dashboard))["panels"]
    rows = (len(panels) + 1) // 2
    fig, axes = plt.subplots(rows, 2, figsize=(13, 2.6 * rows), sharex=True)
    for ax, panel in zip(axes.flat, panels):
        plot_panel(ax, prom, panel, start, end)
    for ax in axes.flat[len(panels):]:
        ax.set_visible(False)
    for ax in axes[-1]:
        ax.set_xlabel("seconds into the run", fontsize=8)
    fig.suptitle("podlock dashboard (charts/podlock/dashboards/podlock.json), from scripts/dashboard.sh")
    fig.tight_layout()
    fig.savefig(out, dpi=90)
    print(f"wrote {out}")


if __name__ == "__main__":
    main()

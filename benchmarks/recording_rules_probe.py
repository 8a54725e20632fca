"""Prometheus CPU of reading candidate recorded per-device one-minute aggregates vs the floor (issue 33).

A measurement of the queries an optional recording-rules path would ask, not the path itself (it is not
built: docs/performance.md "Recorded per-device aggregates (issue 33)" says why). On a TSDB of
``collect_scale.py`` (``--data-dir``, data version 2, holding ``--size`` nodes), this backfills once, with
``promtool tsdb create-blocks-from rules`` against a Prometheus on that TSDB, one recorded family
``rightsizer:dcgm_device:1m`` evaluated every minute over the window: per device (labels ``node``,
``Hostname``, ``instance``, ``job``, ``UUID``, ``gpu``, ``GPU_I_ID``) and per ``agg`` label, the one-minute
aggregates the facts of ``rightsizer.domain.observation`` would need (activity max, non-finite markers and
newest sample time; framebuffer used max, sum and count; free sum and count; power and energy max, min and
non-finite markers: 17 series a device). Then it asks, alternated round by round, GC-fenced like
``collect_scale.measure``, serially: the floor, every recorded sample of the window, its bare selection
(``count``), the four reads a rules path would make (per-step activity maxima, then the window's max, min
and sum of the aggregates) with the raw ``up`` reads, each of those alone, and one instant value per
recorded series. Prints Prometheus CPU s, least of ``--rounds``, and each set's ratio to the floor.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
from pathlib import Path

import httpx

sys.path[:0] = [str(Path(__file__).resolve().parents[1])]

from tests.support.prometheus_server import (  # noqa: E402
    PrometheusServer,
    find_binaries,
    start_prometheus,
)

from collect_scale import END, FAMILIES, WINDOW, _proc_cpu, _server_gc, compact_blocks  # noqa: E402

FAMILY = "rightsizer:dcgm_device:1m"
KEEP = "node, Hostname, instance, job, UUID, gpu, GPU_I_ID"
SHORT = dict(zip(("util", "prof", "fb_used", "fb_free", "power", "energy"), FAMILIES, strict=True))
AGGS = {
    "util": ("max", "nonfinite", "newest"),
    "prof": ("max", "nonfinite", "newest"),
    "fb_used": ("max", "sum", "count"),
    "fb_free": ("sum", "count"),
    "power": ("max", "min", "nonfinite"),
    "energy": ("max", "min", "nonfinite"),
}
MARKER = "recording_rules_probe.json"


def _agg_expr(metric: str, agg: str) -> str:
    r = f"{metric}[1m]"
    inner = {
        "max": f"max_over_time({r})",
        "min": f"min_over_time({r})",
        "sum": f"sum_over_time({r})",
        "count": f"count_over_time({r})",
        # 1 when a sample of the minute is NaN or ±Inf (a sum is non-finite exactly then), else 0
        "nonfinite": f"sum_over_time({r}) * 0 != bool 0",
        "newest": f"timestamp({metric})",
    }[agg]
    return f"max by ({KEEP}) ({inner})"


def rules_yaml() -> str:
    """The candidate rule group (one recorded family, ``metric`` and ``agg`` labels), as YAML text."""
    lines = ["groups:", "- name: rightsizer-device-1m", "  interval: 1m", "  rules:"]
    for short, aggs in AGGS.items():
        for agg in aggs:
            lines += [
                f"  - record: {FAMILY}",
                f"    expr: '{_agg_expr(SHORT[short], agg)}'",
                "    labels:",
                f"      metric: {short}",
                f"      agg: {agg}",
            ]
    return "\n".join(lines) + "\n"


def backfill_rules(root: Path) -> None:
    """Record the family over [END − WINDOW − 300 s, END] into the TSDB under ``root``, once."""
    if (root / MARKER).is_file():
        return
    binaries = find_binaries()
    assert binaries is not None, "prometheus/promtool not on PATH"
    rules, out = root / "recording_rules_probe.yaml", root / "rule-blocks"
    rules.write_text(rules_yaml())
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir()
    server = start_prometheus(binaries, root)
    try:
        subprocess.run(
            [
                binaries.promtool,
                *("tsdb", "create-blocks-from", "rules"),
                f"--start={END - WINDOW - 300:.0f}",
                f"--end={END:.0f}",
                f"--url={server.url}",
                "--eval-interval=60s",
                f"--output-dir={out}",
                str(rules),
            ],
            check=True,
            capture_output=True,
        )
    finally:
        server.stop()
    for block in out.iterdir():
        block.rename(root / "data" / block.name)
    compact_blocks(binaries, root)
    (root / MARKER).write_text(json.dumps({"family": FAMILY, "aggs": AGGS}))


def query_sets(size: int) -> dict[str, list[tuple[str, str]]]:
    """Name → the (kind, PromQL) requests of that set; kind ``range`` runs at every minute of the window."""
    job, rng = f'job="n{size}"', f"[{WINDOW - 1}s]"  # the window's 30 recorded minutes
    up = [
        ("range", f"max_over_time(up{{{job}}}[60s])"),
        ("instant", f"count_over_time(up{{{job}}}[{WINDOW}s])"),
    ]
    reads = [
        ("range", f'{FAMILY}{{{job},agg="max",metric=~"util|prof"}}'),
        ("instant", f'max_over_time({FAMILY}{{{job},agg=~"max|nonfinite|newest"}}{rng})'),
        ("instant", f'min_over_time({FAMILY}{{{job},agg="min"}}{rng})'),
        ("instant", f'sum_over_time({FAMILY}{{{job},agg=~"sum|count"}}{rng})'),
    ]
    return {
        "floor": [("instant", f"count(count_over_time({m}{{{job}}}[{WINDOW}s]))") for m in (*FAMILIES, "up")],
        "rules path: 4 reads + up": reads + up,
        "  per-step activity maxima": reads[:1],
        "  window max of 9 aggs": reads[1:2],
        "  window min of 2 aggs": reads[2:3],
        "  window sum of 4 aggs": reads[3:4],
        "  up per step + count (raw)": up,
        "every recorded sample": [("instant", f"{FAMILY}{{{job}}}{rng}")],
        "its selection alone (count)": [("instant", f"count(count_over_time({FAMILY}{{{job}}}{rng}))")],
        "one instant value a series": [("instant", f"{FAMILY}{{{job}}}")],
    }


def cost(
    server: PrometheusServer, client: httpx.Client, requests: list[tuple[str, str]]
) -> tuple[float, float]:
    """(Prometheus CPU s, answer MiB) of ``requests`` asked serially, GC-fenced."""
    pid = server.process.pid
    _server_gc(server.url)
    g0 = _proc_cpu(pid)
    _server_gc(server.url)
    idle = _proc_cpu(pid) - g0
    p0, size = _proc_cpu(pid), 0
    for kind, expr in requests:
        if kind == "range":
            params = {"query": expr, "start": END - WINDOW + 60, "end": END, "step": 60}
            answer = client.post(f"{server.url}/api/v1/query_range", data=params)
        else:
            answer = client.post(f"{server.url}/api/v1/query", data={"query": expr, "time": END})
        answer.raise_for_status()
        size += len(answer.content)
    _server_gc(server.url)
    return _proc_cpu(pid) - p0 - idle, size / 2**20


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--data-dir", help="a collect_scale.py TSDB (data version 2); required to measure")
    parser.add_argument("--size", type=int, default=2000, help="GPU nodes (a size the TSDB holds)")
    parser.add_argument("--rounds", type=int, default=3, help="alternated rounds (least kept)")
    parser.add_argument("--rules", action="store_true", help="print the candidate rule group and stop")
    args = parser.parse_args(argv)
    if args.rules:
        print(rules_yaml(), end="")
        return 0
    if not args.data_dir:
        parser.error("--data-dir is required to measure")
    root = Path(args.data_dir)
    kept = json.loads((root / "collect_scale.json").read_text())
    if kept.get("version") != 2 or args.size not in kept["sizes"]:
        raise SystemExit(f"{root} is not a collect_scale.py data-version-2 TSDB holding {args.size} nodes")
    backfill_rules(root)
    binaries = find_binaries()
    assert binaries is not None
    server = start_prometheus(binaries, root)
    best: dict[str, tuple[float, float]] = {}
    try:
        with httpx.Client(timeout=600) as client:
            cost(server, client, query_sets(args.size)["floor"])  # warm the page cache
            for k in range(args.rounds):
                for name, requests in query_sets(args.size).items():
                    cpu, mib = cost(server, client, requests)
                    print(f"#{k + 1} {name:<32} {cpu:6.2f} s {mib:8.1f} MiB", flush=True)
                    if name not in best or cpu < best[name][0]:
                        best[name] = (cpu, mib)
    finally:
        server.stop()
    floor_cpu = best["floor"][0]
    print(f"\n{args.size} nodes, Prometheus CPU s (least of {args.rounds}), answer MiB, ×floor:")
    for name, (cpu, mib) in best.items():
        print(f"{name:<32} {cpu:6.2f} {mib:8.1f}  ×{cpu / floor_cpu:.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""Render a Chrome trace-event JSON file (netcl.profiling's export) as one self-contained HTML page: a track
per process/thread, each slice a box nested by depth, a time axis in ms. For a picture of a trace where the
Perfetto UI or chrome://tracing cannot load (offline machines; docs/profiler-trace.png was made this way):

    python scripts/trace_to_html.py step.trace.json step.html
    chromium --headless --no-sandbox --window-size=1600,1000 --screenshot=step.png file://$PWD/step.html
"""

from __future__ import annotations

import argparse
import colorsys
import hashlib
import html
import json
from pathlib import Path

WIDTH, LABEL, ROW, GAP = 1560, 190, 18, 14


def color(name: str) -> str:
    h = int(hashlib.md5(name.encode()).hexdigest()[:6], 16) / 0xFFFFFF
    r, g, b = colorsys.hls_to_rgb(h, 0.62, 0.55)
    return f"#{int(r * 255):02x}{int(g * 255):02x}{int(b * 255):02x}"


def render(trace: dict, title: str, until: float | None = None) -> str:
    """One SVG panel of the trace from 0 to `until` microseconds (default: its end)."""
    events = trace["traceEvents"]
    procs = {e["pid"]: e["args"]["name"] for e in events if e["ph"] == "M" and e["name"] == "process_name"}
    threads = {
        (e["pid"], e["tid"]): e["args"]["name"]
        for e in events
        if e["ph"] == "M" and e["name"] == "thread_name"
    }
    slices = [e for e in events if e["ph"] == "X" and (until is None or e["ts"] < until)]
    end = until or max((e["ts"] + e["dur"] for e in slices), default=1.0) or 1.0
    if until is not None:
        slices = [{**e, "dur": min(e["dur"], until - e["ts"])} for e in slices]
    scale = (WIDTH - LABEL - 10) / end
    tracks: dict[tuple, list] = {}
    for e in sorted(slices, key=lambda e: (e["ts"], -e["dur"])):
        tracks.setdefault((e["pid"], e["tid"]), []).append(e)
    body, y = [], 40
    for key in sorted(tracks):
        stack: list[float] = []
        placed = []
        for e in tracks[key]:
            while stack and stack[-1] <= e["ts"]:
                stack.pop()
            placed.append((len(stack), e))
            stack.append(e["ts"] + e["dur"])
        depth = 1 + max(d for d, _ in placed)
        name = f"{procs.get(key[0], key[0])} / {threads.get(key, key[1])}"
        body.append(f'<text x="6" y="{y + 13}" class="track">{html.escape(name[:30])}</text>')
        body.append(f'<line x1="0" x2="{WIDTH}" y1="{y - 4}" y2="{y - 4}" stroke="#ccc"/>')
        for d, e in placed:
            x, w = LABEL + e["ts"] * scale, max(e["dur"] * scale, 0.8)
            tip = f'{e["name"]} {e["dur"] / 1000:.3f} ms ' + json.dumps(e.get("args", {}))
            body.append(
                f'<g><title>{html.escape(tip)}</title><rect x="{x:.2f}" y="{y + d * ROW}" width="{w:.2f}" '
                f'height="{ROW - 2}" fill="{color(e["name"])}" stroke="#555" stroke-width="0.3"/>'
            )
            if w > 7 * len(e["name"][:40]) * 0.9:
                body.append(f'<text x="{x + 3:.2f}" y="{y + d * ROW + 12}" class="slice">'
                            f'{html.escape(e["name"][:40])}</text>')
            body.append("</g>")
        y += depth * ROW + GAP
    ticks = []
    step = 10 ** max(0, len(str(int(end / 1000 / 8))) - 1) if end > 8000 else (0.5 if end > 2000 else 0.1)
    ms = 0.0
    while ms * 1000 <= end:
        x = LABEL + ms * 1000 * scale
        ticks.append(f'<line x1="{x:.1f}" x2="{x:.1f}" y1="26" y2="{y}" stroke="#eee"/>'
                     f'<text x="{x + 2:.1f}" y="24" class="tick">{ms:g} ms</text>')
        ms += step
    return (f'<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{y + 10}">'
            f'<text x="6" y="14" style="font-size:13px">{html.escape(title)}</text>'
            + "".join(ticks) + "".join(body) + "</svg>")


def page(panels: list[str], title: str) -> str:
    return (f'<!doctype html><html><head><meta charset="utf-8"><title>{html.escape(title)}</title><style>'
            "body{margin:0;font-family:sans-serif;background:#fff} .track{font-size:12px;font-weight:bold}"
            ".slice{font-size:10px;pointer-events:none} .tick{font-size:10px;fill:#666}</style></head><body>"
            + "".join(panels) + "</body></html>")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("trace")
    ap.add_argument("html")
    ap.add_argument("--title", default=None)
    ap.add_argument("--zoom", type=float, default=None, help="also a panel of the first ZOOM milliseconds")
    args = ap.parse_args()
    trace = json.loads(Path(args.trace).read_text())
    title = args.title or Path(args.trace).name
    panels = [render(trace, title)]
    if args.zoom:
        panels.append(render(trace, f"the first {args.zoom:g} ms (host: module scopes and enqueue calls)",
                             args.zoom * 1000))
    Path(args.html).write_text(page(panels, title))


if __name__ == "__main__":
    main()

"""Does `rir view`'s report fit a 1,400 px browser window? Renders a run's page into a temporary folder,
opens it in headless Chromium and prints the page's and every table's widths.

    python bench/report_width.py runs/eval/decisions-agent-textworld --png /tmp/report.png
    python bench/report_width.py RUN --width 1280 --no-episode

Exits 1 when the report page (or the first episode's page) scrolls sideways, 2 when Chromium or
Playwright is missing (`make browser` installs both). The run folder is not written to.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

from eval.view import render_run
from eval.view.browser import WIDTH, Widths, measure, missing


def show(widths: Widths) -> None:
    """One view's widths: the document first, then each table against the box it sits in."""
    verdict = "SCROLLS sideways" if widths.scrolls else "fits"
    print(f"{widths.view}: scrollWidth {widths.scroll} px, clientWidth {widths.client} px: {verdict}")
    for heading, width, box in widths.tables:
        print(f"  table under {heading!r}: {width} px in a {box} px box{'  (wider)' if width > box else ''}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("run", help="a run folder written by rir eval (or rir rollout)")
    parser.add_argument("--png", default="", help="save a full-page screenshot of the report page here")
    parser.add_argument("--width", type=int, default=WIDTH, help=f"viewport width in px (default {WIDTH})")
    parser.add_argument("--no-episode", action="store_true", help="measure the report page only")
    args = parser.parse_args()
    reason = missing()
    if reason:
        print(f"report_width: {reason}", file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory() as tmp:
        page = render_run(Path(args.run), out=Path(tmp) / "view.html")
        views = measure(page, args.width, Path(args.png) if args.png else None, episode=not args.no_episode)
    print(f"viewport {args.width} px, run {args.run}")
    for widths in views:
        show(widths)
    if args.png:
        print(f"screenshot: {args.png}")
    return 1 if any(w.scrolls for w in views) else 0


if __name__ == "__main__":
    sys.exit(main())

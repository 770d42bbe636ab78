"""How wide `rir view`'s page renders, measured in a headless Chromium (through Playwright).

A table that pushes the page into a horizontal scroll is a layout fault no string test sees; here a real
browser lays the page out at a given viewport width and reports the page's and each table's widths, for
`bench/report_width.py` and the width test. Both are optional: `make browser` installs Debian's Chromium
and the `browser` extra (Playwright drives that Chromium; its own browser download needs a network).
"""

from __future__ import annotations

import importlib.util
import os
import shutil
from dataclasses import dataclass, field
from pathlib import Path

from rir_runtime.errors import UserInputError

INSTALL = "make browser"  # what installs both (the Makefile's `browser` target)
CHROMIUMS = ("chromium", "chromium-browser", "google-chrome")  # Debian's name first
WIDTH = 1400  # px: a laptop's browser window, the width the report must fit without a horizontal scroll

# Per view: the document's widths, then each visible table's (the heading above it, its width, its box's
# content width).
_MEASURE = """() => {
  const root = document.documentElement;
  const tables = Array.from(document.querySelectorAll("table")).filter((t) => t.offsetParent !== null);
  return {
    scroll: root.scrollWidth,
    client: root.clientWidth,
    tables: tables.map((t) => {
      const heads = Array.from(document.querySelectorAll("h2, h3")).filter((h) => h.offsetParent !== null);
      const heading = heads.filter((h) => h.compareDocumentPosition(t) & Node.DOCUMENT_POSITION_FOLLOWING).pop();
      const box = t.parentElement, style = getComputedStyle(box);
      const inner = box.clientWidth - parseFloat(style.paddingLeft) - parseFloat(style.paddingRight);
      return [heading ? heading.textContent : t.className || "table", t.scrollWidth, Math.floor(inner)];
    }),
  };
}"""


@dataclass(frozen=True)
class Widths:
    """One view of the page at one viewport: the document's scroll and client widths, and each table's
    (heading, width, container width) in document order."""

    view: str
    scroll: int
    client: int
    tables: list[tuple[str, int, int]] = field(default_factory=list)

    @property
    def scrolls(self) -> bool:
        """Whether the page scrolls sideways (a table inside its own scroll box does not count)."""
        return self.scroll > self.client


def chromium() -> str | None:
    """The Chromium to drive: $RIR_CHROMIUM, else the first of `CHROMIUMS` on the PATH."""
    explicit = os.environ.get("RIR_CHROMIUM")
    if explicit:
        return explicit if Path(explicit).exists() else None
    return next((path for name in CHROMIUMS if (path := shutil.which(name))), None)


def missing() -> str | None:
    """Why the page cannot be measured here, with the fix; None when it can."""
    if importlib.util.find_spec("playwright") is None:
        return f"Playwright is not installed: run `{INSTALL}` (pip install the `browser` extra)"
    if chromium() is None:
        return f"no Chromium on the PATH ({', '.join(CHROMIUMS)}) or at $RIR_CHROMIUM: run `{INSTALL}`"
    return None


def measure(page: Path, width: int = WIDTH, screenshot: Path | None = None, episode: bool = True) -> list[Widths]:
    """Open `page` at a `width` px viewport: the report and index as the page opens (its full-page
    `screenshot`, if a path is given), then, with `episode`, the first episode's page (`#e=0`)."""
    reason = missing()
    if reason:
        raise UserInputError(reason)
    from playwright.sync_api import sync_playwright

    url = page.resolve().as_uri()
    views = [("report", url)] + ([("episode", url + "#e=0")] if episode else [])
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=chromium(), headless=True)
        try:
            tab = browser.new_page(viewport={"width": width, "height": 900})
            out = []
            for name, address in views:
                tab.goto(address)
                tab.wait_for_load_state("load")
                if name == "report" and screenshot is not None:
                    tab.screenshot(path=str(screenshot), full_page=True)
                found = tab.evaluate(_MEASURE)
                tables = [(str(heading), int(w), int(box)) for heading, w, box in found["tables"]]
                out.append(Widths(name, int(found["scroll"]), int(found["client"]), tables))
            return out
        finally:
            browser.close()

"""A run exported as Inspect AI logs, opened the way an evaluator would: read back with Inspect's data-frame
API (samples and success per method, against the run's summary.json) and opened in `inspect view`, served
and screenshotted in headless Chromium (the list of logs, one log's samples, one sample's transcript).

    python bench/inspect_view.py runs/eval/decisions-agent-textworld --out /tmp/inspect-view

It needs Inspect AI, which cannot share the project's pinned environment (docs/contracts.md, Exports),
and a browser: `make inspect-env` builds `.venv-inspect` with both; run this script with its python.
Exits 1 when the logs and summary.json disagree or the viewer shows no sample.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))  # the checkout's eval/ when this runs from another environment's python

FIX = "build the environment that has it with `make inspect-env` and run this with .venv-inspect/bin/python"


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("run", type=Path, help="a run folder of `rir eval` (episodes.jsonl and summary.json)")
    p.add_argument("--out", type=Path, required=True, help="where the logs and screenshots go")
    p.add_argument("--port", type=int, default=0, help="the viewer's port (default: a free one)")
    args = p.parse_args()
    from eval.export import INSPECT_DIR, export_run
    from eval.view.browser import chromium, missing

    if importlib.util.find_spec("inspect_ai") is None:
        sys.exit(f"bench/inspect_view.py: inspect_ai is not installed: {FIX}")
    if reason := missing():
        sys.exit(f"bench/inspect_view.py: {reason}")

    logs = args.out / INSPECT_DIR
    shutil.rmtree(logs, ignore_errors=True)
    export_run(args.run, args.out, "inspect")
    agree = compare_with_summary(logs, args.run / "summary.json")
    with viewer(logs, args.port or free_port()) as url:
        shown = screenshots(url, str(chromium()), args.out)
    print(f"screenshots: {', '.join(str(p) for p in shown)}")
    return 0 if agree and len(shown) == 3 else 1


def compare_with_summary(logs: Path, summary_path: Path) -> bool:
    """Samples and success rate per method key as `samples_df` reads the logs, beside summary.json's."""
    from inspect_ai.analysis import samples_df

    df = samples_df(str(logs))
    methods = json.loads(summary_path.read_text())["methods"]
    print(f"{len(df)} samples in {df['eval_id'].nunique()} logs (inspect_ai.analysis.samples_df)\n")
    print("| method | samples | episodes (summary.json) | success | success (summary.json) |")
    print("| --- | ---: | ---: | ---: | ---: |")
    agree = set(df["metadata_method_key"]) == set(methods)
    for key, rows in df.groupby("metadata_method_key"):
        rate, want = float((rows["score_success"] == "C").mean()), methods.get(key, {})
        agree &= len(rows) == want.get("episodes") and abs(rate - want.get("success_rate", -1)) < 1e-12
        print(f"| {key} | {len(rows)} | {want.get('episodes')} | {rate:.1%} | {want.get('success_rate', 0):.1%} |")
    print("\nequal to summary.json" if agree else "\nDIFFERENT from summary.json")
    return agree


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextmanager
def viewer(logs: Path, port: int) -> Iterator[str]:
    """`inspect view` serving the logs, for as long as the block runs."""
    inspect = Path(sys.executable).with_name("inspect")
    argv = [str(inspect), "view", "--log-dir", str(logs), "--host", "127.0.0.1", "--port", str(port)]
    server = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                if server.poll() is not None or time.monotonic() > deadline:
                    raise SystemExit(f"bench/inspect_view.py: `{' '.join(argv)}` did not start serving") from None
                time.sleep(0.5)
        yield f"http://127.0.0.1:{port}/"
    finally:
        server.terminate()
        server.wait(timeout=30)


def screenshots(url: str, chromium: str, out: Path) -> list[Path]:
    """The viewer at 1,400 px: the list of logs, the samples of the log it opens on, the first one's transcript."""
    from playwright.sync_api import sync_playwright

    from eval.view.browser import WIDTH

    shown: list[Path] = []
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=chromium, args=["--no-sandbox"])
        page = browser.new_page(viewport={"width": WIDTH, "height": 900})
        page.goto(url + "#/tasks/")  # the list of logs
        page.get_by_text("TASK ARGS").first.wait_for(timeout=60_000)
        shown.append(shot(page, out / "inspect-logs.png"))
        page.locator("[role=row]").nth(1).click()  # the first log (row 0 is the header)
        page.get_by_role("tab", name="Samples").click(timeout=60_000)
        first_sample = page.locator("[role=row]").nth(1)
        first_sample.wait_for(timeout=30_000)
        shown.append(shot(page, out / "inspect-samples.png"))
        first_sample.click()
        page.get_by_role("tab", name="Transcript").click(timeout=30_000)
        shown.append(shot(page, out / "inspect-transcript.png"))
        browser.close()
    return shown


def shot(page, path: Path) -> Path:  # type: ignore[no-untyped-def]
    """A screenshot of what the page shows now, once its last fetch has had time to render."""
    page.wait_for_timeout(2_000)
    page.screenshot(path=str(path))
    width = page.evaluate("document.documentElement.scrollWidth")
    rows = page.locator("[role=row]").count()
    print(f"{path.name}: {page.url} ({rows} table rows shown; page scrollWidth {width} px)")
    return path


if __name__ == "__main__":
    raise SystemExit(main())

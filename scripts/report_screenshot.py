"""The README's picture of the report page: the demo's index.html in headless Chromium.

    csweep run demo --workers 2 --seeds 2 --sampler random --seed 0   # the demo, as the README runs it
    python scripts/report_screenshot.py csweep_runs/reports/demo/index.html docs/report.png

Needs Debian's chromium (apt-get install chromium); nothing leaves the machine (the page is offline).
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path


def main(page: str, out: str, *, width: int = 1200, height: int = 1500) -> None:
    browser = shutil.which("chromium") or shutil.which("chromium-browser")
    if browser is None:
        sys.exit("report_screenshot: no chromium on PATH (apt-get install chromium)")
    flags = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
             "--hide-scrollbars", f"--window-size={width},{height}", f"--screenshot={Path(out).resolve()}"]
    subprocess.run([browser, *flags, Path(page).resolve().as_uri()], capture_output=True, timeout=120, check=True)
    print(f"wrote {out}")


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    main(sys.argv[1], sys.argv[2])

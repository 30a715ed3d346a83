"""Make docs/report.png: the report of a real run, screenshot whole in headless Chromium.

    uv run python docs/report_png.py [OUT]          # default: docs/report.png beside this script

The run is real: `bulkrelay run` of 300 rows at a configured 40 requests/s against the built-in target
(`python -m bulkrelay.demo.target`), which answers six rows 429 with `Retry-After: 2` once, every row
ending in 3 a 503 once (retried), and every row ending in 5 a 422 whose body echoes the `Authorization`
header it was sent (the journal redacts it: `Bearer ***`). Once 120 rows are committed the run gets a
SIGINT (Ctrl+C), and `bulkrelay resume --report` finishes it and writes the page. Chromium (Debian's
`chromium`) draws the page in a window taller than it, the blank below the page is cropped and the
image is quantized to a palette, so the PNG stays small (under 400 KB). What it prints is what the
caption in docs/report.md says.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from PIL import Image, ImageChops

ROWS = 300
STOP_AFTER = 120  # committed rows when the SIGINT is sent
WIDTH, TALL = 1200, 9000  # the window; the page is cropped to its own height
BACKGROUND = (0xF6, 0xF7, 0xF9)  # the page's body background (bulkrelay.report.reportpage.py)
MARGIN = 16  # pixels of background kept below the footer
COLOURS = 96  # the palette: the page's flat colours and the text's anti-aliasing
TOKEN = "tk-docs-screenshot"
PLAN: dict[str, Any] = {
    "rules": [
        *(
            {"match": {"body_contains": f"user{n}@"}, "status": 429, "retry_after": "2", "first_attempts": 1}
            for n in (40, 90, 150, 170, 240, 260)
        ),
        {"match": {"body_contains": "3@example"}, "status": 503, "first_attempts": 1},
        {
            "match": {"body_contains": "5@example"},
            "status": 422,
            "echo_header": "Authorization",
            "body": {"error": "invalid email", "saw": "{echo}"},
        },
        {"delay_ms": 40},
    ]
}


def _job(directory: Path, url: str) -> Path:
    rows = "".join(f"{n},user{n}@example.com,User {n}\n" for n in range(1, ROWS + 1))
    (directory / "customers.csv").write_text("id,email,name\n" + rows)
    job = {
        "version": 1,
        "name": "customers-nightly",
        "input": {"file": "customers.csv", "key": "id"},
        "request": {
            "method": "PUT",
            "url": f"{url}/customers/{{id}}",
            "headers": {"Authorization": "Bearer ${API_TOKEN}"},
            "json": {"email": {"from": "email"}, "name": {"from": "name"}},
        },
        "execution": {"concurrency": 4, "rate_limit": {"requests_per_second": 40}},
        "retry": {"max_attempts": 3, "initial_backoff_seconds": 0.2},
    }
    path = directory / "job.yaml"
    path.write_text(json.dumps(job, indent=2))  # JSON is YAML
    return path


def _wait(ready: Callable[[], object], what: str, seconds: float = 60.0) -> None:
    end = time.monotonic() + seconds
    while not ready():
        if time.monotonic() > end:
            raise SystemExit(f"gave up waiting for {what}")
        time.sleep(0.05)


def _target(directory: Path) -> tuple[subprocess.Popen[bytes], str]:
    (directory / "plan.json").write_text(json.dumps(PLAN))
    port_file = directory / "port"
    command = [sys.executable, "-m", "bulkrelay.demo.target", "--port", "0", "--no-record"]
    command += ["--plan", str(directory / "plan.json"), "--port-file", str(port_file)]
    proc = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    _wait(lambda: port_file.exists() and port_file.read_text().strip(), "the target's port")
    return proc, f"http://127.0.0.1:{int(port_file.read_text())}"


def _committed(runs: Path) -> int:
    journals = list(runs.glob("2*/results.jsonl"))
    if not journals:
        return 0
    data = journals[0].read_bytes()
    return data.count(b"\n") - data.count(b'{"commit":')  # rows, not commit markers


def _play(directory: Path, url: str) -> Path:
    """The run, stopped by SIGINT midway, then resumed with --report: the page's path."""
    job, runs = _job(directory, url), directory / "runs"
    env = {**os.environ, "API_TOKEN": TOKEN}
    cli = [sys.executable, "-m", "bulkrelay"]
    first = subprocess.Popen(
        [*cli, "run", str(job), "--budget", "0", "--runs-dir", str(runs)],
        cwd=directory,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
    )
    _wait(lambda: _committed(runs) >= STOP_AFTER, f"{STOP_AFTER} committed rows")
    first.send_signal(signal.SIGINT)
    stopped = json.loads(first.communicate(timeout=60)[0])
    run_dir = Path(stopped["data"]["run_dir"])
    time.sleep(1.0)  # a visible gap between the stop and the resume on the time axis
    resumed = subprocess.run(
        [*cli, "resume", str(run_dir), "--budget", "0", "--report"],
        cwd=directory,
        env=env,
        capture_output=True,
        check=False,
    )
    answer = json.loads(resumed.stdout)
    print(f"run {run_dir.name}: first call exit {first.returncode}, resume exit {resumed.returncode}")
    print("summary:", json.dumps(answer["data"]["summary"]))
    return Path(answer["data"]["report"])


def _screenshot(page: Path, png: Path, profile: Path) -> None:
    chromium = shutil.which("chromium") or "/usr/bin/chromium"
    command = [chromium, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars"]
    command += ["--no-first-run", f"--user-data-dir={profile}", f"--window-size={WIDTH},{TALL}"]
    subprocess.run(
        [*command, f"--screenshot={png}", page.as_uri()], capture_output=True, timeout=180, check=True
    )


def _cropped(shot: Path, out: Path) -> None:
    """The page alone (the window's blank below it cropped), quantized to a palette."""
    with Image.open(shot) as image:
        rgb = image.convert("RGB")
    box = ImageChops.difference(rgb, Image.new("RGB", rgb.size, BACKGROUND)).getbbox()
    if box is None:
        raise SystemExit("the screenshot is blank")
    bottom = min(box[3] + MARGIN, rgb.height)
    if bottom >= rgb.height:
        raise SystemExit(f"the page is taller than the {TALL} px window: raise TALL")
    page = rgb.crop((0, 0, rgb.width, bottom))
    page.quantize(COLOURS, method=Image.Quantize.MEDIANCUT).save(out, optimize=True)
    print(f"{out}: {page.width}x{page.height}, {out.stat().st_size // 1024} KB")


def main() -> None:
    out = Path(sys.argv[1]) if len(sys.argv) > 1 else Path(__file__).resolve().parent / "report.png"
    with tempfile.TemporaryDirectory(prefix="bulkrelay-report-png-") as tmp:
        directory = Path(tmp)
        target, url = _target(directory)
        try:
            page = _play(directory, url)
        finally:
            target.terminate()
            target.wait(timeout=30)
        text = page.read_text()
        if TOKEN in text:
            raise SystemExit("the page holds the token")
        shot = directory / "shot.png"
        _screenshot(page, shot, directory / "profile")
        _cropped(shot, out)


if __name__ == "__main__":
    main()

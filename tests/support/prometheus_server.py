"""pytest fixtures: a real Prometheus (Debian ``prometheus`` 2.x) on 127.0.0.1 with backfilled DCGM series.

Series are written as OpenMetrics text (``openmetrics_text``), turned into TSDB blocks with
``promtool tsdb create-blocks-from openmetrics`` in a fresh data directory, and served by a Prometheus
started with its own empty config and ``--web.listen-address=127.0.0.1:<free port>``; the fixture waits
for ``/-/ready``. Without the binaries the tests skip with the reason — unless ``CI=true``, where a
missing binary fails the run (docs/architecture.md §7).

Use from a test module with ``pytest_plugins = ["tests.support.prometheus_server"]``.
"""

from __future__ import annotations

import math
import os
import shutil
import socket
import subprocess
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

READY_TIMEOUT_S = 60.0


@dataclass(frozen=True)
class PrometheusBinaries:
    """Paths of ``prometheus`` and ``promtool``."""

    prometheus: str
    promtool: str


def find_binaries() -> PrometheusBinaries | None:
    """Both binaries from PATH (Debian installs them in /usr/bin), or None."""
    prom, tool = shutil.which("prometheus"), shutil.which("promtool")
    return PrometheusBinaries(prom, tool) if prom and tool else None


def require_binaries() -> PrometheusBinaries:
    """The binaries, or skip (fail with ``CI=true``) naming what is missing and how to get it."""
    found = find_binaries()
    if found is None:
        missing = [n for n in ("prometheus", "promtool") if shutil.which(n) is None]
        reason = f"{', '.join(missing)} not on PATH (apt-get install prometheus)"
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail(f"CI=true and {reason}")
        pytest.skip(reason)
    return found


def _fmt(value: float) -> str:
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    return repr(float(value))


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


Sample = tuple[float, float]
"""(Unix seconds, value)."""


def openmetrics_lines(
    families: Mapping[str, Iterable[tuple[Mapping[str, str], Iterable[Sample]]]],
) -> Iterator[str]:
    """OpenMetrics exposition lines (gauges) for ``metric → [(labels, [(t, v)…])]``, ``# EOF`` last.

    Each family's samples are contiguous and each series' samples in time order, as promtool needs.
    Timestamps are written in seconds with millisecond precision.
    """
    for name, series in families.items():
        yield f"# TYPE {name} gauge"
        for labels, samples in series:
            lab = ",".join(f'{k}="{_escape(v)}"' for k, v in sorted(labels.items()))
            prefix = f"{name}{{{lab}}}" if lab else name
            for t, v in samples:
                yield f"{prefix} {_fmt(v)} {t:.3f}"
    yield "# EOF"


def openmetrics_text(
    families: Mapping[str, Iterable[tuple[Mapping[str, str], Iterable[Sample]]]],
) -> str:
    """``openmetrics_lines`` joined, newline-terminated."""
    return "\n".join(openmetrics_lines(families)) + "\n"


def free_port() -> int:
    """A TCP port free on 127.0.0.1 right now (the kernel picks it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class PrometheusServer:
    """A running Prometheus: ``url`` (``http://127.0.0.1:<port>``), its process and directories."""

    url: str
    process: subprocess.Popen[bytes]
    root: Path

    def stop(self) -> None:
        """Terminate the process we started (by its pid) and wait for it."""
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(timeout=5)


def backfill(binaries: PrometheusBinaries, openmetrics_file: Path, data_dir: Path) -> None:
    """Create TSDB blocks from an OpenMetrics file (``promtool tsdb create-blocks-from openmetrics``)."""
    data_dir.mkdir(parents=True, exist_ok=True)
    done = subprocess.run(
        [
            binaries.promtool,
            "tsdb",
            "create-blocks-from",
            "openmetrics",
            str(openmetrics_file),
            str(data_dir),
        ],
        capture_output=True,
        text=True,
        check=False,
    )
    if done.returncode != 0:
        raise RuntimeError(f"promtool backfill failed ({done.returncode}): {done.stderr[-2000:]}")


def start_prometheus(
    binaries: PrometheusBinaries,
    root: Path,
    *,
    write_openmetrics: Callable[[Path], None] | None = None,
    extra_args: Iterable[str] = (),
) -> PrometheusServer:
    """Backfill (when ``write_openmetrics`` writes a file) and start Prometheus under ``root``; wait ready.

    ``write_openmetrics(path)`` writes the OpenMetrics text to ``path`` (streamed, so large benchmark
    data never sits in memory as one string).
    """
    root.mkdir(parents=True, exist_ok=True)
    data = root / "data"
    if write_openmetrics is not None:
        om = root / "series.om.txt"
        write_openmetrics(om)
        backfill(binaries, om, data)
        om.unlink()
    config = root / "prometheus.yml"
    config.write_text("global:\n  scrape_interval: 1h\nscrape_configs: []\n")
    port = free_port()
    log = (root / "prometheus.log").open("wb")
    process = subprocess.Popen(
        [
            binaries.prometheus,
            f"--config.file={config}",
            f"--storage.tsdb.path={data}",
            # Backfilled samples may be old or in the future; never let retention drop them.
            "--storage.tsdb.retention.time=100y",
            f"--web.listen-address=127.0.0.1:{port}",
            *extra_args,
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    log.close()
    server = PrometheusServer(f"http://127.0.0.1:{port}", process, root)
    deadline = time.monotonic() + READY_TIMEOUT_S
    while True:
        if process.poll() is not None:
            raise RuntimeError(
                f"prometheus exited ({process.returncode}): {(root / 'prometheus.log').read_text()[-2000:]}"
            )
        try:
            if httpx.get(f"{server.url}/-/ready", timeout=1.0).status_code == 200:
                return server
        except httpx.HTTPError:
            pass
        if time.monotonic() > deadline:
            server.stop()
            raise RuntimeError(f"prometheus not ready after {READY_TIMEOUT_S}s")
        time.sleep(0.1)


@pytest.fixture(scope="session")
def prometheus_binaries() -> PrometheusBinaries:
    """The Debian binaries (skip, or fail with ``CI=true``, when missing)."""
    return require_binaries()


@pytest.fixture
def prometheus_factory(
    prometheus_binaries: PrometheusBinaries, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Callable[..., PrometheusServer]]:
    """``make(families, extra_args=())`` starts a Prometheus holding ``families``; all stop at teardown."""
    started: list[PrometheusServer] = []

    def make(
        families: Mapping[str, Iterable[tuple[Mapping[str, str], Iterable[Sample]]]],
        extra_args: Iterable[str] = (),
    ) -> PrometheusServer:
        root = tmp_path_factory.mktemp("prometheus")

        def write(path: Path) -> None:
            with path.open("w", encoding="utf-8") as f:
                for line in openmetrics_lines(families):
                    f.write(line + "\n")

        server = start_prometheus(prometheus_binaries, root, write_openmetrics=write, extra_args=extra_args)
        started.append(server)
        return server

    yield make
    for server in started:
        server.stop()

"""The install a user makes: a wheel built from the checkout, in a fresh venv, serving clients.

An editable install hides a subpackage missing from the wheel (its finder maps whole folders),
so this builds the wheel, installs it where no editable Leveret is visible, starts `leveret
serve` from that venv and makes one publish and one get with pika.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import venv
import zipfile
from pathlib import Path
from urllib.request import urlopen

import pika
from support.brokers import BrokerProcess
from support.ports import free_port, wait_for_port

ROOT = Path(__file__).resolve().parent.parent
PARTS = ["amqp", "storage", "broker", "cli", "spark"]


def run(*cmd: str | Path, cwd: Path | None = None) -> None:
    result = subprocess.run([str(c) for c in cmd], cwd=cwd, capture_output=True, text=True,
                            timeout=600, check=False)
    assert result.returncode == 0, f"{cmd}:\n{result.stdout}\n{result.stderr}"


def build_wheel(into: Path) -> Path:
    """`pip wheel` from a copy of the tracked files, as a clean clone would have them."""
    source = into / "source"
    files = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True,
                           check=True).stdout.decode().split("\0")
    for name in filter(None, files):
        if (ROOT / name).is_file():
            (source / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / name, source / name)
    run(sys.executable, "-m", "pip", "wheel", "--no-deps",
        "-w", into / "dist", source)
    (wheel,) = (into / "dist").glob("leveret-*.whl")
    return wheel


def test_wheel_holds_every_package_folder(tmp_path: Path) -> None:
    wheel = build_wheel(tmp_path)
    names = set(zipfile.ZipFile(wheel).namelist())
    for part in PARTS:
        for init in (ROOT / part).rglob("__init__.py"):
            if "__pycache__" not in init.parts:
                assert f"leveret/{init.relative_to(ROOT).as_posix()}" in names
    # the web UI's files (package data, not modules): every one the repository tracks
    static = subprocess.run(["git", "ls-files", "broker/management/ui/static"], cwd=ROOT,
                            capture_output=True, text=True, check=True).stdout.split()
    assert "broker/management/ui/static/vendor/uplot-1.6.32/LICENSE" in static
    for name in static:
        assert f"leveret/{name}" in names
    # the console scripts, the operator tools among them
    (entry_points,) = [n for n in names if n.endswith(".dist-info/entry_points.txt")]
    scripts = zipfile.ZipFile(wheel).read(entry_points).decode()
    for script in ("leveret =", "leveret-streams =", "leveret-queues =", "leveretctl =",
                   "leveret-diagnostics ="):
        assert script in scripts, scripts


def test_wheel_in_fresh_venv_serves_pika(tmp_path: Path) -> None:
    wheel = build_wheel(tmp_path)
    env_dir = tmp_path / "venv"
    venv.create(env_dir, with_pip=True, clear=True)
    run(env_dir / "bin" / "python", "-m", "pip", "install", "--quiet", wheel)

    data_dir = tmp_path / "data"
    data_dir.mkdir()
    http_port = free_port()
    broker = BrokerProcess(data_dir, program=[str(env_dir / "bin" / "leveret")],
                           args=["--management-port", str(http_port)]).start()
    try:
        connection = pika.BlockingConnection(pika.URLParameters(broker.url))
        channel = connection.channel()
        channel.confirm_delivery()
        channel.queue_declare("from-the-wheel", durable=True)
        channel.basic_publish("", "from-the-wheel", b"installed",
                              pika.BasicProperties(delivery_mode=2))
        method, _props, body = channel.basic_get("from-the-wheel", auto_ack=True)
        connection.close()
        assert method is not None and body == b"installed"
        wait_for_port(http_port, 30, "127.0.0.1")
        for path in ("/", "/ui/app.js", "/ui/vendor/preact-11.2.0/preact.mjs"):  # the web UI
            with urlopen(f"http://127.0.0.1:{http_port}{path}", timeout=30) as response:
                assert response.status == 200 and response.read()
        assert broker.stop() == 0
    finally:
        broker.kill()

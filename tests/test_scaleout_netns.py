"""Several hosts on one machine: Redis, two gateway replicas and two engine replicas (fake
upstreams), each in its own network namespace joined by veth pairs to a bridge, started by
a fixture; the test client talks to them from the root namespace over that bridge. Faults:
an engine replica killed (requests move to the other, its breaker opens, nothing accepted
is lost; restarted, it takes traffic again), and a gateway cut from Redis by a route
(it keeps serving, the store failing open; once healed, a stream started there resumes
through the other gateway). Needs root and `ip` (iproute2); skipped without them.

A gateway killed (kill -9) mid-stream: the client resumes through the other gateway, which
continues the answer from the journal in Redis (`streams.journal_live`, streams that
migrate; the same with engines that die mid-answer is tests/test_stream_migration.py)."""

from __future__ import annotations

import json
import os
import secrets
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(os.geteuid() != 0 or shutil.which("ip") is None
                       or shutil.which("redis-server") is None,
                       reason="needs root, iproute2 and redis-server"),
]


def sh(*args: str) -> None:
    subprocess.run(args, check=True, capture_output=True, timeout=30)


@dataclass
class Net:
    """A bridge in the root namespace and one namespace per host on 10.77.<n>.0/24."""

    tag: str = field(default_factory=lambda: secrets.token_hex(2))
    subnet: str = field(default_factory=lambda: f"10.77.{secrets.randbelow(250) + 1}")
    hosts: list[str] = field(default_factory=list)
    procs: list[subprocess.Popen[bytes]] = field(default_factory=list)

    @property
    def bridge(self) -> str:
        return f"rlb{self.tag}"

    def up(self) -> None:
        sh("ip", "link", "add", "name", self.bridge, "type", "bridge")
        sh("ip", "addr", "add", f"{self.subnet}.1/24", "dev", self.bridge)
        sh("ip", "link", "set", self.bridge, "up")

    def host(self, n: int) -> tuple[str, str]:
        """A namespace with address .n on the bridge: (its name, its address)."""
        ns, veth = f"rl{self.tag}h{n}", f"rl{self.tag}v{n}"
        sh("ip", "netns", "add", ns)
        self.hosts.append(ns)
        sh("ip", "link", "add", veth, "type", "veth", "peer", "name", "eth0", "netns", ns)
        sh("ip", "link", "set", veth, "master", self.bridge, "up")
        sh("ip", "netns", "exec", ns, "ip", "addr", "add", f"{self.subnet}.{n}/24", "dev", "eth0")
        sh("ip", "netns", "exec", ns, "ip", "link", "set", "eth0", "up")
        sh("ip", "netns", "exec", ns, "ip", "link", "set", "lo", "up")
        return ns, f"{self.subnet}.{n}"

    def start(self, ns: str, *cmd: str, log: Path) -> subprocess.Popen[bytes]:
        # `ip netns exec` execs the command: the pid is the server's own (kill -9 reaches it)
        env = {**os.environ, "PYTHONPATH": str(ROOT), "NO_PROXY": "*"}
        with open(log, "ab") as out:
            proc = subprocess.Popen(["ip", "netns", "exec", ns, *cmd], stdout=out, stderr=subprocess.STDOUT,
                                    env=env)
        self.procs.append(proc)
        return proc

    def down(self) -> None:
        for p in self.procs:
            if p.poll() is None:
                p.kill()
                p.wait(timeout=10)
        for ns in self.hosts:
            subprocess.run(["ip", "netns", "delete", ns], capture_output=True, timeout=30)
        subprocess.run(["ip", "link", "delete", self.bridge], capture_output=True, timeout=30)


def client() -> httpx.Client:
    return httpx.Client(timeout=30, trust_env=False)


def wait_http(url: str, proc: subprocess.Popen[bytes], timeout: float = 180) -> None:
    deadline = time.monotonic() + timeout
    with client() as c:
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                raise RuntimeError(f"{url}: the process exited ({proc.returncode})")
            try:
                if c.get(url).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.2)
    raise TimeoutError(url)


@dataclass
class Cluster:
    net: Net
    gateways: list[str]  # base urls
    engines: list[str]
    engine_ns: list[str]
    gateway_ns: list[str]
    redis_ip: str
    engine_procs: list[subprocess.Popen[bytes]]
    tmp: Path
    gateway_procs: list[subprocess.Popen[bytes]] = field(default_factory=list)

    def start_engine(self, i: int) -> subprocess.Popen[bytes]:
        proc = self.net.start(self.engine_ns[i], sys.executable, "-m", "redline.backends.fake_upstream",
                              "--host", "0.0.0.0", "--port", "9001", "--ttft", "0.01", "--tpot", "0.05",
                              log=self.tmp / f"engine{i}.log")
        wait_http(f"{self.engines[i]}/readyz", proc)
        self.engine_procs[i] = proc
        return proc


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    tmp = tmp_path_factory.mktemp("netns")
    net = Net()
    try:
        net.up()
        redis_ns, redis_ip = net.host(10)
        gw = [net.host(11), net.host(12)]
        eng = [net.host(21), net.host(22)]
        redis = net.start(redis_ns, "redis-server", "--bind", "0.0.0.0", "--port", "6379",
                          "--protected-mode", "no", "--save", "", "--appendonly", "no",
                          "--dir", str(tmp), log=tmp / "redis.log")
        engines = [f"http://{ip}:9001" for _, ip in eng]
        c = Cluster(net, [f"http://{ip}:8000" for _, ip in gw], engines, [ns for ns, _ in eng],
                    [ns for ns, _ in gw], redis_ip, [redis, redis], tmp)
        for i in range(2):
            c.start_engine(i)
        config = {
            "server": {"host": "0.0.0.0", "port": 8000, "data_dir": str(tmp / "data")},
            "store": {"url": f"redis://{redis_ip}:6379/0"},
            "models": [{"name": "remote", "backend": "openai", "urls": engines,
                        "connect_timeout_s": 1.0}],
            "cache": {"semantic": False},
            "routing": {"classifier": "off", "hedge": False, "breaker_threshold": 2,
                        "breaker_ttl_s": 1.0},
            "streams": {"resume_grace_s": 30, "journal_live": True},
        }
        path = tmp / "redline.yaml"
        path.write_text(yaml.safe_dump(config))
        for i, (ns, _) in enumerate(gw):
            proc = net.start(ns, sys.executable, "-m", "redline.cli", "serve", "--config", str(path),
                             log=tmp / f"gateway{i}.log")
            wait_http(f"{c.gateways[i]}/readyz", proc)
            c.gateway_procs.append(proc)
        yield c
    finally:
        net.down()


def ask(c: httpx.Client, gateway: str, text: str, **extra: Any) -> httpx.Response:
    return c.post(f"{gateway}/v1/chat/completions", json={
        "model": "remote", "max_tokens": 3, "messages": [{"role": "user", "content": text}], **extra})


def stats(c: httpx.Client, url: str) -> dict[str, Any]:
    return c.get(f"{url}/stats").json()  # type: ignore[no-any-return]


def backend_up(c: httpx.Client, gateway: str, label: str) -> float | None:
    for line in c.get(f"{gateway}/metrics").text.splitlines():
        if line.startswith("redline_backend_up{") and f'backend="{label}"' in line:
            return float(line.rsplit(" ", 1)[1])
    return None


def test_a_killed_engine_replica_loses_nothing_and_comes_back(cluster: Cluster) -> None:
    with client() as c:
        for i in range(4):  # both gateways serve, over the bridge, from both engines
            r = ask(c, cluster.gateways[i % 2], f"warm {i}", cache=False)
            assert r.status_code == 200 and r.json()["choices"][0]["message"]["content"] == "tok tok tok"
        before = stats(c, cluster.engines[1])["completed"]
        cluster.engine_procs[0].send_signal(signal.SIGKILL)
        cluster.engine_procs[0].wait(timeout=10)
        answers = [ask(c, cluster.gateways[i % 2], f"after {i}", cache=False) for i in range(12)]
        assert [r.status_code for r in answers] == [200] * 12
        assert all(r.json()["choices"][0]["message"]["content"] == "tok tok tok" for r in answers)
        assert stats(c, cluster.engines[1])["completed"] - before == 12  # every one, on the live one
        assert any(backend_up(c, g, "remote/0") == 0 for g in cluster.gateways)  # a breaker opened
        cluster.start_engine(0)  # healed: after the breaker's ttl it is tried and used again
        deadline = time.monotonic() + 30
        while stats(c, cluster.engines[0])["completed"] == 0 and time.monotonic() < deadline:
            assert ask(c, cluster.gateways[0], f"healed {time.monotonic()}", cache=False).status_code == 200
            time.sleep(0.2)
        assert stats(c, cluster.engines[0])["completed"] > 0


def test_a_gateway_cut_from_redis_keeps_serving_and_its_streams_resume_elsewhere(cluster: Cluster) -> None:
    cut = ["ip", "netns", "exec", cluster.gateway_ns[0], "ip", "route"]
    with client() as c:
        sh(*cut, "add", "blackhole", f"{cluster.redis_ip}/32")
        try:
            for i in range(3):  # the cache and the journal fail open: answered all the same
                r = ask(c, cluster.gateways[0], f"cut {i}")
                assert r.status_code == 200 and r.json()["choices"][0]["message"]["content"] == "tok tok tok"
            assert ask(c, cluster.gateways[1], "the other is fine").status_code == 200
        finally:
            sh(*cut, "del", "blackhole", f"{cluster.redis_ip}/32")
        # healed: a stream started on the first gateway resumes through the second
        time.sleep(2.5)  # past the store's socket timeout: its connections are fresh again
        with c.stream("POST", f"{cluster.gateways[0]}/v1/chat/completions", json={
                "model": "remote", "max_tokens": 40, "stream": True, "cache": False,
                "messages": [{"role": "user", "content": "a long answer please"}]}) as s:
            assert s.status_code == 200
            stream_id = s.headers["x-redline-stream-id"]
            ids: list[str] = []
            data: list[str] = []
            for line in s.iter_lines():
                if line.startswith("id:"):
                    ids.append(line.split(":", 1)[1].strip())
                elif line.startswith("data:"):
                    data.append(line)
                if len(ids) == 3 and len(data) == 3:
                    break  # the client goes away after 3 events
        with c.stream("GET", f"{cluster.gateways[1]}/v1/streams/{stream_id}",
                      headers={"Last-Event-ID": ids[-1]}) as s:
            assert s.status_code == 200
            data += [line for line in s.iter_lines() if line.startswith("data:")]
        assert data[-1] == "data: [DONE]"
        # the whole answer, once: 40 tokens between what the first gateway sent and the rest
        text = "".join(json.loads(d[5:])["choices"][0]["delta"].get("content") or ""
                       for d in data[:-1] if json.loads(d[5:]).get("choices"))
        assert text.split() == ["tok"] * 40


def test_a_gateway_killed_mid_stream_goes_on_through_the_other(cluster: Cluster) -> None:
    """Last in the module: it kills gateway 0 for good."""
    with client() as c:
        with c.stream("POST", f"{cluster.gateways[0]}/v1/chat/completions", json={
                "model": "remote", "max_tokens": 40, "stream": True, "cache": False,
                "messages": [{"role": "user", "content": "a long answer, then a crash"}]}) as s:
            assert s.status_code == 200
            stream_id = s.headers["x-redline-stream-id"]
            ids: list[str] = []
            data: list[str] = []
            for line in s.iter_lines():
                if line.startswith("id:"):
                    ids.append(line.split(":", 1)[1].strip())
                elif line.startswith("data:"):
                    data.append(line)
                if len(ids) == 6 and len(data) == 6:
                    break
            cluster.gateway_procs[0].send_signal(signal.SIGKILL)  # mid-stream, client attached
            cluster.gateway_procs[0].wait(timeout=10)
        with c.stream("GET", f"{cluster.gateways[1]}/v1/streams/{stream_id}",
                      headers={"Last-Event-ID": ids[-1]}) as s:
            assert s.status_code == 200
            more = [line for line in s.iter_lines() if line.startswith(("id:", "data:"))]
        data += [line for line in more if line.startswith("data:")]
        seqs = [int(x.rsplit(":", 1)[1]) for x in ids + [line.split(":", 1)[1].strip()
                                                        for line in more if line.startswith("id:")]]
        assert seqs == list(range(1, len(seqs) + 1))
        assert data[-1] == "data: [DONE]" and not any('"error"' in d for d in data)
        pieces = [(json.loads(d[5:])["choices"] or [{}])[0].get("delta", {}).get("content")
                  for d in data[:-1]]
        assert "".join(p for p in pieces if p) == " ".join(["tok"] * 40)

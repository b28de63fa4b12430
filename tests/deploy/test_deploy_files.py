"""The deployment files in deploy/ say what they must, and every command line in them is one akrelay accepts.

No container runtime or systemd is needed: the files are parsed, and each ``akrelay serve`` command
line (the image's ENTRYPOINT, the systemd unit's ExecStart) goes through the CLI's own argument parser
and settings resolution, together with the environment the file gives it, without starting a server.
"""

from __future__ import annotations

import json
import re
import shlex
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from redis_server import require_redis_server

from akrelay.cli import build_parser
from akrelay.process.launcher import check_origin
from akrelay.settings import load_settings

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
NODE_PORT = 8443


def serve_settings(argv: list[str], env: dict[str, str]):
    """What ``akrelay serve`` would run with: argv after the program name, the given environment only."""
    assert argv[:1] == ["serve"], argv
    args = build_parser().parse_args(argv)
    assert args.command == "serve"
    settings = load_settings(args, env)
    check_origin(settings)
    return settings


def redis_conf() -> dict[str, str]:
    values = {}
    for line in (DEPLOY / "redis" / "redis.conf").read_text().splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            key, _, value = line.partition(" ")
            values[key.lower()] = value.strip()
    return values


def interpolate(value: str) -> str:
    """Compose's ``${NAME:-default}`` with nothing set in the environment."""
    return re.sub(r"\$\{[A-Z_]+:-([^}]*)\}", r"\1", value)


# -- Redis ------------------------------------------------------------------------------------------


def test_redis_conf_keeps_every_acknowledged_write() -> None:
    conf = redis_conf()
    assert conf["appendonly"] == "yes"
    assert conf["appendfsync"] == "always"
    assert conf["no-appendfsync-on-rewrite"] == "no", "fsync must go on during an AOF rewrite"
    assert conf["maxmemory-policy"] == "noeviction", "the log must never be evicted"
    assert conf["protected-mode"] == "yes"
    assert set(conf["bind"].split()) <= {"127.0.0.1", "-::1", "::1"}, "loopback unless the operator widens it"
    assert "dir" not in conf, "each user gives --dir (Redis changes into it while reading the file)"


# -- the image --------------------------------------------------------------------------------------


def dockerfile() -> list[tuple[str, str]]:
    """(instruction, arguments) of the final stage and the build stage, continuation lines joined."""
    text = re.sub(r"\\\n", " ", (DEPLOY / "Dockerfile").read_text())
    out = []
    for line in text.splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            word, _, rest = line.partition(" ")
            out.append((word.upper(), rest.strip()))
    return out


def test_dockerfile_command_line_is_accepted_by_akrelay_serve() -> None:
    instructions = dockerfile()
    entrypoint = json.loads(next(rest for word, rest in instructions if word == "ENTRYPOINT"))
    cmd = json.loads(next(rest for word, rest in instructions if word == "CMD"))
    assert entrypoint[:2] == ["akrelay", "serve"]
    final_stage = instructions[max(i for i, (word, _) in enumerate(instructions) if word == "FROM"):]
    env = {}
    for word, rest in final_stage:
        if word == "ENV":
            env.update(dict(item.split("=", 1) for item in shlex.split(rest)))
    akrelay_env = {k: v for k, v in env.items() if k.startswith("AKRELAY_")}
    settings = serve_settings(entrypoint[1:] + cmd, akrelay_env | {"AKRELAY_ORIGIN": "https://knowledge.example.org"})
    assert settings.host == "0.0.0.0" and settings.data == "/data"
    assert f"EXPOSE {settings.port}" in [f"{w} {r}" for w, r in final_stage]
    assert ("VOLUME", '["/data"]') in final_stage
    user = next(rest for word, rest in final_stage if word == "USER")
    assert user not in ("root", "0"), "the node does not run as root"
    health = next(rest for word, rest in final_stage if word == "HEALTHCHECK")
    assert "/healthz" in health
    assert all(rest.startswith("python:3.11-slim") or rest.startswith("${PYTHON_IMAGE}")
               for word, rest in instructions if word == "FROM")
    assert any(word == "ARG" and rest.startswith("PYTHON_IMAGE=python:3.11-slim") for word, rest in instructions)
    installs = [rest for word, rest in instructions if word == "RUN" and "pip install" in rest]
    assert installs and all("[test]" not in rest for rest in installs), "no test extras in the image"


def test_dockerfile_copies_only_what_the_build_context_lets_in() -> None:
    lines = (ROOT / ".dockerignore").read_text().splitlines()
    assert "*" in lines, "an allow-list context: everything is out unless named"
    allowed = [line[1:].rstrip("/") for line in lines if line.startswith("!")]
    sources = []
    for word, rest in dockerfile():
        if word == "COPY" and "--from=" not in rest:
            parts = [p for p in shlex.split(rest) if not p.startswith("--")]
            sources += parts[:-1]
    assert sources, "the Dockerfile copies the package"
    for source in sources:
        assert (ROOT / source).exists(), f"COPY {source}: no such path in the build context"
        assert source.rstrip("/") in allowed, f"COPY {source}: excluded by .dockerignore"
    for needed in ("pyproject.toml", "README.md", "src"):
        assert needed in sources, f"pip install . needs {needed}"


# -- compose ----------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def compose() -> dict:
    yaml = pytest.importorskip("yaml", reason="PyYAML (a dependency of litestar) parses compose.yaml")
    return yaml.safe_load((DEPLOY / "compose.yaml").read_text())


def nodes_of(compose: dict) -> dict[str, dict]:
    return {name: service for name, service in compose["services"].items()
            if str(service.get("environment", {}).get("AKRELAY_STORE", "")).startswith("redis://")}


def test_compose_runs_durable_redis_two_nodes_and_a_proxy(compose) -> None:
    services = compose["services"]
    redis = services["redis"]
    assert redis["image"].startswith("redis:")
    command = redis["command"]
    conf_mount = next(v for v in redis["volumes"] if v.startswith("./redis/redis.conf:"))
    assert conf_mount.split(":")[1] == command[1], "redis-server reads the mounted deploy/redis/redis.conf"
    assert redis_conf()["appendfsync"] == "always" and "--appendfsync" not in command
    assert "--dir" in command and any(v.split(":")[1] == command[command.index("--dir") + 1] for v in redis["volumes"])
    assert "healthcheck" in redis

    nodes = nodes_of(compose)
    assert len(nodes) == 2
    origins = {node["environment"]["AKRELAY_ORIGIN"] for node in nodes.values()}
    assert len(origins) == 1, "one deployment, one origin: the proxy's"
    data_volumes = set()
    for name, node in nodes.items():
        assert node["environment"]["AKRELAY_STORE"] == "redis://redis:6379/0"
        assert node["depends_on"]["redis"]["condition"] == "service_healthy"
        assert "/readyz" in " ".join(node["healthcheck"]["test"])
        data = [v.split(":")[0] for v in node["volumes"] if v.split(":")[1] == "/data"]
        assert len(data) == 1 and data[0] in compose["volumes"]
        data_volumes.add(data[0])
    assert len(data_volumes) == 2, "each node has a data volume of its own"

    proxy = services["proxy"]
    assert any(v.startswith("./proxy/nginx.conf:/etc/nginx/nginx.conf") for v in proxy["volumes"])
    published = interpolate(proxy["ports"][0]).split(":")
    assert published[-1] == "443"
    assert interpolate(origins.pop()) == f"https://localhost:{published[0]}", "the default origin is the proxy's address"
    for name in nodes:
        assert proxy["depends_on"][name]["condition"] == "service_healthy"
    for service in services.values():
        for volume in service.get("volumes", []):
            source = volume.split(":")[0]
            if source.startswith("./") and source != "./proxy/tls":
                assert (DEPLOY / source).is_file(), f"{volume}: no such file in deploy/"


def test_compose_node_settings_are_accepted_by_akrelay_serve(compose) -> None:
    entrypoint = json.loads(next(rest for word, rest in dockerfile() if word == "ENTRYPOINT"))
    for name, node in nodes_of(compose).items():
        env = {k: interpolate(str(v)) for k, v in node["environment"].items()}
        settings = serve_settings(entrypoint[1:] + list(node.get("command", [])), {"AKRELAY_DATA": "/data"} | env)
        assert settings.store == "redis://redis:6379/0", name
        assert settings.origin == "https://localhost:8443", name
        assert settings.write_rate == 0 and settings.read_rate == 0, "the proxy limits per client"


def test_the_proxy_balances_over_the_compose_nodes_and_verifies_them(compose) -> None:
    conf = (DEPLOY / "proxy" / "nginx.conf").read_text()
    upstream = re.search(r"upstream akrelay_nodes \{(.*?)\}", conf, re.S).group(1)
    servers = re.findall(r"^\s*server\s+([\w.-]+):(\d+)", upstream, re.M)
    assert sorted(servers) == sorted((name, str(NODE_PORT)) for name in nodes_of(compose))
    assert re.search(r"^\s*listen 443 ssl;", conf, re.M)
    assert re.search(r"^\s*proxy_ssl_verify on;", conf, re.M)
    assert "proxy_pass https://akrelay_nodes;" in conf
    mounts = {v.split(":")[1]: v.split(":")[0] for v in compose["services"]["proxy"]["volumes"]}
    trusted = re.search(r"proxy_ssl_trusted_certificate (\S+);", conf).group(1)
    assert mounts[str(Path(trusted).parent)] == "internal-tls"
    for node in nodes_of(compose).values():
        assert node["environment"]["AKRELAY_TLS_CERT"] == "/internal-tls/" + Path(trusted).name
    for directive in ("ssl_certificate", "ssl_certificate_key"):
        path = re.search(rf"^\s*{directive}\s+(\S+);", conf, re.M).group(1)
        assert mounts[str(Path(path).parent)] == "./proxy/tls"


# -- systemd ----------------------------------------------------------------------------------------


def unit(name: str) -> dict[str, list[str]]:
    values: dict[str, list[str]] = {}
    for line in (DEPLOY / "systemd" / name).read_text().splitlines():
        if "=" in line and not line.startswith(("#", ";")):
            key, _, value = line.partition("=")
            values.setdefault(key.strip(), []).append(value.strip())
    return values


def env_file(path: Path) -> dict[str, str]:
    return dict(line.split("=", 1) for line in path.read_text().splitlines()
                if line.strip() and not line.startswith("#"))


def test_systemd_node_unit_runs_akrelay_serve_hardened() -> None:
    service = unit("akrelay.service")
    (exec_start,) = service["ExecStart"]
    argv = shlex.split(exec_start)
    assert Path(argv[0]).name == "akrelay"
    assert service["EnvironmentFile"] == ["/etc/akrelay/akrelay.env"]
    env = env_file(DEPLOY / "systemd" / "akrelay.env.example")
    settings = serve_settings(argv[1:], env)
    assert settings.store.startswith("redis://")
    assert service["ProtectSystem"] == ["strict"] and service["NoNewPrivileges"] == ["yes"]
    assert settings.data in service["ReadWritePaths"][0].split()
    assert service["StateDirectory"] == [Path(settings.data).name]
    assert service["Restart"] == ["on-failure"] and service["TimeoutStopSec"]
    assert service.get("User", service.get("DynamicUser")), "a dedicated or dynamic user"


def test_systemd_redis_unit_uses_the_durable_conf() -> None:
    service = unit("akrelay-redis.service")
    (exec_start,) = service["ExecStart"]
    argv = shlex.split(exec_start)
    assert Path(argv[0]).name == "redis-server" and Path(argv[1]).name == "redis.conf"
    assert "--appendfsync" not in argv and "--appendonly" not in argv, "durability comes from redis.conf"
    directory = argv[argv.index("--dir") + 1]
    assert service["StateDirectory"] == [Path(directory).name]
    assert directory in service["ReadWritePaths"][0].split()


# -- local-cluster: what it checks before starting anything -----------------------------------------


def run_cluster(*args: str, timeout: float = 60) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(DEPLOY / "local-cluster"), *args], capture_output=True, text=True,
                          timeout=timeout)


def test_local_cluster_names_a_taken_port_and_starts_nothing(tmp_path) -> None:
    require_redis_server()
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        result = run_cluster("up", "--dir", str(tmp_path / "c"), "--redis-port", str(port), "--ports", "1,2")
    assert result.returncode == 2
    assert f"port {port} on 127.0.0.1 (redis-server) is already in use" in result.stderr
    assert "--redis-port" in result.stderr and "Traceback" not in result.stderr
    assert not (tmp_path / "c").exists(), "nothing was started or written"


def test_local_cluster_down_without_a_cluster_says_so(tmp_path) -> None:
    result = run_cluster("down", "--dir", str(tmp_path))
    assert result.returncode == 0 and "nothing to stop" in result.stdout

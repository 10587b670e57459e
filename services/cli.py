"""The ``kelvin`` command: every service and tool behind one CLI.

``kelvin run <service>`` starts one service as its container does; ``kelvin up``
runs all four in one process on the embedded defaults (the collect agent is
the MQTT endpoint, storage is SQLite under ``--data-dir``). Both need credentials
(docs/security.md): tokens not configured are generated once into
``<data dir>/auth/tokens.json`` and printed with the console address the first
time; ``--insecure`` runs open, and then only on loopback by default. Tool commands
(``query``, ``config``, ``csvimport``, ``allocator ...``, ``plugin ...``) are
registered by each service's ``cli`` module.

Exit codes: 0 success, 1 runtime failure, 2 bad configuration or usage, 130
interrupted (Ctrl-C), 141 the reader of the output went away (``| head``).
"""

from __future__ import annotations

import argparse
import asyncio
import importlib
import logging
import os
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from services.common import logs
from services.common.auth import (
    DEFAULT_TOKEN_FILE,
    AuthError,
    Role,
    Tokens,
    is_hashed,
    is_loopback,
    resolve_tokens,
)
from services.common.auth_settings import load_auth
from services.common.cli_util import FreshPaths, mark_leaves, parse, quiet_stdout
from services.common.config import Config, LoggingSettings
from services.common.errors import ConfigError, KelvinError, PortInUseError
from services.common.net import Listener, check_free
from services.common.service import Service, install_stop_signals, run_services

log = logging.getLogger("kelvin")

SERVICES: dict[str, str] = {
    "collect-agent": "services.collect_agent.app",
    "query-api": "services.query_api.app",
    "allocator": "services.allocator.app",
    "pusher": "services.pusher.app",
    "slurm-bridge": "services.slurm_bridge.app",
}
"""CLI name -> module with ``create_service(config) -> Service``, in ``kelvin up`` start order."""

UP_WHEN_CONFIGURED = {"slurm-bridge": "slurm_bridge"}
"""Services ``kelvin up`` starts only when the configuration has their section."""

SECTIONS = {
    "storage", "logging", "auth", "collect_agent", "query_api", "allocator", "pusher",
    "slurm_bridge",
}  # fmt: skip
HTTP_SECTIONS = ("collect_agent", "query_api", "allocator", "pusher", "slurm_bridge")

TOOL_MODULES = (
    "services.query_api.cli",
    "services.query_api.cli_jobs",
    "services.allocator.cli",
    "services.slurm_bridge.cli",
    "services.pusher.cli",
    "services.collect_agent.cli",
    "services.common.storage.cli",
)
"""Modules exposing ``register(subparsers, groups)`` to add tool commands."""


def _service_flags(p: argparse.ArgumentParser, up: bool) -> None:
    g = p.add_argument_group("configuration")
    g.add_argument(
        "--config", metavar="FILE", type=Path, help="YAML configuration file (all services)"
    )
    g.add_argument(
        "--data-dir",
        metavar="DIR",
        type=Path,
        help="where SQLite, the spool and allocator state live",
    )
    g.add_argument(
        "--host",
        help="bind address (default 127.0.0.1 for 'up'; for 'run' 0.0.0.0, or 127.0.0.1 "
        "with --insecure)",
    )
    g.add_argument(
        "--insecure",
        action="store_true",
        help="no credentials at all (auth.mode: none): anyone who can connect may change "
        "anything; logs a warning and the console shows a banner",
    )
    g.add_argument(
        "--mqtt-port", type=int, metavar="PORT", help="collect agent MQTT port (default 1883)"
    )
    g.add_argument(
        "--collect-agent-port",
        type=int,
        metavar="PORT",
        help="collect agent HTTP port (default 8081)",
    )
    g.add_argument(
        "--pusher-port", type=int, metavar="PORT", help="pusher HTTP port (default 8082)"
    )
    g.add_argument(
        "--query-api-port", type=int, metavar="PORT", help="query API HTTP port (default 8080)"
    )
    g.add_argument(
        "--allocator-port", type=int, metavar="PORT", help="allocator HTTP port (default 8083)"
    )
    g.add_argument(
        "--slurm-bridge-port",
        type=int,
        metavar="PORT",
        help="Slurm bridge HTTP port (default 8084)",
    )
    g.add_argument("--log-level", choices=["DEBUG", "INFO", "WARNING", "ERROR"], help="log level")
    if up:
        g.add_argument(
            "--demo",
            action="store_true",
            help="simulated hall + job stream: the allocator places jobs, the pusher measures the hall",
        )
        g.add_argument(
            "--policy", help="allocation policy for --demo (mpit, mc1x1, joint, first-fit, random)"
        )
        g.add_argument("--seed", type=int, help="job-stream seed for --demo")


def build_config(args: argparse.Namespace, profile: str) -> Config:
    """Map CLI flags onto the settings of every service they concern."""
    cfg = Config(args.config)
    cfg.check_sections(SECTIONS)
    cfg.profile = profile
    if args.insecure:
        cfg.set("auth", "mode", "none", "--insecure")
    insecure = load_auth(cfg).insecure
    host = args.host or ("127.0.0.1" if profile in ("up", "demo") else None)
    if host:
        for sec in HTTP_SECTIONS:
            cfg.set(sec, "host", host, "--host")
    elif insecure:
        # Open services stay on loopback unless a bind address is configured on purpose.
        for sec in HTTP_SECTIONS:
            if not _host_configured(cfg, sec):
                cfg.set(sec, "host", "127.0.0.1", "--insecure")
    loop_host = "127.0.0.1" if host in (None, "0.0.0.0", "::") else host
    if args.data_dir:
        d = Path(args.data_dir)
        cfg.set("auth", "token_file", str(d / "auth" / "tokens.json"), "--data-dir")
        cfg.set(
            "storage",
            "sqlite",
            {**cfg.section("storage").get("sqlite", {}), "path": str(d / "kelvin.sqlite")},
            "--data-dir",
        )
        cfg.set("collect_agent", "spool_dir", str(d / "spool"), "--data-dir")
        cfg.set("allocator", "state_dir", str(d / "allocator"), "--data-dir")
        cfg.set("pusher", "state_dir", str(d / "pusher"), "--data-dir")
    if args.mqtt_port is not None:
        cfg.set("collect_agent", "mqtt_port", args.mqtt_port, "--mqtt-port")
        cfg.set("pusher", "brokers", [f"{loop_host}:{args.mqtt_port}"], "--mqtt-port")
        cfg.set("allocator", "brokers", [f"{loop_host}:{args.mqtt_port}"], "--mqtt-port")
    if args.collect_agent_port is not None:
        cfg.set("collect_agent", "port", args.collect_agent_port, "--collect-agent-port")
        cfg.set(
            "query_api",
            "collect_agent_url",
            f"http://{loop_host}:{args.collect_agent_port}",
            "--collect-agent-port",
        )
    if args.pusher_port is not None:
        cfg.set("pusher", "port", args.pusher_port, "--pusher-port")
    if args.query_api_port is not None:
        cfg.set("query_api", "port", args.query_api_port, "--query-api-port")
        cfg.set(
            "allocator",
            "query_api_url",
            f"http://{loop_host}:{args.query_api_port}",
            "--query-api-port",
        )
    if args.allocator_port is not None:
        cfg.set("allocator", "port", args.allocator_port, "--allocator-port")
        for client in ("query_api", "pusher", "slurm_bridge"):
            url = f"http://{loop_host}:{args.allocator_port}"
            cfg.set(client, "allocator_url", url, "--allocator-port")
    if args.slurm_bridge_port is not None:
        cfg.set("slurm_bridge", "port", args.slurm_bridge_port, "--slurm-bridge-port")
    if args.log_level:
        cfg.set("logging", "level", args.log_level, "--log-level")
    if getattr(args, "policy", None):
        cfg.set("allocator", "policy", args.policy, "--policy")
    if getattr(args, "seed", None) is not None:
        cfg.set("allocator", "demo_seed", args.seed, "--seed")
    return cfg


def _configured(cfg: Config, section: str, key: str) -> bool:
    """Whether ``section.key`` is set in the file, by a flag or in the environment."""
    return (
        key in cfg.section(section)
        or key in cfg.overrides.get(section, {})
        or f"KELVIN_{section.upper()}_{key.upper()}" in os.environ
    )


def _host_configured(cfg: Config, section: str) -> bool:
    return _configured(cfg, section, "host")


MQTT_LOGINS: dict[str, tuple[Role, str]] = {
    "pusher": (Role.WRITE, "kelvin-pusher"),
    "allocator": (Role.ADMIN, "kelvin-allocator"),
}
"""``kelvin up``'s publishers: the token each logs in to the collect agent's MQTT endpoint
with (the allocator's job records need more than ``write``), and its user name."""


def mqtt_logins(cfg: Config, tokens: Tokens) -> None:
    """Under ``kelvin up`` the collect agent's MQTT endpoint takes logins only (tokens
    exist): its own pusher and allocator log in with their role's token as the password
    (docs/mqtt.md), unless a password (or password file) is configured for them."""
    for section, (role, user) in MQTT_LOGINS.items():
        token = tokens.by_role.get(role)
        if not token or is_hashed(token):  # a verifier is no password to send
            continue
        if _configured(cfg, section, "mqtt_password") or _configured(
            cfg, section, "mqtt_password_file"
        ):
            continue
        if not _configured(cfg, section, "mqtt_username"):
            cfg.set(section, "mqtt_username", user)
        cfg.set(section, "mqtt_password", token)


def prepare_auth(cfg: Config, names: Sequence[str]) -> Tokens | None:
    """Resolve the tokens once before the services start (creating the token file the
    first time, so every service of this data directory shares one set); warn about an
    open service bound beyond loopback."""
    auth = load_auth(cfg)
    if auth.insecure:
        for name in names:
            sec = name.replace("-", "_")
            host = str(cfg.overrides.get(sec, {}).get("host") or cfg.section(sec).get("host") or "")
            if host and not is_loopback(host):
                log.warning(
                    "%s binds %s with auth.mode 'none': anyone on that network may read, "
                    "write and change everything",
                    name,
                    host,
                )
        return None
    try:
        return resolve_tokens(auth)
    except AuthError as exc:
        raise ConfigError(str(exc)) from None


def _create(name: str, cfg: Config) -> Service:
    module = importlib.import_module(SERVICES[name])
    svc: Service = module.create_service(cfg)
    return svc


def check_ports(names: Sequence[str], cfg: Config) -> None:
    """Every port the services will listen on, checked at once before anything is created:
    one message naming each taken port and the flag that moves it."""
    found: list[Listener] = []
    for name in names:
        listeners = getattr(importlib.import_module(SERVICES[name]), "listeners", None)
        if listeners is not None:
            found += listeners(cfg)
    check_free(found)


async def _serve(
    names: Sequence[str], cfg: Config, tokens: Tokens | None, announced: list[bool]
) -> None:
    stop = asyncio.Event()
    install_stop_signals(stop)
    services = [_create(n, cfg) for n in names]

    def started() -> None:
        announced.append(True)
        _announce(services, cfg, tokens)

    # A stop that hangs ends this process with status 1 (and the stacks), never hangs it.
    await run_services(services, stop, started, exit_when_stuck=True)


def _announce(services: Sequence[Service], cfg: Config, tokens: Tokens | None = None) -> None:
    """Tell the user where to point the browser and how to authenticate (stdout, once all
    are up). Generated tokens are printed this once; later starts name their file."""
    if cfg.profile == "run":
        lines = [f"kelvin run {services[0].name}: running."]
    else:
        what = "demo (simulated hall, seeded job stream)" if cfg.profile == "demo" else "up"
        lines = [f"kelvin {what}: every service is running."]
    for s in sorted(services, key=lambda s: s.name != "query-api"):
        url = _url(s)
        if url:
            lines.append(f"  {'console' if s.name == 'query-api' else s.name:<14} {url}")
    lines += _auth_lines(cfg, tokens)
    print("\n".join([*lines, "Stop with Ctrl-C."]), flush=True)


def _auth_lines(cfg: Config, tokens: Tokens | None) -> list[str]:
    auth = load_auth(cfg)
    if auth.insecure:
        return ["  auth           OFF (--insecure): anyone who can connect may change anything"]
    if tokens is None:
        return []
    if tokens.generated:
        return [
            f"  auth           tokens generated into {tokens.file} (shown this once):",
            *(f"    {r.value:<6} {tokens.by_role[r]}" for r in Role),
            "  (send one as 'Authorization: Bearer <token>'; the console asks for it)",
        ]
    where = f"in {tokens.file}" if tokens.file else "from the configuration"
    return [f"  auth           tokens {where} (read, write, admin)"]


def _url(svc: Service) -> str | None:
    """Where a service answers: the address its HTTP server bound (a wildcard as loopback)."""
    port = getattr(svc, "port", None)
    if not port:
        return None
    host = getattr(getattr(svc, "http", None), "host", None) or "127.0.0.1"
    host = "127.0.0.1" if host in ("0.0.0.0", "::") else f"[{host}]" if ":" in host else host
    return f"http://{host}:{port}/"


def _cmd_run(args: argparse.Namespace) -> int:
    cfg = build_config(args, "run")
    return _start([args.service], cfg)


def _cmd_up(args: argparse.Namespace) -> int:
    cfg = build_config(args, "demo" if args.demo else "up")
    names = [
        n for n in SERVICES if n not in UP_WHEN_CONFIGURED or UP_WHEN_CONFIGURED[n] in cfg.data
    ]
    return _start(names, cfg)


def _start(names: Sequence[str], cfg: Config) -> int:
    logset = cfg.load(LoggingSettings)
    logs.setup(logset.level, logset.json_format)
    try:
        check_ports(names, cfg)
    except PortInUseError as exc:
        print(f"kelvin: {exc}", file=sys.stderr)
        return 1
    fresh = FreshPaths(_data_paths(names, cfg))
    tokens = prepare_auth(cfg, names)
    if tokens is not None and cfg.profile in ("up", "demo"):
        mqtt_logins(cfg, tokens)
    announced: list[bool] = []
    try:
        asyncio.run(_serve(names, cfg, tokens, announced))
    except BaseException as exc:
        if not announced:  # it never ran: take back what this start created
            fresh.remove(tokens.file if tokens is not None and tokens.generated else None)
        if isinstance(exc, PortInUseError):
            print(f"kelvin: {exc}", file=sys.stderr)
            return 1
        raise
    return 0


STATE = {
    "collect-agent": ("services.collect_agent.settings", ("spool_dir",)),
    "allocator": ("services.allocator.settings", ("state_dir",)),
    "pusher": ("services.pusher.settings", ("state_dir",)),
}
"""Per service: its settings module and the directories it keeps state in."""


def _data_paths(names: Sequence[str], cfg: Config) -> list[Path]:
    """Where a start may create files: the token file, state directories, the database."""
    paths = [load_auth(cfg).token_file or DEFAULT_TOKEN_FILE]
    for name in names:
        module, keys = STATE.get(name, ("", ()))
        if module:
            settings = cfg.load(importlib.import_module(module).Settings)
            paths += [Path(getattr(settings, k)) for k in keys]
        if name in ("collect-agent", "query-api"):
            from services.common.storage.settings import StorageSettings

            storage = cfg.load(StorageSettings)
            if storage.backend == "sqlite":
                paths.append(storage.sqlite.path)
    return paths


def build_parser(tools: bool = True) -> argparse.ArgumentParser:
    """The ``kelvin`` parser; ``tools=False`` leaves out the tool commands.

    ``kelvin run``/``up`` build it without tools so a pusher on a compute node
    never imports the other services' command modules (~7 MB of RSS).
    """
    parser = argparse.ArgumentParser(
        prog="kelvin",
        description="Kelvin: holistic HPC data-center monitoring and thermal-aware job placement.",
    )
    parser.add_argument("--version", action=_VersionAction)
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)

    run = sub.add_parser(
        "run", help="run one service (as its container does)", description="Run one Kelvin service."
    )
    run.add_argument("service", choices=list(SERVICES), help="which service")
    _service_flags(run, up=False)
    run.set_defaults(func=_cmd_run)

    up = sub.add_parser(
        "up",
        help="run every service in one process on the embedded defaults",
        description="Run pusher, collect agent (as MQTT endpoint), query API and allocator in one "
        "process with SQLite storage under --data-dir.",
    )
    _service_flags(up, up=True)
    up.set_defaults(func=_cmd_up)

    groups: dict[str, argparse._SubParsersAction[argparse.ArgumentParser]] = {}
    for mod_name in TOOL_MODULES if tools else ():
        try:
            mod = importlib.import_module(mod_name)
        except ModuleNotFoundError as exc:
            if exc.name == mod_name:
                continue
            raise
        register: Callable[[Any, dict[str, Any]], None] = mod.register
        register(sub, groups)
    return parser


class _VersionAction(argparse.Action):
    """``--version``, with the version looked up only when asked: importlib.metadata costs
    every other command (a pusher on a compute node among them) ~3 MB and 10 ms."""

    def __init__(self, option_strings: Sequence[str], dest: str = argparse.SUPPRESS) -> None:
        super().__init__(
            option_strings, dest, nargs=0, default=argparse.SUPPRESS, help="show the version"
        )

    def __call__(self, parser: argparse.ArgumentParser, *args: Any) -> None:
        print(f"kelvin {_version()}")
        parser.exit()


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("kelvin")
    except PackageNotFoundError:
        return "0+unknown"


EXIT_INTERRUPTED = 130
EXIT_BROKEN_PIPE = 141
"""128 + SIGPIPE: what a shell reports for a Unix tool whose reader went away."""


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser(tools=not (argv and argv[0] in ("run", "up")))
    mark_leaves(parser)
    args = parse(parser, argv)
    try:
        rc = args.func(args)
        sys.stdout.flush()  # a reader gone away shows here, not at interpreter exit
    except ConfigError as exc:
        print(f"kelvin: configuration error: {exc}", file=sys.stderr)
        return 2
    except KelvinError as exc:
        print(f"kelvin: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return EXIT_INTERRUPTED
    except BrokenPipeError:
        quiet_stdout()
        return EXIT_BROKEN_PIPE
    except OSError as exc:  # a file named on the command line: missing, unreadable, ...
        where = f"{exc.filename}: " if exc.filename else ""
        print(f"kelvin: {where}{exc.strerror or exc}", file=sys.stderr)
        return 1
    return int(rc or 0)


if __name__ == "__main__":
    sys.exit(main())

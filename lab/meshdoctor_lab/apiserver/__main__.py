"""CLI: serve a lab's pods until SIGTERM/SIGINT, then end every process it started and exit 0.

    python -m meshdoctor_lab.apiserver --state STATE_JSON --kubeconfig OUT_PATH [--host H] [--port P]
        [--no-tls]

HTTPS with a CA made for this run is the default (tls.py says why); `--no-tls` serves plain HTTP, which only the
Python client accepts a token over.

The kubeconfig is written (atomically) only once the socket is bound: its existence means ready.
Exit codes: 0 after a signal, 2 on a bad state file or a port that cannot be bound.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import secrets
import signal
import sys
import tempfile
from pathlib import Path

from aiohttp import web

from .routes import LabApiServer
from .kubeconfig import kubeconfig_dict, write_kubeconfig
from .objects import LabConfig
from .tls import TlsMaterial, make_tls


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m meshdoctor_lab.apiserver", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--state", required=True, type=Path, help="the lab's state.json")
    p.add_argument("--kubeconfig", required=True, type=Path, help="where to write the kubeconfig")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=0, help="0 = any free port")
    p.add_argument("--token", default=None, help="bearer token (default: random)")
    p.add_argument("--tls", action=argparse.BooleanOptionalAction, default=True,
                   help="serve HTTPS with a CA made for this run (default; kubectl sends no token over plain HTTP)")
    return p.parse_args(argv)


async def serve(args: argparse.Namespace) -> int:
    try:
        config = LabConfig.load(args.state)
    except (OSError, ValueError, KeyError, TypeError) as exc:
        print(f"apiserver: cannot read state {args.state}: {exc}", file=sys.stderr)
        return 2
    token = args.token or secrets.token_urlsafe(32)
    with tempfile.TemporaryDirectory(prefix="meshdoctor-apiserver-") as tmp:
        tls: TlsMaterial | None = None
        if args.tls:
            try:
                tls = make_tls(Path(tmp), args.host)
            except RuntimeError as exc:
                print(f"apiserver: {exc}", file=sys.stderr)
                return 2
        return await _serve(args, config, token, tls)


async def _serve(args: argparse.Namespace, config: LabConfig, token: str, tls: TlsMaterial | None) -> int:
    server = LabApiServer(config, token)
    await server.start()
    runner = web.AppRunner(server.app, access_log=None, shutdown_timeout=2.0, handle_signals=False)
    await runner.setup()
    site = web.TCPSite(runner, args.host, args.port, ssl_context=tls.context if tls else None)
    try:
        await site.start()
    except OSError as exc:
        print(f"apiserver: cannot listen on {args.host}:{args.port}: {exc}", file=sys.stderr)
        await runner.cleanup()
        await server.shutdown()
        return 2
    host, port = runner.addresses[0][:2]
    url_host = f"[{host}]" if ":" in host else host
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    scheme = "https" if tls else "http"
    write_kubeconfig(args.kubeconfig, kubeconfig_dict(f"{scheme}://{url_host}:{port}", token, config.namespace,
                                                      cluster=config.name, ca_pem=tls.ca_pem if tls else None))
    logging.getLogger("meshdoctor.apiserver").info(
        "serving %d pod(s) of namespace %s on %s://%s:%d", len(config.pods), config.namespace, scheme, url_host,
        port)
    await stop.wait()
    logging.getLogger("meshdoctor.apiserver").info("stopping: ending every process started")
    await server.shutdown()
    await runner.cleanup()
    return 0


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    logging.basicConfig(stream=sys.stderr, level=logging.INFO, format="%(asctime)s apiserver %(message)s")
    return asyncio.run(serve(args))


if __name__ == "__main__":
    sys.exit(main())

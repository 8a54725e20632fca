"""``rightsizer serve``: the webhook Lambda handler behind a local HTTP server."""

from __future__ import annotations

import argparse
import logging
from typing import Any

from rightsizer.cli.common import EXIT_OK, port_arg
from rightsizer.config import load_config

log = logging.getLogger("rightsizer")


def cmd_serve(args: argparse.Namespace) -> int:
    """``rightsizer serve``: answer Alertmanager webhooks on 127.0.0.1 until interrupted (Ctrl-C)."""
    from rightsizer.localserve import build_webhook_server

    config = load_config(args.config)
    server = build_webhook_server(config, port=args.port, execute=args.execute)
    log.info("serve: Alertmanager webhook on %s (%s)", server.url, "execute" if args.execute else "dry run")
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        log.info("serve: interrupted")
    finally:
        server.server_close()
    return EXIT_OK


def add_parsers(sub: Any) -> None:
    """Register ``serve``."""
    w = sub.add_parser("serve", help="the webhook handler behind a local HTTP server (127.0.0.1)")
    w.add_argument(
        "--config",
        metavar="FILE",
        required=True,
        help="the config file (docs/policy.md: 'Configuration file')",
    )
    w.add_argument(
        "--port", type=port_arg, default=8080, metavar="N", help="TCP port (default 8080; 0 = any free)"
    )
    w.add_argument("--execute", action="store_true", help="act for real (default: dry run)")
    w.set_defaults(func=cmd_serve)

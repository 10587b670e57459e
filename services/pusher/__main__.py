"""``python -m services.pusher [flags]``: the pusher alone, as ``kelvin run pusher`` does.

Same flags and configuration; the difference is what gets imported: ``kelvin``
loads every service's command-line tools to build its parser (~7 MB of RSS),
this entry point only the pusher. For the DaemonSet on every compute node.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from services import cli
from services.common.errors import ConfigError, KelvinError


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m services.pusher", description="Run the Kelvin pusher."
    )
    cli._service_flags(parser, up=False)
    args = parser.parse_args(argv)
    try:
        return cli._start(["pusher"], cli.build_config(args, "run"))
    except ConfigError as exc:
        print(f"kelvin: configuration error: {exc}", file=sys.stderr)
        return 2
    except KelvinError as exc:
        print(f"kelvin: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())

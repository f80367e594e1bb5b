"""Starts the Dagster UI (webserver + daemon) on 127.0.0.1 with a DAGSTER_HOME under the project.

``python -m scripts.ui [--home .dagster_home] [--data .data/dagster] [--port 3000] [--workspace-yaml]``; the demo's
instance: ``--home .data/demo/dagster_home --data .data/demo/tables``. It runs ``dg dev`` (the project's
``[tool.dg]`` settings); ``--workspace-yaml`` runs ``dagster dev -w workspace.yaml`` instead. Both load the same
code location.

A shell that starts a program in the background with ``&`` makes it ignore SIGINT, and ``dagster dev`` then ignored
SIGTERM as well: both signals are reset to their defaults before the UI starts, so Ctrl-C and ``kill`` stop it.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
from pathlib import Path

from scripts.dagster_stack import LOG_LEVEL, PROJECT, dev_command, prepare_home


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--home", default=str(PROJECT / ".dagster_home"), help="DAGSTER_HOME (runs persist here)")
    ap.add_argument("--data", default=str(PROJECT / ".data" / "dagster"), help="root of the pipelines' Delta tables")
    ap.add_argument("--port", type=int, default=3000)
    ap.add_argument("--workspace-yaml", action="store_true", help="dagster dev -w workspace.yaml instead of dg dev")
    ap.add_argument(
        "--log-level",
        default=LOG_LEVEL,
        choices=["critical", "error", "warning", "info", "debug"],
        help="the services' console level (info adds two daemon lines per sensor tick)",
    )
    args = ap.parse_args()
    home = Path(args.home).resolve()
    prepare_home(home)
    os.environ["DAGSTER_HOME"] = str(home)
    os.environ["PHASES_DATA_ROOT"] = str(Path(args.data).resolve())
    os.environ["VIRTUAL_ENV"] = str(Path(sys.executable).parent.parent)  # dg: the project's venv is the active one
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, signal.SIG_DFL)  # an ignored signal stays ignored across exec
    print(f"Dagster UI on http://127.0.0.1:{args.port} (DAGSTER_HOME={home}, tables under {args.data})", flush=True)
    os.chdir(PROJECT)
    os.execv(*dev_command(args.port, args.workspace_yaml, args.log_level))


if __name__ == "__main__":
    main()

"""Starts the Dagster UI (webserver + daemon) on 127.0.0.1 with a DAGSTER_HOME under the project.

``python -m scripts.ui [--home .dagster_home] [--data .data/dagster] [--port 3000]``; the demo's instance:
``--home .data/demo/dagster_home --data .data/demo/tables``.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from scripts.dagster_stack import PROJECT, prepare_home


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--home", default=str(PROJECT / ".dagster_home"), help="DAGSTER_HOME (runs persist here)")
    ap.add_argument("--data", default=str(PROJECT / ".data" / "dagster"), help="root of the pipelines' Delta tables")
    ap.add_argument("--port", type=int, default=3000)
    args = ap.parse_args()
    home = Path(args.home).resolve()
    prepare_home(home)
    os.environ["DAGSTER_HOME"] = str(home)
    os.environ["PHASES_DATA_ROOT"] = str(Path(args.data).resolve())
    dagster = str(Path(sys.executable).with_name("dagster"))
    print(f"Dagster UI on http://127.0.0.1:{args.port} (DAGSTER_HOME={home}, tables under {args.data})", flush=True)
    os.chdir(PROJECT)
    os.execv(dagster, [dagster, "dev", "-w", "workspace.yaml", "-h", "127.0.0.1", "-p", str(args.port)])


if __name__ == "__main__":
    main()

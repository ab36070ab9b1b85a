#!/usr/bin/python3
"""One rank of the Gloo anchor (../shared/peers/allreduce_gloo.py) on a host of its own.

The anchor spawns its ranks on one host, with 127.0.0.1 as the rendezvous. allreduce_bench
--network_hosts runs each rank on a simulated host instead (a network namespace), so this
runs the anchor's own `run(rank, n)`, unchanged, with the rendezvous that the environment
names (MASTER_ADDR, MASTER_PORT; GLOO_SOCKET_IFNAME for the host's interface): the anchor's
setting of 127.0.0.1 is left out, nothing else.

Usage: gloo_rank.py ANCHOR_SCRIPT RANK NPROCS
"""
import importlib.util
import os
import sys
import types


class _KeepSetEnviron:
    """os.environ whose update() leaves the variables already set as they are."""

    def update(self, **values):
        for key, value in values.items():
            os.environ.setdefault(key, value)


def main():
    script, rank, n = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    spec = importlib.util.spec_from_file_location("allreduce_gloo_anchor", script)
    anchor = importlib.util.module_from_spec(spec)
    # Registered, so that what RPC pickles by this name (the anchor's functions) is found.
    sys.modules[spec.name] = anchor
    spec.loader.exec_module(anchor)
    anchor.os = types.SimpleNamespace(environ=_KeepSetEnviron())
    anchor.run(rank, n)


if __name__ == "__main__":
    main()

#!/usr/bin/python3
"""One rank of the PyTorch RPC parameter-server anchor (../shared/peers/ps_torch_rpc.py or
ps_embedding_torch_rpc.py's kind: a module with run(rank, ..., q)) on a host of its own.

The anchor spawns its PS and workers on one host, with 127.0.0.1 as the rendezvous, and
gathers the workers' (updates, seconds) through a multiprocessing queue. ps_bench
--network_hosts runs each rank on a simulated host instead (a network namespace), so this
runs the anchor's own `run`, unchanged, with the rendezvous that the environment names
(MASTER_ADDR, MASTER_PORT; TP_SOCKET_IFNAME for TensorPipe's interface), and prints what a
worker would have queued as one line: "updates=N seconds=T". TensorPipe is held to what it
has between machines, TCP (its "uv" transport and "basic" channel): on one host its CMA and
shared-memory channels would move the tensors between the namespaces without the network.
The anchor's setting of 127.0.0.1 is left out, nothing else.

Usage: torch_rpc_rank.py ANCHOR_SCRIPT RANK ARGS...   (ARGS: what run takes after rank, but q)
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


class _PrintingQueue:
    def put(self, result):
        updates, seconds = result
        print(f"updates={updates} seconds={seconds}", flush=True)


def _number(text):
    return float(text) if "." in text else int(text)


def main():
    script, rank = sys.argv[1], int(sys.argv[2])
    args = [_number(a) for a in sys.argv[3:]]
    spec = importlib.util.spec_from_file_location("torch_rpc_anchor", script)
    anchor = importlib.util.module_from_spec(spec)
    # Registered, so that what RPC pickles by this name (the anchor's functions) is found.
    sys.modules[spec.name] = anchor
    spec.loader.exec_module(anchor)
    anchor.os = types.SimpleNamespace(environ=_KeepSetEnviron())
    rpc = anchor.rpc

    def tcp_only_options(*args, **kwargs):
        kwargs.setdefault("_transports", ["uv"])
        kwargs.setdefault("_channels", ["basic"])
        return rpc.TensorPipeRpcBackendOptions(*args, **kwargs)

    anchor.rpc = types.SimpleNamespace(
        TensorPipeRpcBackendOptions=tcp_only_options,
        init_rpc=rpc.init_rpc,
        rpc_sync=rpc.rpc_sync,
        shutdown=rpc.shutdown,
    )
    anchor.run(rank, *args, _PrintingQueue())


if __name__ == "__main__":
    main()

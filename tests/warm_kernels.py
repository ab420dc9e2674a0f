"""Jupyter kernels forked from one warm process, for the tutorial tests.

A fresh kernel spends most of a tiny tutorial importing torch, transformers and
TransformerLens (about 8 of 10-20 CPU-seconds). Here one server process imports them once;
each kernel is a ``fork()`` of it that then starts ipykernel as a fresh kernel does, with the
notebook's environment and folder. Each notebook still runs in its own process, from freshly
imported modules that no other notebook touched; what it shares with the others is only what
the server did before forking: the imports below, and one torch thread.

Jupyter starts the kernel spec's command, :func:`client`: a stdlib-only process that hands the
server its connection file, folder, environment and standard streams (``SCM_RIGHTS``), relays
signals to the forked kernel and exits with its status, so Jupyter's process handling
(interrupt, shutdown, kill) works unchanged. A client that dies takes its kernel with it.

``python warm_kernels.py server SOCKET`` / ``python warm_kernels.py client SOCKET CONNECTION``.
"""

from __future__ import annotations

import json
import os
import selectors
import signal
import socket
import struct
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

#: Most bytes of the request (connection file, folder, environment).
MAX_REQUEST = 1 << 20


def _send(sock: socket.socket, data: dict, fds: list[int] | None = None) -> None:
    payload = json.dumps(data).encode()
    socket.send_fds(sock, [struct.pack("!I", len(payload)) + payload], fds or [])


def _receive(sock: socket.socket, nfds: int = 0) -> tuple[dict, list[int]]:
    head, fds, _, _ = socket.recv_fds(sock, MAX_REQUEST, nfds)
    if len(head) < 4:
        raise EOFError("the peer closed the socket")
    size = struct.unpack("!I", head[:4])[0]
    payload = head[4:]
    while len(payload) < size:
        more = sock.recv(size - len(payload))
        if not more:
            raise EOFError("the peer closed the socket mid-message")
        payload += more
    return json.loads(payload), list(fds)


def client(path: str, connection_file: str) -> int:
    """The kernel spec's command: one forked kernel, returning its exit status."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.connect(path)
    _send(sock, {"connection_file": connection_file, "cwd": os.getcwd(),
                 "env": dict(os.environ)}, [0, 1, 2])
    pid = _receive(sock)[0]["pid"]
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGQUIT, signal.SIGUSR1):
        signal.signal(sig, lambda s, _f: os.kill(pid, s))
    while True:
        try:
            return int(_receive(sock)[0]["status"])
        except InterruptedError:
            continue


def _kernel(request: dict, fds: list[int]) -> None:
    """In the forked child: become the kernel Jupyter asked for; never returns."""
    status = 1
    try:
        for target, fd in enumerate(fds):
            os.dup2(fd, target)
            os.close(fd)
        os.chdir(request["cwd"])
        os.environ.clear()
        os.environ.update(request["env"])
        import random

        random.seed()  # a fresh process's own seed, not the server's state
        from ipykernel.kernelapp import IPKernelApp

        sys.argv = ["ipykernel_launcher", "-f", request["connection_file"]]
        IPKernelApp.launch_instance(argv=sys.argv[1:])
        status = 0
    except SystemExit as exc:
        status = exc.code if isinstance(exc.code, int) else 0
    finally:
        os._exit(status)


def server(path: str) -> None:
    """Import once, then fork one kernel per client until the socket is removed."""
    import ipykernel.kernelapp  # noqa: F401
    import plotly.graph_objects  # noqa: F401
    import sae_lens  # noqa: F401
    import torch
    import transformer_lens  # noqa: F401
    import transformers.modeling_utils  # noqa: F401

    import tl_reward.analysis  # noqa: F401
    import tl_reward.model  # noqa: F401

    torch.set_num_threads(1)
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(path)
    listener.listen()
    selector = selectors.DefaultSelector()
    selector.register(listener, selectors.EVENT_READ)
    kernels: dict[int, socket.socket] = {}  # pid -> its client's socket
    print("ready", flush=True)
    while Path(path).exists():
        for key, _ in selector.select(timeout=0.05):
            if key.fileobj is listener:
                conn, _ = listener.accept()
                request, fds = _receive(conn, 3)
                pid = os.fork()
                if pid == 0:
                    listener.close()
                    conn.close()
                    _kernel(request, fds)
                for fd in fds:
                    os.close(fd)
                kernels[pid] = conn
                _send(conn, {"pid": pid})
                selector.register(conn, selectors.EVENT_READ, pid)
            elif not key.fileobj.recv(1):  # the client died: so does its kernel
                selector.unregister(key.fileobj)
                try:
                    os.kill(key.data, signal.SIGKILL)
                except ProcessLookupError:
                    pass
        while kernels:
            pid, status = os.waitpid(-1, os.WNOHANG)
            if pid == 0:
                break
            conn = kernels.pop(pid)
            try:
                selector.unregister(conn)
            except KeyError:
                pass
            try:
                _send(conn, {"status": os.waitstatus_to_exitcode(status)})
            except OSError:
                pass
            conn.close()
    for pid in kernels:  # the server is told to stop: no kernel outlives it
        os.kill(pid, signal.SIGKILL)


@contextmanager
def warm_kernels(folder: Path, env: dict[str, str]) -> Iterator[Callable[[], object]]:
    """Start a server (``env``: the kernels' shared environment; each notebook's own goes
    with its start) and yield a factory of ``AsyncKernelManager`` s whose kernels fork from it.
    A client given one of them does not own it: shut its kernel down when done."""
    import subprocess

    from jupyter_client import AsyncKernelManager
    from jupyter_client.kernelspec import KernelSpecManager

    path = str(folder / "warm.sock")
    spec = folder / "kernels" / "warm"
    spec.mkdir(parents=True)
    spec.joinpath("kernel.json").write_text(json.dumps({
        "argv": [sys.executable, "-I", __file__, "client", path, "{connection_file}"],
        "display_name": "Python 3 (forked warm)", "language": "python",
        "interrupt_mode": "signal"}))
    proc = subprocess.Popen([sys.executable, __file__, "server", path], env=env,
                            stdout=subprocess.PIPE, text=True)
    try:
        if proc.stdout.readline().strip() != "ready":
            raise RuntimeError(f"the warm kernel server did not start (exit {proc.wait()})")
        specs = KernelSpecManager(kernel_dirs=[str(folder / "kernels")])
        yield lambda: AsyncKernelManager(kernel_name="warm", kernel_spec_manager=specs)
    finally:
        Path(path).unlink(missing_ok=True)
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()


if __name__ == "__main__":
    if sys.argv[1] == "server":
        server(sys.argv[2])
    else:
        sys.exit(client(sys.argv[2], sys.argv[3]))

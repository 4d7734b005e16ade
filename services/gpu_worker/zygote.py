"""The zygote: a process that has imported torch and forks each system's worker (`local.py`), which
saves every worker that import — seconds on a CPU, where a round starts a few dozen workers.

    python -m specpilot.services.gpu_worker.zygote FD

It serves one parent over the UNIX socket FD (SOCK_SEQPACKET: a message each): a request is one
JSON object {"argv", "env", "cwd"} with three file descriptors (the worker's stdin, stdout and
stderr); it forks, answers {"pid"}, and
the child runs `local.main(argv)` there, in `cwd`, with `env` — the parent's of the moment, not the
zygote's. Children are reaped by the kernel (SIGCHLD ignored); the zygote exits when its parent
closes the socket. It imports nothing of the engine, so a worker may still load a worktree's.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import sys
import traceback

import torch  # noqa: F401 — the import every worker is spared


def child(argv: list[str], env: dict, cwd: str) -> int:
    os.chdir(cwd)
    sys.path[0] = cwd  # where `python -m` started in `cwd` looks first
    os.environ.clear()
    os.environ.update(env)
    sys.stdin, sys.stdout, sys.stderr = open(0), open(1, "w"), open(2, "w")
    try:
        from . import local

        return local.main(argv)
    except SystemExit as e:
        return e.code if isinstance(e.code, int) else 1
    except BaseException:  # noqa: BLE001 — the worker's stderr gets the traceback, as a fresh process's would
        traceback.print_exc()
        return 1
    finally:
        sys.stdout.flush()
        sys.stderr.flush()


def serve(sock: socket.socket) -> None:
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the parent's to handle; it closes the socket
    while True:
        msg, fds, _, _ = socket.recv_fds(sock, 1 << 20, 3)
        if not msg:
            return
        req = json.loads(msg)
        pid = os.fork()
        if pid == 0:
            code = 1
            try:
                sock.close()
                signal.signal(signal.SIGCHLD, signal.SIG_DFL)
                signal.signal(signal.SIGINT, signal.default_int_handler)
                for fd, target in zip(fds, (0, 1, 2)):
                    os.dup2(fd, target)
                    os.close(fd)
                code = child(req["argv"], req["env"], req["cwd"])
            finally:
                os._exit(code)
        for fd in fds:
            os.close(fd)
        sock.send(json.dumps({"pid": pid}).encode())


if __name__ == "__main__":
    serve(socket.socket(fileno=int(sys.argv[1])))

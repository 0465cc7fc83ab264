"""The deployed shared store's password stays off the command line.

Used by chart-check.py on a rendered Valkey Deployment: no argument of the
container names the password or its variable, and, when valkey-server or
redis-server is on PATH, the container's command and args are run as the
kubelet would run them (`$$` reduced to `$`, the password in the
environment): the server must ask for the password, accept it (one with a
space, quotes, a backslash and a dollar sign), and no process's command
line may hold it.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import tempfile
import time
from pathlib import Path

PASSWORD = "s3cret pa\"ss\\w$rd'x"


def kubelet_expand(arg: str, env: dict[str, str]) -> str:
    """`$(NAME)` of a defined variable replaced, `$$` reduced to `$`."""
    out, i = [], 0
    while i < len(arg):
        if arg.startswith("$$", i):
            out.append("$")
            i += 2
        elif arg.startswith("$(", i) and (end := arg.find(")", i)) > 0 and arg[i + 2:end] in env:
            out.append(env[arg[i + 2:end]])
            i = end + 1
        else:
            out.append(arg[i])
            i += 1
    return "".join(out)


def resp(sock: socket.socket, *words: str) -> str:
    """Sends one command; the first line of the answer."""
    msg = f"*{len(words)}\r\n" + "".join(f"${len(w.encode())}\r\n{w}\r\n" for w in words)
    sock.sendall(msg.encode())
    data = b""
    while not data.endswith(b"\r\n"):
        chunk = sock.recv(4096)
        if not chunk:
            break
        data += chunk
    return data.decode(errors="replace").strip()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def command_lines() -> list[bytes]:
    lines = []
    for p in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            lines.append(p.read_bytes())
        except OSError:
            pass
    return lines


def check_store_password(label: str, container: dict, fail) -> None:
    argv = [*container.get("command", []), *container.get("args", [])]
    env_names = [e["name"] for e in container.get("env", [])]
    for a in argv:
        if "requirepass" in a and "$VALKEY_PASSWORD" not in a or "$(VALKEY_PASSWORD)" in a:
            fail(f"{label}: the store's password is on its command line: {argv}")
    if "VALKEY_PASSWORD" not in env_names:
        fail(f"{label}: the store gets no VALKEY_PASSWORD: {env_names}")
    server = shutil.which("valkey-server") or shutil.which("redis-server")
    if not server:
        print(f"{label}: SKIPPED running the store (no valkey-server or redis-server on PATH)")
        return
    with tempfile.TemporaryDirectory() as tmp:
        os.symlink(server, Path(tmp) / "valkey-server")
        env = {"VALKEY_PASSWORD": PASSWORD, "PATH": f"{tmp}:{os.environ['PATH']}"}
        run = [kubelet_expand(a, env) for a in argv]
        port = free_port()
        run[run.index("--port") + 1] = str(port)
        proc = subprocess.Popen(run, env=env, cwd=tmp, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        try:
            check_running(label, port, proc, fail)
        finally:
            proc.terminate()
            proc.wait(timeout=10)
    print(f"{label}: the store asks for the password, takes it from its config, and no command line holds it")


def check_running(label: str, port: int, proc: subprocess.Popen, fail) -> None:
    deadline = time.monotonic() + 10
    while True:
        try:
            sock = socket.create_connection(("127.0.0.1", port), timeout=5)
            break
        except OSError:
            if proc.poll() is not None or time.monotonic() > deadline:
                fail(f"{label}: the store did not start: {proc.stderr.read().decode() if proc.stderr else ''}")
            time.sleep(0.05)
    with sock:
        if not resp(sock, "PING").startswith("-NOAUTH"):
            fail(f"{label}: the store answers without the password")
        if resp(sock, "AUTH", PASSWORD) != "+OK":
            fail(f"{label}: the store refuses its password")
    if any(PASSWORD.encode() in line for line in command_lines()):
        fail(f"{label}: a command line holds the store's password")

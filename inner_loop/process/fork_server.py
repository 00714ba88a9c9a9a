"""A fork server for pinned member processes: the member's stack (torch, transformers, PEFT, TRL) imported once,
each pinned child forked from it ready to run.

Why: a pinned child (inner_loop/process/pinned.py) on the tiny model trains and validates in ~1.5 s, after ~7 CPU-s
of imports in its fresh interpreter. A search on a laptop, and the test suite, start hundreds of them. The server is
one process started under PINNED_ENV (``serving()``, by whoever starts many members: ``meta.run`` with
``launcher=local``, a test session); it imports the stack without running a kernel, then forks one process per
request. ``run_pinned_child`` asks it first (``MIRROR_ES_FORK_SERVER`` names its socket) and starts a fresh
interpreter wherever it cannot serve: no server, one still importing, another checkout, an environment that the
imported modules read at import and that differs (but for the offline flags, which the child sets in those modules
as ``go_offline`` does), a child that needs vLLM (hidden from the server), a SLURM job
(a member there trains inside its job's allocation).

A forked child is what ``python -m module`` with the caller's environment would be: the caller's environment,
working directory, stdin, stdout and stderr; its module run as ``__main__``; signals at their defaults; the
interpreter's exit handlers run at its end; numpy's global generator reseeded. Its bits equal a fresh child's
(tests/test_inner_loop/process/test_fork_server.py trains one member both ways). It dies with its caller: a pipe whose other
end only the caller holds (the lifeline) closes when the caller dies, however it dies, and the child then kills itself.

Per request: server -> waiter (reports the child's pid, then its exit status, on the caller's connection) -> child.
The server holds no thread of its own when it forks (the one it may have, jemalloc's background thread in
pyarrow, is made safe to fork by jemalloc's fork handlers).
"""
from __future__ import annotations

import array
import atexit
import contextlib
import ctypes
import importlib
import json
import logging
import os
import runpy
import select
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import traceback
from pathlib import Path
from typing import Any, Iterator, Mapping

from inner_loop.process.offline import OFFLINE_ENV, asks_offline, go_offline
from inner_loop.process.pinned import PINNED_ENV, can_pin, pinned_child_env, start_dying_with_parent

logger = logging.getLogger(__name__)

#: the server's socket, for the processes below the one that started it
SERVER_ENV = "MIRROR_ES_FORK_SERVER"
#: what the server imports before it serves (what the pinned children import)
PRELOAD = ("inner_loop.member.entry", "inner_loop.member.lifecycle", "inner_loop.training.setup",
           "inner_loop.training.warmup", "inner_loop.tasks")
#: variables that the preloaded modules read when they are imported (cache paths, offline flags, thread and kernel
#: settings): a caller whose value differs from the server's gets a fresh interpreter
IMPORT_TIME_ENV_PREFIXES = ("HF_", "HUGGINGFACE", "TRANSFORMERS", "DATASETS", "TORCH", "PYTORCH", "TRITON", "OMP_",
                            "MKL_", "KMP_", "ATEN_", "ONEDNN", "DNNL", "PYTHON", "TRL_", "ACCELERATE", "TOKENIZERS",
                            "PEFT", "VLLM", "ARROW", "LD_", "XDG_", "HOME", "TMPDIR", "TEMP", "TMP", "WANDB",
                            "TQDM", "TENSORBOARD", "NUMEXPR", "OPENBLAS", "JAX", "TF_")
#: of those, the ones whose value cannot change what a pinned child computes: vLLM's (hidden from both the server
#: and a fresh pinned child) and Triton's (GPU kernels), the CUDA check's, the inductor's compile workers and cache
#: (how fast and where it compiles, not what), and the library path (every shared library a member uses is loaded
#: by the server's imports). vLLM's import sets several of them in its process, whose children then carry them.
NOT_READ_BY_A_PINNED_CHILD = ("VLLM_", "TRITON_", "PYTORCH_NVML_BASED_CUDA_CHECK", "TORCHINDUCTOR_COMPILE_THREADS",
                              "TORCHINDUCTOR_CACHE_DIR", "LD_LIBRARY_PATH",
                              # the tokenizer's batch threads, read when it encodes (transformers sets it once a
                              # process has used a fast tokenizer): how many threads encode, not what
                              "TOKENIZERS_PARALLELISM")
#: threads the server may hold when it forks (jemalloc's fork handlers make its own thread safe)
_FORK_SAFE_THREADS = ("jemalloc_bg_thd",)
_MAX_REQUEST_BYTES = 1 << 22
_REQUEST_TIMEOUT_S = 30.0
_PR_SET_PDEATHSIG = 1
_SOCKET_NAME = "server.sock"


def _import_time_env(env: Mapping[str, str]) -> dict[str, str]:
    """The variables to compare (PYTHONPATH apart: ``_path_refusal``)."""
    return {key: value for key, value in env.items() if key.startswith(IMPORT_TIME_ENV_PREFIXES)
            and not key.startswith(NOT_READ_BY_A_PINNED_CHILD) and key != "PYTHONPATH"}


def _path_entries(env: Mapping[str, str]) -> list[str]:
    return [entry for entry in (env.get("PYTHONPATH") or "").split(os.pathsep) if entry]


def _top_level_names(directory: str) -> set[str]:
    """The modules and packages a sys.path entry offers, by their top-level name."""
    try:
        entries = os.listdir(directory)
    except OSError:
        return set()
    return {name.split(".", 1)[0] for name in entries if name.endswith((".py", ".pyc", ".so", ".pth"))
            or os.path.isdir(os.path.join(directory, name))}


def _path_refusal(theirs: list[str], own: list[str]) -> str | None:
    """A caller's PYTHONPATH may add directories (an extension's modules) to the server's, as long as none offers a
    module the server imported already (a fresh interpreter would import that one, the child has the server's)."""
    if theirs == own:
        return None
    missing = [entry for entry in own if entry not in theirs]
    if missing:
        return f"the caller's PYTHONPATH lacks the server's {missing}"
    imported = {name.split(".", 1)[0] for name in sys.modules}
    for entry in theirs:
        if entry not in own:
            shadowed = sorted(_top_level_names(entry) & imported)
            if shadowed:
                return f"the caller's PYTHONPATH entry {entry} offers modules the server imported: {shadowed[:5]}"
    return None


def _root() -> str:
    """The checkout this module is in: a server serves only callers of the same checkout."""
    return str(Path(__file__).resolve().parents[2])


# ---------------------------------------------------------------- the caller's side


class ForkedChild:
    """A child forked by the server, driven like a ``subprocess.Popen`` with stdin and stdout piped (what
    ``run_pinned_child`` and the job's end notice use of one)."""

    def __init__(self, connection: socket.socket, pid: int, stdin: int, stdout: int, lifeline: int,
                 unread: bytes = b"") -> None:
        self.pid = pid
        self.returncode: int | None = None
        self._connection = connection
        self._stdin = stdin
        self._stdout = stdout
        self._lifeline = lifeline
        self._buffer = unread  # what arrived after the pid's line (the status of a child that ended at once)

    def _read_status(self, timeout: float | None) -> None:
        while b"\n" not in self._buffer:
            ready, _, _ = select.select([self._connection], [], [], timeout)
            if not ready:
                raise subprocess.TimeoutExpired(f"forked child {self.pid}", timeout or 0.0)
            chunk = self._connection.recv(4096)
            if not chunk:  # the waiter died without a word (killed with the server's process group)
                self._finish(-signal.SIGKILL)
                return
            self._buffer += chunk
        line, _, self._buffer = self._buffer.partition(b"\n")
        self._finish(int(json.loads(line)["returncode"]))

    def _finish(self, code: int) -> None:
        """The child ended: its status is known and its lifeline no longer needed. Its stdout stays open for
        ``communicate`` (which may be reading it when a notice handler waits for the child)."""
        self.returncode = code
        self._connection.close()
        with contextlib.suppress(OSError):
            os.close(self._lifeline)
        self._lifeline = -1

    def poll(self) -> int | None:
        if self.returncode is None:
            with contextlib.suppress(subprocess.TimeoutExpired):
                self._read_status(0.0)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        if self.returncode is None:
            self._read_status(timeout)
        assert self.returncode is not None
        return self.returncode

    def send_signal(self, signum: int) -> None:
        if self.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, signum)

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)

    def communicate(self, data: bytes) -> tuple[bytes, None]:
        """Write ``data`` to the child's stdin and close it (on a thread, as Popen does: the child may write first),
        read its stdout to the end, wait for it."""
        stdin, self._stdin = self._stdin, -1

        def feed() -> None:
            try:
                with open(stdin, "wb") as pipe:
                    pipe.write(data)
            except BrokenPipeError:
                pass

        writer = threading.Thread(target=feed, name="fork-server-stdin", daemon=True)
        writer.start()
        chunks = []
        try:
            while chunk := os.read(self._stdout, 1 << 16):
                chunks.append(chunk)
        finally:
            os.close(self._stdout)
            self._stdout = -1
        writer.join()
        self.wait()
        return b"".join(chunks), None


def _refusal_here() -> str | None:
    """Why this process must start its pinned child fresh whatever a server would say (None: it may ask)."""
    if not os.environ.get(SERVER_ENV):
        return "no server"
    if os.environ.get("SLURM_JOB_ID"):
        return "a SLURM job trains inside its own allocation"
    return None


def start_forked(module: str, env: Mapping[str, str]) -> ForkedChild | None:
    """``python -m module`` under ``env``, forked by this process's server with stdin and stdout piped; None where
    no server can serve it (the caller starts a fresh interpreter). The caller's stderr is the child's."""
    reason = _refusal_here()
    if reason is not None:
        logger.debug("pinned child %s: fresh interpreter (%s)", module, reason)
        return None
    connection = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        connection.connect(os.environ[SERVER_ENV])
    except OSError as exc:  # not listening yet (still importing), or gone
        connection.close()
        logger.debug("pinned child %s: fresh interpreter (fork server: %s)", module, exc)
        return None
    stdin_read, stdin_write = os.pipe()
    stdout_read, stdout_write = os.pipe()
    lifeline_read, lifeline_write = os.pipe()
    request = {"module": module, "env": dict(env), "cwd": os.getcwd(), "root": _root()}
    try:
        payload = json.dumps(request).encode() + b"\n"
        fds = array.array("i", [stdin_read, stdout_write, 2, lifeline_read])  # fd 2: what Popen passes on
        connection.sendmsg([payload], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, fds)])
        received = b""
        while b"\n" not in received and (chunk := connection.recv(4096)):
            received += chunk
        reply, _, unread = received.partition(b"\n")
    except OSError as exc:
        reply, unread = json.dumps({"refused": f"fork server: {exc}"}).encode(), b""
    finally:
        for fd in (stdin_read, stdout_write, lifeline_read):
            os.close(fd)
    answer = json.loads(reply) if reply.strip() else {"refused": "the fork server closed the connection"}
    if "pid" not in answer:
        for fd in (stdin_write, stdout_read, lifeline_write):
            os.close(fd)
        connection.close()
        logger.info("pinned child %s: fresh interpreter (%s)", module, answer.get("refused"))
        return None
    return ForkedChild(connection, int(answer["pid"]), stdin_write, stdout_read, lifeline_write, unread)


# ---------------------------------------------------------------- the server


def _threads_unsafe_to_fork() -> list[str]:
    names = []
    for task in Path("/proc/self/task").iterdir():
        if int(task.name) == os.getpid():
            continue
        name = (task / "comm").read_text().strip()
        if name not in _FORK_SAFE_THREADS:
            names.append(name)
    return names


def _refusal(request: Mapping[str, Any], own_env: Mapping[str, str]) -> str | None:
    if request.get("root") != _root():
        return f"the server runs the checkout {_root()}, the caller {request.get('root')}"
    env = request.get("env") or {}
    theirs = _import_time_env(env)
    keys = sorted(key for key in set(theirs) | set(own_env) if theirs.get(key) != own_env.get(key))
    if asks_offline(env):  # an offline caller (a local job's process): the child goes offline as it starts
        keys = [key for key in keys if key not in OFFLINE_ENV]
    if keys:
        return f"the environment read at import differs from the server's: {', '.join(keys)}"
    path_refusal = _path_refusal(_path_entries(env), _path_entries(os.environ))
    if path_refusal is not None:
        return path_refusal
    threads = _threads_unsafe_to_fork()
    if threads:
        return f"the server holds threads that are unsafe to fork: {threads}"
    return None


def _receive(connection: socket.socket) -> tuple[dict[str, Any], list[int]]:
    fds = array.array("i")
    data = b""
    connection.settimeout(_REQUEST_TIMEOUT_S)
    while not data.endswith(b"\n"):
        chunk, ancillary, _, _ = connection.recvmsg(1 << 16, socket.CMSG_SPACE(4 * fds.itemsize))
        for level, kind, body in ancillary:
            if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
                fds.frombytes(body[: len(body) - len(body) % fds.itemsize])
        if not chunk or len(data) > _MAX_REQUEST_BYTES:
            for fd in fds:
                os.close(fd)
            raise ConnectionError("incomplete request")
        data += chunk
    connection.settimeout(None)
    return json.loads(data), list(fds)


def _send(connection: socket.socket, message: Mapping[str, Any]) -> None:
    with contextlib.suppress(OSError):  # a caller that died meanwhile
        connection.sendall(json.dumps(message).encode() + b"\n")


def _exit_code(code: object) -> int:
    """sys.exit's argument as the interpreter turns it into an exit status."""
    if code is None:
        return 0
    if isinstance(code, int):
        return code & 0xFF
    sys.stderr.write(f"{code}\n")
    return 1


def _watch_lifeline(fd: int) -> None:
    """In the child: block until the caller's end of the lifeline closes (the caller ended), then die."""
    while os.read(fd, 1):  # nothing is ever written: a read returns only at the end
        pass
    os.kill(os.getpid(), signal.SIGKILL)


def _become_child(request: Mapping[str, Any], fds: list[int]) -> None:
    """In the forked child: take the caller's streams, environment and directory, run the module, exit."""
    code = 1
    try:
        stdin, stdout, stderr, lifeline = fds
        for signum in (signal.SIGTERM, signal.SIGCHLD, signal.SIGHUP, signal.SIGUSR1, signal.SIGUSR2):
            signal.signal(signum, signal.SIG_DFL)
        signal.signal(signal.SIGINT, signal.default_int_handler)
        with contextlib.suppress(OSError):  # the waiter is its parent: never outlive it
            ctypes.CDLL("libc.so.6", use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
        for fd, target in ((stdin, 0), (stdout, 1), (stderr, 2)):
            os.dup2(fd, target)
            os.close(fd)
        logger.handlers.clear()  # the server's own handler (serve): the child logs as a fresh interpreter would
        logger.propagate = True
        logger.setLevel(logging.NOTSET)
        threading.Thread(target=_watch_lifeline, args=(lifeline,), name="fork-server-lifeline", daemon=True).start()
        os.chdir(request["cwd"])
        own_entries = set(_path_entries(os.environ))  # still the server's here
        sys.path[:] = [request["cwd"], *_path_entries(request["env"]),
                       *(entry for entry in sys.path[1:] if entry not in own_entries)]
        importlib.invalidate_caches()
        os.environ.clear()
        os.environ.update(request["env"])
        if asks_offline(request["env"]):
            go_offline()  # into the modules that read the flags at import, as a fresh interpreter would read them
        if "numpy" in sys.modules:  # a fresh interpreter seeds it from the OS: forked children must not share it
            sys.modules["numpy"].random.seed(int.from_bytes(os.urandom(4), "little"))
        sys.argv = [request["module"]]
        sys.modules.pop(request["module"], None)  # run as __main__, as `python -m` does, not the imported copy
        try:
            runpy.run_module(request["module"], run_name="__main__", alter_sys=True)
            code = 0
        except SystemExit as exc:
            code = _exit_code(exc.code)
        except BaseException:  # noqa: BLE001 - the interpreter's own report of an uncaught exception
            traceback.print_exc()
            code = 1
        atexit._run_exitfuncs()
    finally:
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(Exception):
                stream.flush()
        os._exit(code)


def _wait_for_child(connection: socket.socket, request: Mapping[str, Any], fds: list[int]) -> None:
    """The waiter: fork the child, tell the caller its pid and then its exit status, exit."""
    try:
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)  # the server's SIG_IGN would reap the child before waitpid
        signal.signal(signal.SIGINT, signal.SIG_IGN)  # stopped by its child's end only
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        pid = os.fork()
        if pid == 0:
            connection.close()
            _become_child(request, fds)
        for fd in fds:
            os.close(fd)
        _send(connection, {"pid": pid})
        _, status = os.waitpid(pid, 0)
        _send(connection, {"returncode": os.waitstatus_to_exitcode(status)})
    finally:
        os._exit(0)


def serve(path: str) -> None:
    """The server's loop (``python -m inner_loop.process.fork_server SOCKET``, started under PINNED_ENV)."""
    sys.modules["vllm"] = None  # type: ignore[assignment]  # TRL imports it when installed; a pinned child never uses it
    started_with = dict(os.environ)
    for module in PRELOAD:
        importlib.import_module(module)
    own_env = _import_time_env(started_with)
    # what the imports set (torch's inductor cache directory): a fresh child's imports would set it too
    set_by_imports = {key: value for key, value in os.environ.items() if started_with.get(key) != value}
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    staging = f"{path}.{os.getpid()}"
    listener.bind(staging)
    listener.listen(64)
    os.rename(staging, path)  # the socket appears only once it accepts
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # waiters are reaped by the kernel
    signal.signal(signal.SIGTERM, lambda *_: os._exit(0))
    # the server's own word (each refusal's reason once, on the stderr it was started with); the root logger stays
    # unconfigured, for the children's own logging.basicConfig
    logger.addHandler(logging.StreamHandler())
    logger.propagate = False
    logger.setLevel(logging.INFO)
    reasons_told: set[str] = set()
    while True:
        connection, _ = listener.accept()
        try:
            request, fds = _receive(connection)
        except (OSError, ValueError) as exc:
            logger.warning("fork server: a request could not be read: %s", exc)
            connection.close()
            continue
        reason = _refusal(request, own_env) if len(fds) == 4 else f"{len(fds)} descriptors, 4 expected"
        if reason is not None:
            if reason not in reasons_told:
                reasons_told.add(reason)
                logger.warning("fork server: a pinned child starts a fresh interpreter (~7 CPU-s of imports): %s",
                               reason)
            for fd in fds:
                os.close(fd)
            _send(connection, {"refused": reason})
            connection.close()
            continue
        sys.stdout.flush()
        sys.stderr.flush()
        if os.fork() == 0:
            listener.close()
            _wait_for_child(connection, {**request, "env": {**request["env"], **set_by_imports}}, fds)
        for fd in fds:
            os.close(fd)
        connection.close()


# ---------------------------------------------------------------- starting one


def can_serve() -> bool:
    """Forking is how the server serves (Linux, with /proc to check its threads)."""
    return hasattr(os, "fork") and Path("/proc/self/task").is_dir() and hasattr(socket, "AF_UNIX")


@contextlib.contextmanager
def serving() -> Iterator[str | None]:
    """A fork server for this process and the processes it starts while the block runs (its socket in
    ``MIRROR_ES_FORK_SERVER``); stopped at the end. Does not wait for its imports: until it listens, pinned
    children start fresh. Nothing where one is serving already, inside a SLURM job (whose members train in their own
    allocation, never forked from here), or where the machine cannot pin or fork."""
    if os.environ.get(SERVER_ENV) or os.environ.get("SLURM_JOB_ID") or not can_serve() or not can_pin():
        yield os.environ.get(SERVER_ENV)
        return
    directory = tempfile.mkdtemp(prefix="mirror-es-fork-")
    path = str(Path(directory) / _SOCKET_NAME)
    env = {**pinned_child_env(), **PINNED_ENV}
    server = subprocess.Popen([sys.executable, "-m", __name__, path], env=env, stdin=subprocess.DEVNULL,
                              preexec_fn=start_dying_with_parent)
    os.environ[SERVER_ENV] = path
    try:
        yield path
    finally:
        if os.environ.get(SERVER_ENV) == path:
            del os.environ[SERVER_ENV]
        server.terminate()
        try:
            server.wait(timeout=10)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait()
        shutil.rmtree(directory, ignore_errors=True)


if __name__ == "__main__":
    serve(sys.argv[1])

"""A fork server (zygote): a process that has imported a Python program once and
forks each run of it from there, so a start costs a ``fork()``, not an
interpreter's start and a second of imports.

Used twice: the ``local`` backend forks its agents from one (the worker starts
it: ``python -m runtime.forkserver``), and an inference agent forks its model
server from one (:func:`fork_server_process`: forked from the agent itself
before its trio loop starts, so it imports nothing more).

Two halves (``_zygote.py`` and ``_client.py``, their messages in ``_protocol.py``):

- the zygote (:func:`serve`): a small separate process. It imports the modules
  it is told, checks it is still single-threaded, says ``ready`` and then
  answers spawn requests on the one socket it was given, forking a child per
  request. It never starts trio (nothing to inherit), holds no job's
  secret (a request carries a command line, an environment without secrets
  and its stdio; an agent reads its config, report token included, only
  after the fork, as its own user), reaps its children and reports each exit.
- the client (:class:`ForkServer`, trio): starts or adopts the zygote, sends
  requests, hands back a :class:`ForkedProcess` that waits and is signalled as
  a ``trio.Process`` is.

The protocol: one ``SOCK_SEQPACKET`` socketpair (message boundaries kept, file
descriptors passed), each message one JSON object of at most
:data:`MAX_MESSAGE` bytes::

    client -> zygote  {"op": "spawn", "id": N, "module": M, "argv": [...],
                       "env": {...}, "cwd": PATH|null, "uid": U|null,
                       "gid": G|null, "umask": MASK|null, "session": BOOL,
                       "stdio": [I, I, I], "function": NAME|null}
                      + 1 to 3 descriptors
    zygote -> client  {"op": "ready", "pid": P}                    once, first
                      {"op": "spawned", "id": N, "pid": P}
                      {"op": "refused", "id": N, "error": "..."}   nothing forked
                      {"op": "exited", "pid": P, "status": S}      S as Popen's returncode

Every request is checked before anything is done with it (:func:`parse_request`):
a malformed one is refused with a reason, never the end of the zygote; the
module must be one it preloaded.

``stdio`` says where the child's stdin, stdout and stderr come from: the index
of a passed descriptor, or -1 for ``/dev/null``. ``function``: call the
preloaded module's function of that name with the arguments (what it returns
is the exit status), rather than run the module's code again as ``__main__``
(which rebuilds every class it defines: 15 ms of the model server's start).

The child, between ``fork()`` and the program's first line (:func:`_become`):
default signal handlers, a session of its own (``setsid``) when asked, its
stdio, every other descriptor closed (the zygote's socket too), its command
line rewritten to the program's own (so ``ps``, and the ``local`` backend's
adoption after a worker restart, which matches ``--config FILE`` in
``/proc/PID/cmdline``, see what a spawned one shows), umask, then groups,
gid and uid dropped (checked; the child stays non-dumpable, see below), the
working folder and the environment replaced, and the module run as
``__main__``. It ends with ``os._exit``: it never returns into the zygote's loop.

What forked children share that spawned ones do not: the zygote's address-space
layout (ASLR is per zygote, not per agent) and its ``str`` hash seed
(``random`` is reseeded at fork by CPython itself). They would help an attacker
who already has a memory-corruption bug, or wants to flood dicts, in another
job's agent, not to read another job's data; and a child given another user
stays non-dumpable (Linux clears the flag as the uid changes; no ``execve``
sets it again), so the processes of its job's own user, its shells, cannot
ptrace it or read its memory to learn them. Nothing restarts a zygote: when it
is gone its users spawn as before and say so.
"""

from ._client import ForkedProcess, ForkServer, fork_server_process
from ._protocol import MAX_MESSAGE, ForkServerError, SpawnRequest, parse_reply, parse_request
from ._zygote import serve

__all__ = [
    "MAX_MESSAGE",
    "ForkServer",
    "ForkServerError",
    "ForkedProcess",
    "SpawnRequest",
    "fork_server_process",
    "parse_reply",
    "parse_request",
    "serve",
]

"""Run untrusted Python programs in an isolated, resource-limited child process.

Every call of :func:`run_in_sandbox` starts a fresh interpreter in its own session and, where
the kernel allows it, in new mount, network, PID and IPC namespaces:

* **no network**: an empty network namespace (no interface is up, not even loopback);
* **own PID space**: the program cannot see or signal host processes; when the program ends or
  is killed, the namespace's init exits and the kernel kills everything it forked;
* **read-only host file system**: every host mount is re-mounted read-only inside the sandbox;
  a fresh tmpfs on ``/tmp`` holds the throwaway work directory (the program's cwd), ``/dev`` is
  replaced by a minimal one (null, zero, full, random, urandom) and ``/proc`` by a fresh one;
* **unprivileged**: as root the program runs under a random throwaway uid/gid (directories the
  uid could not traverse, such as a ``0700`` home holding the interpreter, are covered by an
  empty tmpfs with only the interpreter's prefix bound back read-only); in a user namespace every
  capability is dropped before ``exec``;
* **limits**: wall clock (the evaluator kills the process group), CPU time (``RLIMIT_CPU``),
  address space (``RLIMIT_AS``), processes (``RLIMIT_NPROC``), file size (``RLIMIT_FSIZE``),
  open files, no core dumps, and at most ``max_output_bytes`` of stdout+stderr;
* **scrubbed environment**: only ``PATH``, ``HOME``/``TMPDIR`` (the work directory), a UTF-8
  locale, ``PYTHONHASHSEED=0`` and single-threaded BLAS settings reach the program.

Isolation is chosen once per process (:func:`sandbox_isolation`): ``namespaces`` when running
as root, else ``userns`` (unprivileged user namespaces), else ``none``; the environment variable
``ELFREG_SANDBOX_ISOLATION`` (``auto``/``namespaces``/``userns``/``none``) overrides the choice.
``none`` keeps the resource limits, the own session, the scrubbed environment and a private
work directory, and drops to a throwaway uid when running as root with an interpreter that uid
can reach; it cannot stop network access or writes to files the uid may write, and says so
once with a :class:`RuntimeWarning`.

The pieces: :mod:`.isolation` is the policy (which mode, which identity, which environment,
what is left to reap), :mod:`.supervisor` the mechanism (launch, wall clock, output cap, kill,
result) and :mod:`.boot` the code that runs inside the child.
"""

from .isolation import ISOLATION_ENV, sandbox_isolation
from .supervisor import NOT_RUN, SandboxJob, SandboxLimits, SandboxResult, run_in_sandbox, run_many

__all__ = [
    "NOT_RUN",
    "SandboxLimits",
    "SandboxResult",
    "SandboxJob",
    "run_in_sandbox",
    "run_many",
    "sandbox_isolation",
    "ISOLATION_ENV",
]

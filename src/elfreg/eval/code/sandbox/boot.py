"""What runs inside the sandbox's child: build the isolation, drop privileges, ``exec`` the program.

Contract: this file is executed as a script (``python -I -S -B boot.py CONFIG``) by
:mod:`elfreg.eval.code.sandbox.supervisor`, once per sandboxed program, and is never imported by the
evaluator; it uses the standard library only. ``CONFIG`` is a small file (one ``key<TAB>value``
per line, lists joined by ``\x1f``) that names the mode, the work directory, the limits, the
identity chosen by :mod:`elfreg.eval.code.sandbox.isolation` and the program's ``argv``. Once the
isolation is in place and privileges are dropped it writes one byte to ``status_fd`` (the
supervisor starts the program's clock then) and ``exec``s ``argv``; any failure before that is
reported on stderr with exit status 125. Modes:

``namespaces``  (real root) new mount, network, PID and IPC namespaces; the host file system is
                re-mounted read-only, a fresh tmpfs is mounted on ``/tmp`` (holding the work
                directory), ``/dev/shm`` and a minimal ``/dev``; a fresh ``/proc`` shows only the
                sandbox's processes; the program runs under a throwaway unprivileged uid/gid.
``userns``      (any user) the same, inside a new user namespace that maps only the caller's
                uid; instead of a uid change, every capability is dropped before ``exec``.
``none``        no namespaces: resource limits, own session, scrubbed environment, a private
                work directory on the host, and an unprivileged uid when running as root and the
                interpreter is reachable by it.

In the namespace modes the process tree is: outer (this process, in the host PID namespace),
init (PID 1 of the new namespace; it waits for the program and exits with its status, which
makes the kernel kill every process left in the namespace) and the program.
"""

import ctypes
import os
import resource
import sys

CLONE_NEWNS = 0x00020000
CLONE_NEWIPC = 0x08000000
CLONE_NEWUSER = 0x10000000
CLONE_NEWPID = 0x20000000
CLONE_NEWNET = 0x40000000

MS_RDONLY = 1
MS_NOSUID = 2
MS_NODEV = 4
MS_NOEXEC = 8
MS_REMOUNT = 32
MS_NOATIME = 1024
MS_NODIRATIME = 2048
MS_BIND = 4096
MS_REC = 16384
MS_PRIVATE = 1 << 18
MS_RELATIME = 1 << 21
MS_STRICTATIME = 1 << 24

PR_SET_PDEATHSIG = 1
PR_SET_DUMPABLE = 4
PR_CAPBSET_DROP = 24
PR_SET_SECUREBITS = 28
PR_SET_NO_NEW_PRIVS = 38
# SECBIT_NOROOT | _LOCKED, SECBIT_NO_SETUID_FIXUP | _LOCKED, SECBIT_KEEP_CAPS_LOCKED,
# SECBIT_NO_CAP_AMBIENT_RAISE | _LOCKED: uid 0 gains no capabilities on exec.
SECUREBITS_LOCKDOWN = 0x01 | 0x02 | 0x04 | 0x08 | 0x20 | 0x40 | 0x80

SETUP_EXIT = 125
SIGKILL = 9
DEV_NODES = ("null", "zero", "full", "random", "urandom")
# File systems whose read-only remount may be refused without harm to the host: they hold no
# user data, or the sandbox replaces them (a fresh /proc, /dev and /tmp are mounted on top).
PSEUDO_FS = {"proc", "sysfs", "cgroup", "cgroup2", "devpts", "mqueue", "binfmt_misc", "debugfs",
             "tracefs", "securityfs", "pstore", "bpf", "configfs", "fusectl", "hugetlbfs",
             "autofs", "efivarfs", "nsfs", "rpc_pipefs", "selinuxfs"}

_libc = ctypes.CDLL(None, use_errno=True)


class SetupError(Exception):
    pass


def _check(ret, what):
    if ret != 0:
        err = ctypes.get_errno()
        raise SetupError(f"{what}: {os.strerror(err)}")


def _mount(source, target, fstype, flags, data=None):
    _check(
        _libc.mount(
            None if source is None else os.fsencode(source),
            os.fsencode(target),
            None if fstype is None else fstype.encode(),
            ctypes.c_ulong(flags),
            None if data is None else data.encode(),
        ),
        f"mount {target}",
    )


def _prctl(option, arg):
    _check(_libc.prctl(option, ctypes.c_ulong(arg), 0, 0, 0), f"prctl {option}")


def read_config(path):
    cfg = {}
    with open(path, "rb") as fh:
        for line in fh.read().decode("utf-8").split("\n"):
            if line:
                key, _, value = line.partition("\t")
                cfg[key] = value
    return cfg


def _list(cfg, key):
    value = cfg.get(key, "")
    return [item for item in value.split("\x1f") if item] if value else []


def _unescape_mount_path(path):
    out, i = [], 0
    while i < len(path):
        if path[i] == "\\" and i + 3 < len(path) and path[i + 1 : i + 4].isdigit():
            out.append(chr(int(path[i + 1 : i + 4], 8)))
            i += 4
        else:
            out.append(path[i])
            i += 1
    return "".join(out)


def _mounts():
    mounts = []
    with open("/proc/self/mountinfo") as fh:
        for line in fh:
            fields = line.split()
            sep = fields.index("-")
            mounts.append((_unescape_mount_path(fields[4]), fields[sep + 1]))
    return mounts


def _remount_readonly(target):
    st = os.statvfs(target)
    flags = MS_REMOUNT | MS_BIND | MS_RDONLY
    for st_flag, ms_flag in ((os.ST_NOSUID, MS_NOSUID), (os.ST_NODEV, MS_NODEV), (os.ST_NOEXEC, MS_NOEXEC),
                             (os.ST_NOATIME, MS_NOATIME), (os.ST_NODIRATIME, MS_NODIRATIME),
                             (os.ST_RELATIME, MS_RELATIME)):
        if st.f_flag & st_flag:
            flags |= ms_flag
    if not st.f_flag & (os.ST_NOATIME | os.ST_RELATIME):
        flags |= MS_STRICTATIME
    _mount(None, target, None, flags)


def _make_host_readonly():
    failures = []
    for target, fstype in sorted(set(_mounts()), key=lambda m: (m[0].count("/"), m[0])):
        if not os.path.lexists(target):
            continue  # hidden below a mount covered earlier
        try:
            _remount_readonly(target)
        except (SetupError, OSError) as err:
            if fstype in PSEUDO_FS:
                continue
            if target != "/":
                try:  # cannot be made read-only: hide it under an empty read-only tmpfs instead
                    _mount("tmpfs", target, "tmpfs", MS_NOSUID | MS_NODEV | MS_NOEXEC | MS_RDONLY, "size=4k")
                    continue
                except (SetupError, OSError):
                    pass
            failures.append(f"{target} ({fstype}): {err}")
    if failures:
        raise SetupError("cannot make the host file system read-only: " + "; ".join(failures))


def _expose(hidden, keep_fds):
    """Mount an empty tmpfs over each unreadable ancestor and bind back only the needed paths."""
    for ancestor in hidden:
        _mount("tmpfs", ancestor, "tmpfs", MS_NOSUID | MS_NODEV, "mode=755,size=64k")
    for path, fd in keep_fds:
        os.makedirs(path, mode=0o755, exist_ok=True)
        _mount(f"/proc/self/fd/{fd}", path, None, MS_BIND | MS_REC)
        _remount_readonly(path)
        os.close(fd)
    for ancestor in hidden:
        _remount_readonly(ancestor)


def _fresh_dev(node_fds):
    _mount("tmpfs", "/dev", "tmpfs", MS_NOSUID | MS_NOEXEC, "mode=755,size=64k")
    for name, fd in node_fds:
        target = "/dev/" + name
        open(target, "w").close()
        _mount(f"/proc/self/fd/{fd}", target, None, MS_BIND)
        os.close(fd)
    for link, dest in (("fd", "/proc/self/fd"), ("stdin", "/proc/self/fd/0"),
                       ("stdout", "/proc/self/fd/1"), ("stderr", "/proc/self/fd/2")):
        os.symlink(dest, "/dev/" + link)
    os.mkdir("/dev/shm")
    _remount_readonly("/dev")
    _mount("tmpfs", "/dev/shm", "tmpfs", MS_NOSUID | MS_NODEV, "mode=1777,size=16m")


def _write_workdir(cfg, files, uid, gid):
    tmp_size = int(cfg["tmpfs_bytes"])
    _mount("tmpfs", "/tmp", "tmpfs", MS_NOSUID | MS_NODEV, f"mode=1777,size={tmp_size}")
    work = cfg["workdir"]
    os.mkdir(work, 0o700)
    for name, data in files.items():
        with open(os.path.join(work, name), "wb") as fh:
            fh.write(data)
        os.chown(os.path.join(work, name), uid, gid)
    os.chown(work, uid, gid)
    os.chdir(work)


def _set_limits(cfg):
    def both(kind, value):
        resource.setrlimit(kind, (value, value))

    cpu = int(cfg["cpu_seconds"])
    resource.setrlimit(resource.RLIMIT_CPU, (cpu, cpu + 1))
    both(resource.RLIMIT_AS, int(cfg["memory_bytes"]))
    both(resource.RLIMIT_FSIZE, int(cfg["file_bytes"]))
    both(resource.RLIMIT_CORE, 0)
    both(resource.RLIMIT_NOFILE, int(cfg["open_files"]))
    both(resource.RLIMIT_NPROC, int(cfg["nproc"]))


def _drop_privileges(cfg, mode):
    _prctl(PR_SET_NO_NEW_PRIVS, 1)
    if mode == "userns" or (mode == "none" and cfg.get("drop_caps") == "1"):
        # uid 0 of a user namespace (or root that cannot change uid): keep the uid, drop every
        # capability and lock the secure bits so that exec does not grant them back.
        _prctl(PR_SET_SECUREBITS, SECUREBITS_LOCKDOWN)
        for cap in range(64):
            if _libc.prctl(PR_CAPBSET_DROP, ctypes.c_ulong(cap), 0, 0, 0) != 0:
                break
        return
    uid = int(cfg.get("uid", "-1"))
    gid = int(cfg.get("gid", "-1"))
    if uid >= 0:
        os.setgroups([])
        os.setgid(gid)
        os.setuid(uid)  # leaving uid 0 clears every capability
        if os.getuid() != uid or os.geteuid() != uid:
            raise SetupError("uid change did not take effect")


def _exec_program(cfg, mode, status_fd):
    try:
        _set_limits(cfg)
        _drop_privileges(cfg, mode)
        os.write(status_fd, b"R")
        os.close(status_fd)
    except BaseException as err:  # noqa: BLE001 - report any setup failure to the evaluator
        _fail(err)
    argv = _list(cfg, "argv")
    env = dict(os.environ)
    os.execve(argv[0], argv, env)


def _fail(err):
    try:
        os.write(2, f"elfreg-sandbox: setup failed: {err}\n".encode("utf-8", "replace"))
    finally:
        os._exit(SETUP_EXIT)


def _exit_like(status):
    if os.WIFSIGNALED(status):
        os._exit(128 + os.WTERMSIG(status))
    os._exit(os.WEXITSTATUS(status))


def _run_none(cfg, status_fd):
    os.chdir(cfg["host_dir"])
    uid = int(cfg.get("uid", "-1"))
    if uid >= 0:
        os.chown(cfg["host_dir"], uid, int(cfg["gid"]))
        for name in os.listdir(cfg["host_dir"]):
            os.chown(os.path.join(cfg["host_dir"], name), uid, int(cfg["gid"]))
    _exec_program(cfg, "none", status_fd)


def _run_namespaced(cfg, mode, status_fd):
    host_dir = cfg["host_dir"]
    files = {}
    for name in os.listdir(host_dir):
        if name != "sandbox.cfg":
            with open(os.path.join(host_dir, name), "rb") as fh:
                files[name] = fh.read()
    hidden = _list(cfg, "hide")
    flags = CLONE_NEWNS | CLONE_NEWNET | CLONE_NEWPID | CLONE_NEWIPC
    if mode == "userns":
        flags |= CLONE_NEWUSER
    euid, egid = os.geteuid(), os.getegid()
    _check(_libc.unshare(ctypes.c_int(flags)), "unshare")
    if mode == "userns":
        with open("/proc/self/setgroups", "w") as fh:
            fh.write("deny")
        with open("/proc/self/uid_map", "w") as fh:
            fh.write(f"0 {euid} 1")
        with open("/proc/self/gid_map", "w") as fh:
            fh.write(f"0 {egid} 1")
    init = os.fork()
    if init:
        os.close(status_fd)
        _exit_like(os.waitpid(init, 0)[1])
    # PID 1 of the new namespace.
    _prctl(PR_SET_PDEATHSIG, SIGKILL)
    _mount(None, "/", None, MS_REC | MS_PRIVATE)
    # Handles to what stays visible; opened inside the new mount namespace (a bind mount needs
    # its source there) and before anything is covered.
    keep_fds = [(path, os.open(path, os.O_PATH | os.O_DIRECTORY)) for path in _list(cfg, "expose")]
    node_fds = [(name, os.open("/dev/" + name, os.O_PATH)) for name in DEV_NODES
                if os.path.exists("/dev/" + name)]
    _make_host_readonly()
    _mount("proc", "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC)
    _fresh_dev(node_fds)
    if mode == "userns":
        uid = gid = 0
    else:
        uid, gid = int(cfg["uid"]), int(cfg["gid"])
    _write_workdir(cfg, files, uid, gid)
    _expose(hidden, keep_fds)
    program = os.fork()
    if program == 0:
        _exec_program(cfg, mode, status_fd)
    os.close(status_fd)
    while True:
        try:
            pid, status = os.wait()
        except ChildProcessError:  # pragma: no cover - the program is always our child
            os._exit(SETUP_EXIT)
        if pid == program:
            _exit_like(status)


def main():
    cfg = read_config(sys.argv[1])
    mode = cfg["mode"]
    status_fd = int(cfg["status_fd"])
    os.set_inheritable(status_fd, False)
    try:
        if mode == "none":
            _run_none(cfg, status_fd)
        else:
            _run_namespaced(cfg, mode, status_fd)
    except BaseException as err:  # noqa: BLE001 - any failure here is a setup failure
        _fail(err)


if __name__ == "__main__":
    main()

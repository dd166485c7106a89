"""What a job may not ask of the kernel: its seccomp filter (built for this machine's architecture and
installed after it drops its uid) and a fresh, empty session keyring (joined once by the worker)."""

from __future__ import annotations

import ctypes
import os

from .common import check, libc

CLONE_NEWUSER = 0x10000000
PR_SET_NO_NEW_PRIVS = 38
PR_SET_SECCOMP, SECCOMP_MODE_FILTER = 22, 2
KEYCTL_JOIN_SESSION_KEYRING = 1

# Syscalls the job may not make, per architecture: the kernel keyring (keyctl, add_key, request_key),
# io_uring (its operations bypass seccomp, e.g. IORING_OP_SOCKET), socket(AF_UNIX, ...)
# (pathname and abstract unix sockets; socketpair() stays allowed, which multiprocessing.Pipe uses)
# and new user namespaces: unshare/clone with CLONE_NEWUSER fail with EPERM; clone3, whose flags a
# seccomp filter cannot read, fails with ENOSYS (the C library then falls back to clone).
_ARCH = {  # machine -> (AUDIT_ARCH_*, socket, (unshare, clone), clone3, denied: keyctl, add_key, ...)
    "x86_64": (0xC000003E, 41, (272, 56), 435, (250, 248, 249, 425, 426, 427)),
    "aarch64": (0xC00000B7, 198, (97, 220), 435, (219, 217, 218, 425, 426, 427)),
}

# socketpair: only SOCK_STREAM is allowed (multiprocessing, asyncio). A datagram or seqpacket pair can
# be disconnected (connect(AF_UNSPEC)) and then sendto() any unix socket on a path the job can see.
_SOCKETPAIR = {"x86_64": 53, "aarch64": 199}
SOCK_STREAM, SOCK_TYPE_MASK = 1, 0xF


def seccomp_program() -> bytes:
    """A classic-BPF seccomp filter (``struct sock_filter[]``) for this machine's architecture.

    Another architecture's syscalls (e.g. i386 ``socketcall`` from an x86-64 process) kill the job;
    x32 syscall numbers fail with ENOSYS. ``unshare``/``clone`` are checked on their flags (the
    first argument's low 32 bits): ``CLONE_NEWUSER`` fails with EPERM.
    """
    import errno
    import platform
    import struct

    machine = platform.machine()
    if machine not in _ARCH:
        raise OSError(errno.ENOSYS, f"no seccomp filter for architecture {machine!r}")
    arch, sys_socket, with_flags, sys_clone3, denied = _ARCH[machine]
    ld, jeq, jge, jset, ret, alu_and = 0x20, 0x15, 0x35, 0x45, 0x06, 0x54
    allow, kill = 0x7FFF0000, 0x80000000

    def err(code: int) -> int:
        return 0x00050000 | code

    ins = [(ld, 0, 0, 4), (jeq, 1, 0, arch), (ret, 0, 0, kill), (ld, 0, 0, 0)]
    if machine == "x86_64":
        ins += [(jge, 0, 1, 0x40000000), (ret, 0, 0, err(errno.ENOSYS))]
    for nr in denied:
        ins += [(jeq, 0, 1, nr), (ret, 0, 0, err(errno.EPERM))]
    ins += [(jeq, 0, 1, sys_clone3), (ret, 0, 0, err(errno.ENOSYS))]
    for nr in with_flags:  # this syscall: refuse CLONE_NEWUSER in args[0], allow anything else
        ins += [(jeq, 0, 4, nr), (ld, 0, 0, 16), (jset, 0, 1, CLONE_NEWUSER), (ret, 0, 0, err(errno.EPERM))]
        ins += [(ret, 0, 0, allow)]
    # socketpair: the type (args[1], less SOCK_NONBLOCK/SOCK_CLOEXEC) must be SOCK_STREAM
    ins += [(jeq, 0, 5, _SOCKETPAIR[machine]), (ld, 0, 0, 24), (alu_and, 0, 0, SOCK_TYPE_MASK)]
    ins += [(jeq, 1, 0, SOCK_STREAM), (ret, 0, 0, err(errno.EAFNOSUPPORT)), (ret, 0, 0, allow)]
    ins += [(jeq, 0, 3, sys_socket), (ld, 0, 0, 16), (jeq, 0, 1, 1), (ret, 0, 0, err(errno.EAFNOSUPPORT))]
    ins += [(ret, 0, 0, allow)]
    return b"".join(struct.pack("=HBBI", *i) for i in ins)


def install_seccomp(program: bytes) -> None:
    class _Prog(ctypes.Structure):
        _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_char_p)]

    buf = ctypes.create_string_buffer(program, len(program))
    prog = _Prog(len(program) // 8, ctypes.cast(buf, ctypes.c_char_p))
    check(libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0), "prctl(NO_NEW_PRIVS)")
    check(libc.prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, ctypes.byref(prog), 0, 0), "seccomp")


def join_new_session_keyring() -> None:
    """Replace the session keyring inherited from the host by a new, empty one (for every job)."""
    import platform

    nr = {"x86_64": 250, "aarch64": 219}.get(platform.machine())
    if nr is None:
        return  # the job's seccomp filter refuses to start on an unknown architecture anyway
    libc.syscall.restype = ctypes.c_long
    if libc.syscall(nr, KEYCTL_JOIN_SESSION_KEYRING, None) < 0:
        err = ctypes.get_errno()
        if err not in (38, 1):  # ENOSYS / EPERM: no keyring support here, nothing to inherit
            raise OSError(err, f"keyctl(JOIN_SESSION_KEYRING): {os.strerror(err)}")

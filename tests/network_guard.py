"""The test suite never reaches the network: the Hub libraries are told they are offline, and this
process's sockets refuse every address that is not this machine.

:data:`OFFLINE_ENV` must be in the environment before ``huggingface_hub``, ``datasets`` or
``transformers`` is imported (they read it once, at import); child processes inherit it.
:func:`refuse_the_network` makes ``connect`` (and the name lookups before it) fail at once, with
:class:`NetworkRefused`, for anything but a loopback address, so a test that would download
fails in one line instead of hanging on a machine without a network or passing only with one.
"""

from __future__ import annotations

import ipaddress
import socket
from typing import Any

OFFLINE_ENV = {"HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
LOOPBACK_NAMES = {"localhost", "localhost.localdomain", "ip6-localhost", "ip6-loopback"}


class NetworkRefused(ConnectionRefusedError):
    """A test tried to reach another machine."""


def _is_loopback(host: Any) -> bool:
    if host is None:  # bind-style lookups (getaddrinfo(None, port)) name no remote host
        return True
    name = host.decode() if isinstance(host, bytes) else str(host)
    if name.lower() in LOOPBACK_NAMES or name == socket.gethostname():
        return True
    try:
        return ipaddress.ip_address(name.split("%")[0]).is_loopback
    except ValueError:  # a host name other than this machine's
        return False


def _checked(address: Any, family: int) -> None:
    if family in (socket.AF_INET, socket.AF_INET6) and not _is_loopback(address[0]):
        raise NetworkRefused(f"the test suite does not reach the network: connection to {address[:2]} refused")


def refuse_the_network() -> None:
    """Patch this process's ``socket`` module so only loopback addresses can be reached."""
    connect, connect_ex, getaddrinfo = socket.socket.connect, socket.socket.connect_ex, socket.getaddrinfo

    def guarded_connect(sock: socket.socket, address: Any) -> None:
        _checked(address, sock.family)
        return connect(sock, address)

    def guarded_connect_ex(sock: socket.socket, address: Any) -> int:
        _checked(address, sock.family)
        return connect_ex(sock, address)

    def guarded_getaddrinfo(host: Any, *args: Any, **kwargs: Any) -> list:
        if not _is_loopback(host):
            raise NetworkRefused(f"the test suite does not reach the network: lookup of {host!r} refused")
        return getaddrinfo(host, *args, **kwargs)

    socket.socket.connect = guarded_connect  # type: ignore[method-assign]
    socket.socket.connect_ex = guarded_connect_ex  # type: ignore[method-assign]
    socket.getaddrinfo = guarded_getaddrinfo

"""Network namespaces for partition tests: hosts that lose a network path while every process
of them lives.

A :class:`Lab` makes one namespace for the services (Redis, SeaweedFS, the gateway, a webhook
receiver) and one per worker host or client, each joined to a bridge in the services'
namespace by a veth pair. Every address (``10.77.0.0/24``) lives only in those namespaces, and
the lab removes them all (its processes die with them). Faults, per host namespace:
``cut(ns, port)`` drops the TCP traffic to and from one port of the services (``iptables``),
``heal(ns)`` restores it, ``throttle(ns, port, rate)`` makes a slow link to one port
(``tc``: ``htb`` and ``tbf``; this kernel has no ``netem``), ``unthrottle(ns)`` ends it.

Linux keeps the network namespace per thread: :meth:`Netns.run` runs a function on a thread
that entered the namespace (``setns``), so the sockets it opens live there, and so do the
processes it starts (a child inherits its thread's namespace).
"""

from __future__ import annotations

import ctypes
import os
import secrets
import shutil
import subprocess
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import TypeVar

import pytest

from tests.require import on_ci

T = TypeVar("T")
CLONE_NEWNET = 0x40000000
SUBNET = "10.77.0"
#: The services' address on the bridge.
SERVICES = f"{SUBNET}.1"


def require_lab() -> None:
    """Skip (fail on CI) unless this process may make namespaces and has the tools."""
    missing = [b for b in ("ip", "iptables", "tc") if shutil.which(b) is None]
    why = None
    if os.geteuid() != 0:
        why = "partition tests make network namespaces: run them as root"
    elif missing:
        why = (f"partition tests need {', '.join(missing)} (Debian packages iproute2, "
               "iptables)")
    if why is not None:
        if on_ci():
            pytest.fail(why)
        pytest.skip(why)


def _sh(*argv: str) -> None:
    done = subprocess.run(argv, capture_output=True, text=True, timeout=30)
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)}: {done.stderr.strip() or done.returncode}")


class Netns:
    """One network namespace and a thread inside it."""

    def __init__(self, name: str, address: str) -> None:
        self.name, self.address = name, address
        self._pool = ThreadPoolExecutor(1, thread_name_prefix=f"netns-{name}",
                                        initializer=self._enter)

    def _enter(self) -> None:
        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        fd = os.open(f"/run/netns/{self.name}", os.O_RDONLY)
        try:
            if libc.setns(fd, CLONE_NEWNET) != 0:
                raise OSError(ctypes.get_errno(), f"setns {self.name}")
        finally:
            os.close(fd)

    def run(self, fn: Callable[[], T], timeout: float = 600) -> T:
        """``fn()`` on this namespace's thread: its sockets and child processes live here."""
        return self._pool.submit(fn).result(timeout)

    def spawn(self, fn: Callable[[], T]) -> Future[T]:
        """``fn()`` on this namespace's thread, not waited for."""
        return self._pool.submit(fn)

    def twin(self) -> Netns:
        """Another thread in this namespace, with a queue of its own: for work that must not
        wait behind this thread's (close it; the lab closes only its own). A process started
        on it gets SIGKILL when it is closed (``PR_SET_PDEATHSIG`` follows the thread)."""
        return Netns(self.name, self.address)

    def exec(self, *argv: str) -> None:
        _sh("ip", "netns", "exec", self.name, *argv)

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)


class Lab:
    """The services' namespace and ``hosts`` others, joined by a bridge (module docstring)."""

    def __init__(self, hosts: tuple[str, ...]) -> None:
        tag = secrets.token_hex(3)
        self.services = Netns(f"ff{tag}svc", SERVICES)
        self.hosts = {h: Netns(f"ff{tag}{h}", f"{SUBNET}.{10 + i}") for i, h in enumerate(hosts)}
        self._made: list[str] = []

    def __enter__(self) -> Lab:
        try:
            self._build()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _build(self) -> None:
        svc = self.services.name
        for ns in (svc, *(h.name for h in self.hosts.values())):
            _sh("ip", "netns", "add", ns)
            self._made.append(ns)
            _sh("ip", "-n", ns, "link", "set", "lo", "up")
        _sh("ip", "-n", svc, "link", "add", "br0", "type", "bridge")
        _sh("ip", "-n", svc, "addr", "add", f"{SERVICES}/24", "dev", "br0")
        _sh("ip", "-n", svc, "link", "set", "br0", "up")
        for i, host in enumerate(self.hosts.values()):
            port = f"p{i}"
            _sh("ip", "link", "add", "eth0", "netns", host.name, "type", "veth", "peer", "name",
                port, "netns", svc)
            _sh("ip", "-n", svc, "link", "set", port, "master", "br0", "up")
            _sh("ip", "-n", host.name, "addr", "add", f"{host.address}/24", "dev", "eth0")
            _sh("ip", "-n", host.name, "link", "set", "eth0", "up")

    def cut(self, host: str, port: int) -> None:
        """Drop every packet between ``host`` and the services' TCP ``port``, both ways."""
        ns = self.hosts[host]
        ns.exec("iptables", "-I", "OUTPUT", "-d", SERVICES, "-p", "tcp", "--dport", str(port),
                "-j", "DROP")
        ns.exec("iptables", "-I", "INPUT", "-s", SERVICES, "-p", "tcp", "--sport", str(port),
                "-j", "DROP")

    def heal(self, host: str) -> None:
        """Every cut of ``host`` ends (its rules flushed)."""
        self.hosts[host].exec("iptables", "-F")

    def throttle(self, host: str, port: int, rate: str) -> None:
        """``host``'s traffic to the services' ``port`` through a token bucket (``tbf``) of
        ``rate`` (``"2mbit"``): an ``htb`` root sends it (a ``u32`` filter on the port) to a
        class of that rate with the ``tbf`` below it; the rest goes at full speed. (This
        kernel has neither ``netem`` nor ``prio``.)"""
        ns = self.hosts[host]
        tc = ("tc", "qdisc", "add", "dev", "eth0")
        ns.exec(*tc, "root", "handle", "1:", "htb", "default", "10", "r2q", "1000")
        ns.exec("tc", "class", "add", "dev", "eth0", "parent", "1:", "classid", "1:10", "htb",
                "rate", "10gbit")
        ns.exec("tc", "class", "add", "dev", "eth0", "parent", "1:", "classid", "1:20", "htb",
                "rate", rate, "ceil", rate)
        ns.exec(*tc, "parent", "1:20", "handle", "20:", "tbf", "rate", rate, "burst", "16kb",
                "latency", "200ms")
        ns.exec("tc", "filter", "add", "dev", "eth0", "parent", "1:", "protocol", "ip", "u32",
                "match", "ip", "dport", str(port), "0xffff", "flowid", "1:20")

    def unthrottle(self, host: str) -> None:
        """Every throttle of ``host`` ends (its root qdisc removed)."""
        self.hosts[host].exec("tc", "qdisc", "del", "dev", "eth0", "root")

    def close(self) -> None:
        for ns in (self.services, *self.hosts.values()):
            ns.close()
        while self._made:
            subprocess.run(["ip", "netns", "del", self._made.pop()], capture_output=True,
                           timeout=30)

"""The control wire between the ranks of one host: a Unix socket to every other rank (abstract namespace, so
nothing is left on disk), carrying small fixed-size tokens. The data itself moves through shared memory
(netcl.distributed.shm); the sockets say when it is there, and their end of file says a rank has gone.

A wait selects on every peer at once, so a rank that dies (an exception, a crash, kill -9: the kernel closes
its sockets) is seen at once by everyone waiting, and a rank that never arrives is named when the timeout
runs out. The rank that finds a fault first tells the others which rank it was, so every rank names the
same culprit rather than the neighbour that gave up before it.
"""

from __future__ import annotations

import os
import select
import socket
import struct
import time
from collections import deque

from netcl.errors import DistributedError

# kind, sequence number, value, extra: every token is 24 bytes
TOKEN = struct.Struct("<IIQQ")
HELLO, SYNC, FAULT = 1, 2, 3
# FAULT tokens carry what went wrong in `value` and the ranks it names as a bit mask in `extra`
GONE, TIMEOUT, MISMATCH = 1, 2, 3


def _mask(ranks: set[int] | list[int]) -> int:
    return sum(1 << r for r in ranks)


def _ranks(mask: int) -> list[int]:
    return [r for r in range(64) if mask >> r & 1]


class Mesh:
    """Sockets from this rank to every other rank of the job `job` (world size <= 64)."""

    def __init__(self, rank: int, world: int, job: str, timeout: float):
        if not 1 <= world <= 64:
            raise DistributedError(
                f"the shared-memory backend runs 1 to 64 ranks on one host, asked for {world}"
            )
        self.rank, self.world, self.job, self.timeout = rank, world, job, timeout
        self.socks: dict[int, socket.socket] = {}
        self.pids: dict[int, int] = {}
        self.closed: set[int] = set()  # peers whose connection ended (they exited)
        self._inbox: dict[int, deque[tuple[int, int, int, int]]] = {}
        self._partial: dict[int, bytes] = {}
        self.failed: DistributedError | None = None
        self._reported: tuple[int, int, list[int]] | None = None  # a FAULT token read: (reporter, how, ranks)
        self._connect()

    # -- rendezvous ---------------------------------------------------------------------------------------
    def _address(self, rank: int) -> str:
        return f"\0{self.job}-rank{rank}"

    def _connect(self) -> None:
        deadline = time.monotonic() + self.timeout
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            try:
                listener.bind(self._address(self.rank))
            except OSError as exc:
                raise DistributedError(
                    f"rank {self.rank} of job {self.job} cannot "
                    f"listen: {exc} (is another process already rank "
                    f"{self.rank} of this job? Each `netcl run` gets a fresh job id)"
                ) from None
            listener.listen(self.world)
            for peer in range(self.rank):  # connect to the lower ranks, accept the higher ones
                sock = self._dial(peer, deadline)
                self._add(peer, sock, self.pids[peer])
            listener.settimeout(0.2)
            while len(self.socks) < self.world - 1:
                try:
                    conn, _ = listener.accept()
                except TimeoutError:
                    if time.monotonic() > deadline:
                        missing = sorted(set(range(self.world)) - set(self.socks) - {self.rank})
                        raise DistributedError(
                            f"rank(s) {missing} did not join job {self.job} within {self.timeout:g} s "
                            "(NETCL_DIST_TIMEOUT); did every rank start and call netcl.distributed.init()?",
                            tuple(missing)) from None
                    continue
                conn.settimeout(max(deadline - time.monotonic(), 0.1))
                kind, _, peer, pid = TOKEN.unpack(self._recv_exact(conn, TOKEN.size))
                if kind != HELLO or not 0 <= peer < self.world or peer in self.socks or peer == self.rank:
                    conn.close()
                    raise DistributedError(
                        f"rank {self.rank} of job {self.job}: a bad greeting (rank {peer})"
                    )
                conn.sendall(TOKEN.pack(HELLO, 0, self.rank, os.getpid()))
                self._add(peer, conn, pid)
        finally:
            listener.close()

    def _dial(self, peer: int, deadline: float) -> socket.socket:
        while True:
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            try:
                sock.connect(self._address(peer))
                sock.sendall(TOKEN.pack(HELLO, 0, self.rank, os.getpid()))
                sock.settimeout(max(deadline - time.monotonic(), 0.1))
                kind, _, rank, pid = TOKEN.unpack(self._recv_exact(sock, TOKEN.size))
                if kind != HELLO or rank != peer:
                    raise DistributedError(
                        f"rank {self.rank} of job {self.job}: a bad greeting from rank {peer}"
                    )
                self.pids[peer] = pid
                return sock
            except (ConnectionRefusedError, FileNotFoundError):
                sock.close()
                if time.monotonic() > deadline:
                    raise DistributedError(
                        f"rank {peer} did not join job {self.job} within {self.timeout:g} s "
                        f"(NETCL_DIST_TIMEOUT); "
                        "did every rank start and call netcl.distributed.init()?",
                        (peer,),
                    ) from None
                time.sleep(0.01)

    @staticmethod
    def _recv_exact(sock: socket.socket, n: int) -> bytes:
        data = b""
        while len(data) < n:
            part = sock.recv(n - len(data))
            if not part:
                raise DistributedError("a rank closed its connection while joining the job")
            data += part
        return data

    def _add(self, peer: int, sock: socket.socket, pid: int = 0) -> None:
        sock.setblocking(True)
        sock.settimeout(None)
        self.socks[peer] = sock
        self.pids[peer] = pid
        self._inbox[peer] = deque()
        self._partial[peer] = b""

    # -- tokens ---------------------------------------------------------------------------------------------
    def _describe(self, rank: int) -> str:
        pid = self.pids.get(rank)
        return f"rank {rank}" + (f" (pid {pid})" if pid else "")

    def fail(self, message: str, ranks: list[int] | tuple[int, ...], what: int) -> DistributedError:
        """Tell every peer still connected which ranks failed and how, and return the error to raise (it also
        makes every later call on this mesh raise it)."""
        if self.failed is None:
            self.failed = DistributedError(message, tuple(ranks))
            token = TOKEN.pack(FAULT, 0, what, _mask(ranks))
            for peer, sock in self.socks.items():
                if peer not in self.closed:
                    try:
                        sock.sendall(token)
                    except OSError:
                        pass
        return self.failed

    def send(self, peers: list[int] | range, kind: int, seq: int, value: int, extra: int, what: str) -> None:
        """Send a token to each of `peers`. A peer that has gone is only noted here: the wait that needs it
        raises, after reading what the others sent (a rank that left because of a fault says which)."""
        if self.failed is not None:
            raise self.failed
        token = TOKEN.pack(kind, seq & 0xFFFFFFFF, value, extra)
        for peer in peers:
            if peer == self.rank or peer in self.closed:
                continue
            try:
                self.socks[peer].sendall(token)
            except OSError:
                self.closed.add(peer)

    def _gone(self, peer: int, what: str) -> str:
        return (f"{self._describe(peer)} closed its connection before {what}: it exited (an error, a crash, "
                f"kill) or finished without taking part; rank {self.rank} cannot go on")

    def wait(self, peers: list[int] | range, kind: int, seq: int, value: int, extra: int, what: str,
             describe: object = None) -> None:
        """Wait for a (kind, seq) token from each of `peers`; their value and extra must equal ours (the ranks
        agree on the call). Raises DistributedError naming the ranks that did not come within the timeout,
        or that went away, or that disagree."""
        if self.failed is not None:
            raise self.failed
        need = {p for p in peers if p != self.rank}
        deadline = time.monotonic() + self.timeout
        seq &= 0xFFFFFFFF
        while True:
            self._take(need, kind, seq, value, extra, what, describe)
            if not need:
                return
            if self._reported is not None:
                # another rank found a fault: finish this call if the tokens it needs are on their way, else
                # stop
                self._poll(0.1, what)
                self._take(need, kind, seq, value, extra, what, describe)
                if not need:
                    return
                self._raise_reported(what)
            gone = [p for p in sorted(need) if p in self.closed]
            if gone:
                self._poll(0.05, what)  # a rank that left on a fault has told the others why: read it first
                if self._reported is not None:
                    continue
                raise self.fail(self._gone(gone[0], what), gone, GONE)
            left = deadline - time.monotonic()
            if left <= 0:
                missing = sorted(need)
                names = ", ".join(self._describe(p) for p in missing)
                raise self.fail(
                    f"{names} did not reach {what} within {self.timeout:g} s (NETCL_DIST_TIMEOUT); "
                    f"{'it' if len(missing) == 1 else 'they'} may "
                    f"be hung, or busy much longer than the others "
                    f"(rank {self.rank} waited)",
                    missing,
                    TIMEOUT,
                )
            self._poll(min(left, 1.0), what)

    def _take(self, need: set[int], kind: int, seq: int, value: int, extra: int, what: str,
              describe: object) -> None:
        """Use the tokens already read from the peers in `need` (removing those that sent theirs)."""
        for peer in sorted(need):
            box = self._inbox[peer]
            if not box:
                continue
            k, s, v, x = box.popleft()
            if (k, s) != (kind, seq) or (v, x) != (value, extra):
                ours = describe(value, extra) if callable(describe) else f"({kind}, {seq}, {value}, {extra})"
                theirs = describe(v, x) if callable(describe) and (k, s) == (kind, seq) else \
                    f"another call (token {k}, #{s})"
                raise self.fail(
                    f"the ranks disagree at {what}: rank {self.rank} called {ours}, rank {peer} called "
                    f"{theirs}; every rank must make the same collective calls in the same order",
                    [peer], MISMATCH)
            need.discard(peer)

    def _poll(self, seconds: float, what: str) -> None:
        """Read whatever the peers sent within `seconds` (a FAULT token raises)."""
        live = [self.socks[p] for p in self.socks if p not in self.closed]
        if not live:
            return
        readable, _, _ = select.select(live, [], [], seconds)
        for sock in readable:
            self._read(next(p for p, s in self.socks.items() if s is sock), what)

    def _read(self, peer: int, what: str) -> None:
        try:
            data = self.socks[peer].recv(1 << 16)
        except OSError:
            data = b""
        if not data:
            self.closed.add(peer)
            return
        buf = self._partial[peer] + data
        whole = len(buf) - len(buf) % TOKEN.size
        for off in range(0, whole, TOKEN.size):
            token = TOKEN.unpack_from(buf, off)
            if token[0] == FAULT:
                if self._reported is None:
                    self._reported = (peer, token[2], _ranks(token[3]))
                continue
            self._inbox[peer].append(token)
        self._partial[peer] = buf[whole:]

    def _raise_reported(self, what: str) -> None:
        reporter, how, ranks = self._reported
        names = ", ".join(self._describe(r) if r != self.rank else f"rank {r} (this one)" for r in ranks)
        reason = {GONE: "exited or was killed", TIMEOUT: f"did not answer within {self.timeout:g} s",
                  MISMATCH: "made a different collective call"}.get(how, "failed")
        self.failed = DistributedError(
            f"{names} {reason} (found by rank {reporter}); rank {self.rank} stops at {what}", tuple(ranks)
        )
        raise self.failed

    def close(self) -> None:
        for sock in self.socks.values():
            try:
                sock.close()
            except OSError:
                pass
        self.socks.clear()

"""The datagram half of a DHT node: turns datagrams into awaitable requests.

:class:`DhtEndpoint` feeds every datagram from its transport to the sans-IO
:class:`~._node.NodeCore`, sends what the core returns (from the probe socket
when the core says so), fires the core's request timeouts and housekeeping on
a timer, and turns the core's request ids into awaitable requests
(:meth:`DhtEndpoint.request`). What a node does with requests (joining,
reachability, lookups, announcing) is :class:`~._driver.DhtNode`, built on it.

Time: the core works in unix seconds (records carry unix ``expires``). The
driver derives them from trio's clock (``origin + trio.current_time()``), so
under the autojump clock a whole network's TTLs and refreshes run in virtual
time.
"""

from __future__ import annotations

import logging
import math
import random
import time
from collections.abc import Callable
from dataclasses import dataclass

import trio

from ._contact import Contact
from ._errors import DhtError, DhtUsageError
from ._messages import Command, Response
from ._node import NodeConfig, NodeCore, Outgoing
from ._transport import DatagramTransport

__all__ = ["DhtEndpoint", "DhtTimeout"]

log = logging.getLogger(__name__)

Address = tuple[str, int]

#: How often the timer loop runs housekeeping (record expiry, bucket-head pings).
MAINTENANCE_EVERY_S = 5.0


# Every node of one trio run shares one mapping from trio's clock to unix time.
# Per-node origins drift apart when nodes are built over a long wall-clock span
# under a virtual clock (a 10,000-node testnet took 24 minutes to build): a
# node whose origin was taken later then signs records that expire "too far"
# ahead for nodes built earlier, and they refuse them (EXPIRES_TOO_FAR).
_ORIGIN = trio.lowlevel.RunVar("p2p_dht_clock_origin")


def _clock_origin() -> float:
    try:
        return _ORIGIN.get()
    except LookupError:
        origin = time.time() - trio.current_time()
        _ORIGIN.set(origin)
        return origin


class DhtTimeout(DhtError):
    """A request got no answer in time."""

    code = "TIMEOUT"


@dataclass
class _Waiter:
    event: trio.Event
    response: Response | None = None
    contact: Contact | None = None


#: Told of a request's end by the receive loop (an answer) or the timer loop
#: (``None, None``: timed out). Runs inline in that loop, so it must not block;
#: a walk's many requests need no task and no event each this way.
AnswerCallback = Callable[[Contact | None, Response | None], None]


class DhtEndpoint:
    """The datagram I/O and request matching of one DHT node over one transport.

    Args:
        transport: a bound UDP or in-memory transport; owned by the endpoint.
        persistent: True for nodes others may store (see :class:`~._driver.DhtNode`).
        reachable: True to skip the reachability check.
        config: protocol parameters.
        rng: seeded randomness for tests.

    Its loops (:meth:`_receive_loop`, :meth:`_timer_loop`) run in the
    nursery of :meth:`~._driver.DhtNode.run`.
    """

    def __init__(
        self,
        transport: DatagramTransport,
        *,
        persistent: bool = False,
        reachable: bool = False,
        config: NodeConfig | None = None,
        rng: random.Random | None = None,
    ) -> None:
        self.transport = transport
        self._probe_transport: DatagramTransport | None = None
        self._probe_lock = trio.Lock()
        self.config = config or NodeConfig()
        self._rng = rng or random.Random()
        self._origin = _clock_origin()
        # A persistent node bound to a wildcard address learns its address from
        # replies first and stays ephemeral (sends no id) until then.
        bound = transport.local_address
        address = bound if persistent and bound[0] not in ("0.0.0.0", "::") else None
        self.core = NodeCore(
            now=self.now(),
            config=self.config,
            persistent=persistent,
            address=address,
            reachable=reachable,
            rng=self._rng,
            token_seed=self._rng.randbytes(32),
        )
        self._waiters: dict[int, _Waiter | AnswerCallback] = {}
        #: Set (and replaced) whenever the address others see us at changes.
        self._address_changed = trio.Event()
        #: Set (and replaced) whenever the node turns reachable.
        self._became_reachable = trio.Event()
        #: The timer loop's next wake-up (trio time) and the event that cuts it short.
        self._timer_wake_at = math.inf
        self._timer_poke = trio.Event()

    # -- lifetime --------------------------------------------------------------

    def now(self) -> float:
        """Unix seconds on trio's clock."""
        return self._origin + trio.current_time()

    @property
    def address(self) -> Address | None:
        return self.core.address

    @property
    def persistent(self) -> bool:
        """True while others may store us: persistent, address known, reachable."""
        return self.core.advertised_id is not None

    async def _close_transports(self) -> None:
        await self.transport.aclose()
        if self._probe_transport is not None:
            await self._probe_transport.aclose()

    # -- loops ---------------------------------------------------------------

    async def _receive_loop(self) -> None:
        while True:
            try:
                data, source = await self.transport.receive()
            except (trio.ClosedResourceError, trio.BrokenResourceError):
                return
            address_before, reachable_before = self.core.address, self.core.reachable
            outgoing, event = self.core.receive_datagram(data, source, self.now())
            if self.core.address != address_before:
                log.info("dht.address_changed old=%s new=%s", address_before, self.core.address)
                changed, self._address_changed = self._address_changed, trio.Event()
                changed.set()
            if self.core.reachable and not reachable_before:
                became, self._became_reachable = self._became_reachable, trio.Event()
                became.set()
            for datagram in outgoing:
                await self._send(datagram)
            if event is not None:
                waiter = self._waiters.pop(event.tid, None)
                if type(waiter) is _Waiter:
                    waiter.response = event.response
                    waiter.contact = event.contact
                    waiter.event.set()
                elif waiter is not None:
                    waiter(event.contact, event.response)

    async def _timer_loop(self) -> None:
        next_maintenance = trio.current_time() + MAINTENANCE_EVERY_S
        while True:
            deadline = self.core.next_deadline()
            wake = next_maintenance
            if deadline is not None:
                wake = min(wake, deadline - self._origin)
            # A request made while we sleep may expire sooner than `wake`:
            # request() pokes us then, so timeouts fire on time, not at the
            # next maintenance.
            self._timer_wake_at = wake
            with trio.move_on_at(wake):
                await self._timer_poke.wait()
            self._timer_poke = trio.Event()
            for tid in self.core.expire(self.now()):
                waiter = self._waiters.pop(tid, None)
                if type(waiter) is _Waiter:
                    waiter.event.set()  # no response: the requester times out
                elif waiter is not None:
                    waiter(None, None)
            if trio.current_time() >= next_maintenance:
                next_maintenance = trio.current_time() + MAINTENANCE_EVERY_S
                for datagram in self.core.maintenance(self.now()):
                    await self._send(datagram)
                # Kademlia §2.3: refresh buckets nobody looked into for a while
                # with a lookup of a random id in their range.
                for key in self.core.routing.stale_buckets(self.now()):
                    self._bucket_stale(key)

    def _bucket_stale(self, key: bytes) -> None:
        """The timer loop found a bucket nobody looked into for a while:
        ``key`` is a random id in its range. An endpoint alone does nothing;
        :class:`~._driver.DhtNode` walks to it."""

    # -- requests ------------------------------------------------------------

    def _wake_timer_by(self, unix_deadline: float) -> None:
        if unix_deadline - self._origin < self._timer_wake_at:
            self._timer_wake_at = unix_deadline - self._origin
            self._timer_poke.set()

    async def _send(self, datagram: Outgoing) -> None:
        if not datagram.from_probe_socket:
            await self.transport.send(datagram.data, datagram.address)
            return
        async with self._probe_lock:  # opened on first use, by one task
            if self._probe_transport is None:
                try:
                    self._probe_transport = await self.transport.open_sibling()
                except OSError as exc:
                    log.warning("dht.probe_socket_failed error=%s", exc)
                    return
        await self._probe_transport.send(datagram.data, datagram.address)

    async def request(
        self,
        command: Command,
        address: Address,
        *,
        target: bytes | None = None,
        token: bytes | None = None,
        value: object = None,
        retries: int = 0,
    ) -> tuple[Contact, Response]:
        """Send one request and wait for its answer, resending up to ``retries`` times.

        Lookups use no retries (a silent node is simply skipped, and α others
        are asked meanwhile); single requests to a known node may use a few.

        Raises:
            DhtTimeout: no answer within the request timeout, on every try.
        """
        for _attempt in range(retries + 1):
            tid, datagram = self.core.make_request(
                command, address, self.now(), target=target, token=token, value=value
            )
            self._wake_timer_by(self.now() + self.config.request_timeout_s)
            waiter = _Waiter(trio.Event())
            self._waiters[tid] = waiter
            try:
                await self._send(datagram)
                await waiter.event.wait()
            finally:
                if self._waiters.pop(tid, None) is not None:
                    self.core.cancel(tid)
            if waiter.response is not None and waiter.contact is not None:
                return waiter.contact, waiter.response
        raise DhtTimeout(f"no answer from {address[0]}:{address[1]} after {retries + 1} tries")

    async def send_request(
        self,
        command: Command,
        address: Address,
        on_answer: AnswerCallback,
        *,
        target: bytes | None = None,
    ) -> int:
        """Send one request without waiting for it: ``on_answer(contact, response)``
        is called from the receive loop when it is answered, or ``(None, None)``
        from the timer loop when it times out (see :data:`AnswerCallback`).
        For walks, which keep α requests in flight from one task.

        Returns:
            The request id, for :meth:`forget_request`.

        Raises:
            DhtUsageError: ``TOO_MANY_PENDING`` (see :meth:`NodeCore.make_request`).
        """
        tid, datagram = self.core.make_request(command, address, self.now(), target=target)
        self._wake_timer_by(self.now() + self.config.request_timeout_s)
        self._waiters[tid] = on_answer
        try:
            await self._send(datagram)
        except BaseException:
            self.forget_request(tid)
            raise
        return tid

    def forget_request(self, tid: int) -> None:
        """Drop a request sent with :meth:`send_request`: its callback will not be
        called, and a late answer is ignored."""
        if self._waiters.pop(tid, None) is not None:
            self.core.cancel(tid)

    async def _ask_for_probe(self, address: Address) -> None:
        """Ask ``address`` to probe us from another socket (a reachability
        check); returns at its answer or its timeout, whichever comes first."""
        try:
            tid, datagram = self.core.make_reach_check(address, self.now())
        except DhtUsageError:
            return
        self._wake_timer_by(self.now() + self.config.request_timeout_s)
        waiter = _Waiter(trio.Event())
        self._waiters[tid] = waiter
        try:
            await self._send(datagram)
            await waiter.event.wait()  # the answer or its timeout; the probe matters
        finally:
            if self._waiters.pop(tid, None) is not None:
                self.core.cancel(tid)

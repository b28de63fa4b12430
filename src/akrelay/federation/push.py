"""Push subscriptions: a peer's stream of announcements triggers an immediate pull from it.

A peer that advertises the ``push`` feature (``endpoints.stream``, see
:mod:`akrelay.http.stream`) is subscribed to by the sync leader: one thread per
such peer holds its stream open from our checkpoint on. An announcement of a
``seq`` beyond what we have wakes that peer's sync loop, which then runs the
ordinary pass (discovery, ``after_seq`` enumeration, verification: exactly what
a poll runs), so nothing announced is ever taken on the stream's word. The
periodic poll stays as the safety net, and is all a peer without a stream gets.

Bounded whatever the peer sends:

* announcements only set a flag, so any number of them cost at most one pass
  in flight and one waiting (coalesced), and passes started by announcements
  are at least :data:`MIN_GAP` apart;
* lines longer than :data:`MAX_LINE` bytes, more than :data:`MAX_BAD_FRAMES`
  unusable frames, or a body that is not ``text/event-stream`` end the
  connection; frames are read at most :data:`MAX_FRAMES_PER_SECOND` (beyond,
  the reader slows down, and TCP slows the peer);
* a silent stream (no heartbeat) ends after ``idle`` seconds, any stream after
  :data:`MAX_LIFETIME`; reconnecting backs off exponentially up to :data:`MAX_BACKOFF`
  (or the peer's Retry-After);
* a peer whose announcements outrun the checkpoint its own query then reports
  (:data:`MAX_FALSE_ANNOUNCEMENTS` passes in a row) is not listened to for
  :data:`SUSPEND_SECONDS`: it is polled.
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass, field
from typing import Callable

from akrelay.federation.peers import Peer
from akrelay.federation.transport import PeerFetchError, PeerTransport, parse_retry_after

log = logging.getLogger("akrelay.federation")

#: Longest line of a stream (an announcement is about 120 bytes).
MAX_LINE = 4096
#: Frames without a usable seq tolerated on one connection.
MAX_BAD_FRAMES = 64
#: Frames parsed per second at most; a faster stream is read more slowly.
MAX_FRAMES_PER_SECOND = 5000
#: Seconds between two passes started by announcements (a flood coalesces into these).
MIN_GAP = 0.02
#: Longest wait before reconnecting a stream (a Retry-After up to an hour is honoured).
MAX_BACKOFF = 60.0
FIRST_BACKOFF = 0.5
#: A connection that lasted this long was healthy: the next reconnect starts from FIRST_BACKOFF.
HEALTHY_SECONDS = 30.0
#: Longest life of one stream connection (the peer ends its streams earlier; then we resume).
MAX_LIFETIME = 1800.0
#: Passes in a row after which a stream whose announcements outrun the peer's checkpoint is dropped.
MAX_FALSE_ANNOUNCEMENTS = 3
SUSPEND_SECONDS = 300.0


class StreamError(Exception):
    """The stream broke a rule of its format; the connection ends."""


class SseParser:
    """Server-sent event frames from raw bytes (WHATWG HTML §9.2), with a line-length bound.

    Yields ``(event, id, data)`` per dispatched frame; comments (heartbeats) yield nothing.
    """

    def __init__(self, max_line: int = MAX_LINE) -> None:
        self.max_line = max_line
        self._buffer = bytearray()
        self._event = ""
        self._id = ""
        self._data: list[str] = []
        self._data_bytes = 0
        self.comments = 0

    def feed(self, chunk: bytes) -> list[tuple[str, str, str]]:
        """The frames that ``chunk`` completes (a line may span chunks; CRLF, CR and LF all end one)."""
        buffer = self._buffer
        buffer += chunk
        frames: list[tuple[str, str, str]] = []
        pos, size = 0, len(buffer)
        while pos < size:
            lf = buffer.find(b"\n", pos)
            cr = buffer.find(b"\r", pos, lf if lf >= 0 else size)
            if cr >= 0:
                if cr + 1 == size:  # is it CRLF? the next chunk says
                    break
                end, after = cr, cr + (2 if buffer[cr + 1] == 0x0A else 1)
            elif lf >= 0:
                end, after = lf, lf + 1
            else:
                break
            frame = self._line(bytes(buffer[pos:end]))
            pos = after
            if frame is not None:
                frames.append(frame)
        del buffer[:pos]
        if len(buffer) > self.max_line:
            raise StreamError(f"a stream line is longer than {self.max_line} bytes")
        return frames

    def _line(self, raw: bytes) -> tuple[str, str, str] | None:
        if len(raw) > self.max_line:
            raise StreamError(f"a stream line is longer than {self.max_line} bytes")
        try:
            line = raw.decode("utf-8")
        except UnicodeDecodeError:
            raise StreamError("a stream line is not UTF-8") from None
        if not line:
            frame = (self._event or "message", self._id, "\n".join(self._data)) if self._data or self._event else None
            self._event, self._data, self._data_bytes = "", [], 0
            return frame
        if line.startswith(":"):
            self.comments += 1
            return None
        name, _, value = line.partition(":")
        value = value[1:] if value.startswith(" ") else value
        if name == "event":
            self._event = value
        elif name == "data":
            self._data_bytes += len(value)
            if self._data_bytes > self.max_line:
                raise StreamError(f"a stream frame's data is longer than {self.max_line} bytes")
            self._data.append(value)
        elif name == "id" and "\0" not in value:
            self._id = value
        return None


def announced_seq(event: str, event_id: str) -> int | None:
    """The ``seq`` a frame announces (``record`` and ``checkpoint`` frames, by their id), else ``None``."""
    if event not in ("record", "checkpoint"):
        return None
    if not (event_id.isascii() and event_id.isdigit()) or len(event_id) > 16:
        return None
    return int(event_id)


@dataclass
class _PeerPush:
    """One push-capable peer: where its stream is, what it announced, and its subscriber."""

    peer: Peer
    url: str
    #: our checkpoint of the peer (updated after each pass); announcements at or below it are old news
    position: int = 0
    #: the highest seq announced
    announced: int = 0
    #: the highest seq announced before the current pass began: that pass must find the peer at least there
    judged: int = 0
    wake: threading.Event = field(default_factory=threading.Event)
    halt: threading.Event = field(default_factory=threading.Event)
    thread: threading.Thread | None = None
    status: str = "polled (stream not yet connected)"
    false_announcements: int = 0
    suspended_until: float = 0.0
    abort: Callable[[], None] | None = None
    #: the passes' own transport, kept between passes while pushed (no new TLS session per announcement)
    kept: PeerTransport | None = None
    connections: int = 0
    frames: int = 0


class PushHub:
    """The push subscriptions of one sync engine (one thread per push-capable peer)."""

    def __init__(self, transport_factory: Callable[[Peer], PeerTransport] = PeerTransport, *,
                 clock: Callable[[], float] = time.monotonic, min_gap: float = MIN_GAP) -> None:
        self.transport_factory = transport_factory
        self.clock = clock
        self.min_gap = min_gap
        self._peers: dict[str, _PeerPush] = {}
        self._lock = threading.Lock()
        self._closed = False

    # -- the sync loop's side ----------------------------------------------------------
    def after_pass(self, peer: Peer, stream_url: str | None, checkpoint: int, peer_checkpoint: int, ok: bool) -> None:
        """After a pass: subscribe to a newly advertised stream, note our position, judge the announcements."""
        with self._lock:
            if self._closed:
                return
            entry = self._peers.get(peer.origin)
            if stream_url is None:
                if entry is not None and ok:  # no longer advertised
                    self._drop(entry)
                    del self._peers[peer.origin]
                return
            if entry is None or entry.url != stream_url:
                if entry is not None:
                    self._drop(entry)
                entry = self._peers[peer.origin] = _PeerPush(peer, stream_url, position=checkpoint)
            entry.position = max(entry.position, checkpoint)
            if ok and entry.judged > peer_checkpoint:
                entry.false_announcements += 1
                if entry.false_announcements >= MAX_FALSE_ANNOUNCEMENTS:
                    reason = (f"its stream announced seq {entry.judged}, beyond the checkpoint {peer_checkpoint} "
                              "its query then reported")
                    log.warning("sync %s: %s; not listening to it for %.0f s", peer.origin, reason, SUSPEND_SECONDS)
                    entry.status = f"polled (stream suspended: {reason})"
                    entry.suspended_until = self.clock() + SUSPEND_SECONDS
                    entry.announced = entry.judged = 0
                    entry.false_announcements = 0
                    if entry.abort is not None:
                        entry.abort()
            elif ok:
                entry.false_announcements = 0
            if entry.thread is None:
                entry.thread = threading.Thread(target=self._subscribe, args=(entry,), daemon=True,
                                                name=f"push {peer.origin}")
                entry.thread.start()

    def wait(self, origin: str, stop: threading.Event, timeout: float, *, wakeable: bool = True) -> bool:
        """Wait up to ``timeout`` s for an announcement from ``origin`` (or ``stop``); whether one came.

        The flag is cleared here, so announcements made during the pass that follows wake the next one.
        """
        entry = self._peers.get(origin)
        if entry is None or not wakeable:
            stop.wait(timeout)
            return False
        end = self.clock() + timeout
        woke = False
        while not stop.is_set():
            left = end - self.clock()
            if left <= 0:
                break
            if entry.wake.wait(min(left, 0.5)):
                woke = True
                break
        if woke:
            stop.wait(self.min_gap)  # gather what else arrives meanwhile into the same pass
        entry.wake.clear()
        # Everything announced up to now was committed before the pass that follows reads the peer's checkpoint
        # (later announcements wake the next pass), so that checkpoint must be at least this.
        entry.judged = entry.announced
        return woke

    def transport(self, peer: Peer) -> PeerTransport | _Kept:
        """The context manager a pass of ``peer`` reads through: while pushed, one transport kept across passes.

        Passes of one peer run one at a time (its loop thread), so the kept transport is never shared.
        """
        entry = self._peers.get(peer.origin)
        if entry is None or entry.status != "pushed" or entry.halt.is_set():
            return self.transport_factory(peer)
        if entry.kept is None:
            entry.kept = self.transport_factory(peer)
        return _Kept(entry.kept)

    def describe(self, origin: str, *, advertised: bool = False) -> str:
        """How the peer's news reaches us, for ``peers status`` (``advertised``: its discovery lists a stream)."""
        entry = self._peers.get(origin)
        if entry is not None:
            return entry.status
        # a one-off pass (`akrelay sync --once`), or the loop's first pass: the subscription comes after it
        return "polled (push stream advertised, not subscribed)" if advertised else "polled (no push stream advertised)"

    def pushed(self, origin: str) -> bool:
        entry = self._peers.get(origin)
        return entry is not None and entry.status == "pushed"

    def close(self) -> None:
        with self._lock:
            self._closed = True
            entries = list(self._peers.values())
            self._peers.clear()
        for entry in entries:
            self._drop(entry)
        for entry in entries:
            if entry.thread is not None:
                entry.thread.join(5.0)

    def _drop(self, entry: _PeerPush) -> None:
        entry.halt.set()
        entry.wake.set()
        if entry.abort is not None:
            entry.abort()
        kept, entry.kept = entry.kept, None
        if kept is not None:
            kept.close()

    # -- the subscriber thread -----------------------------------------------------------
    def _subscribe(self, entry: _PeerPush) -> None:
        delay = FIRST_BACKOFF
        while not entry.halt.is_set():
            pause = entry.suspended_until - self.clock()
            if pause > 0:
                entry.halt.wait(pause)
                continue
            opened = self.clock()
            wait: float | None = None
            try:
                self._listen(entry)
                status = "polled (stream ended; reconnecting)"
            except PeerFetchError as exc:
                status = f"polled (stream: {exc})"[:300]
                wait = parse_retry_after(exc.retry_after, time.time())
            except StreamError as exc:
                status = f"polled (stream: {exc})"[:300]
            except Exception as exc:  # noqa: BLE001 - a bug must not end the subscription silently
                log.exception("push stream of %s failed", entry.peer.origin)
                status = f"polled (stream: internal error {type(exc).__name__})"
            finally:
                entry.abort = None
            if self.clock() >= entry.suspended_until:  # a suspension's reason stays until it ends
                entry.status = status
            if entry.halt.is_set():
                break
            if self.clock() - opened >= HEALTHY_SECONDS:
                delay = FIRST_BACKOFF
            entry.halt.wait(min(max(delay, wait or 0.0), 3600.0))
            delay = min(delay * 2, MAX_BACKOFF)
        entry.status = "polled"

    def _listen(self, entry: _PeerPush) -> None:
        """One connection: read frames until it ends; announcements beyond our position wake the loop."""
        peer = entry.peer
        idle = max(3 * 15.0, peer.read_timeout)
        parser = SseParser()
        bad = 0
        window_start, window_frames = self.clock(), 0
        with self.transport_factory(peer) as transport:
            chunks = transport.stream_chunks(entry.url, {"after_seq": str(entry.position)}, idle_timeout=idle,
                                             lifetime=MAX_LIFETIME, on_open=lambda abort: _set_abort(entry, abort))
            for chunk in chunks:
                if entry.halt.is_set() or self.clock() < entry.suspended_until:
                    return
                if entry.status != "pushed":
                    entry.status = "pushed"
                    entry.connections += 1
                for event, event_id, _data in parser.feed(chunk):
                    window_frames += 1
                    entry.frames += 1
                    seq = announced_seq(event, event_id)
                    if seq is None:
                        bad += 1
                        if bad > MAX_BAD_FRAMES:
                            raise StreamError(f"more than {MAX_BAD_FRAMES} frames without an announced seq")
                    elif seq > entry.position and seq > entry.announced:
                        entry.announced = seq
                        entry.wake.set()
                    elif seq > entry.position:
                        entry.wake.set()
                    if window_frames >= MAX_FRAMES_PER_SECOND:  # a flood: read no faster than this
                        spent = self.clock() - window_start
                        if spent < 1.0:
                            entry.halt.wait(1.0 - spent)
                        window_start, window_frames = self.clock(), 0


class _Kept:
    """A kept transport as a context manager that leaves it open."""

    def __init__(self, transport: PeerTransport) -> None:
        self.transport = transport

    def __enter__(self) -> PeerTransport:
        return self.transport

    def __exit__(self, *exc: object) -> None:
        pass


def _set_abort(entry: _PeerPush, abort: Callable[[], None]) -> None:
    entry.abort = abort
    if entry.halt.is_set():
        abort()

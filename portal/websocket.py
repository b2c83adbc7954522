"""uvicorn's websocket protocol with cheaper compression: every launcher of the web server runs
uvicorn with `--ws portal.websocket:WebSocketProtocol` (deploy/Procfile, deploy/docker-entrypoint.sh).

uvicorn compresses each frame (permessage-deflate, on unless `--ws-per-message-deflate false`) at
zlib's default level, 6, each connection with its own compression context. A viewer's frames
are the job's log as JSON, and compressing them that way is the web process's largest cost while
one viewer follows a 64-rank job (BENCHMARKS.md, ingest), and more so with 200 viewers of one job
(BENCHMARKS.md, fanout), who mostly receive the same frames (the same push of lines) and have
them compressed once each. So here:

- level 1 (nginx's default gzip level): the same log text in half the time, to 1.25x the bytes;
- no context kept between messages (`server_no_context_takeover`, RFC 7692 §7.1.1.1), so that a
  frame's compressed bytes depend on the frame alone: the process compresses a frame once and
  sends the same bytes to every viewer it goes to (SharedDeflate). Frames of a few KiB come out
  4.4 times smaller instead of 6; frames of a busy job's pushes (about 256 KiB) as small as with
  a kept context.

Everything else (window bits, memory level, the handshake) is uvicorn's.
"""
import logging
import zlib
from collections import OrderedDict

from uvicorn.protocols.websockets.websockets_sansio_impl import WebSocketsSansIOProtocol
from websockets.extensions.permessage_deflate import PerMessageDeflate, ServerPerMessageDeflateFactory
from websockets.frames import CONT, CTRL_OPCODES, Frame
from websockets.server import ServerProtocol

COMPRESSION_LEVEL = 1
WINDOW_BITS = 12                        # uvicorn's (a client may ask for less)
MEMORY_LEVEL = 5                        # uvicorn's

# Frames compressed lately in this process, by their bytes: what a frame sent to many viewers
# costs after the first. Small frames are compressed each time (as cheap as looking them up).
SHARED_MIN_BYTES = 1024
SHARED_MAX_BYTES = 16 << 20             # of frames kept (their uncompressed bytes)
_shared = OrderedDict()
_shared_bytes = 0


def compressed(payload, window_bits=WINDOW_BITS):
    """A whole message's payload as permessage-deflate sends it without context takeover."""
    encoder = zlib.compressobj(COMPRESSION_LEVEL, zlib.DEFLATED, -window_bits, MEMORY_LEVEL)
    return (encoder.compress(payload) + encoder.flush(zlib.Z_SYNC_FLUSH))[:-4]     # RFC 7692 §7.2.1


def _shared_compressed(payload):
    global _shared_bytes
    if len(payload) < SHARED_MIN_BYTES:
        return compressed(payload)
    data = _shared.get(payload)
    if data is not None:
        _shared.move_to_end(payload)
        return data
    data = _shared[payload] = compressed(payload)
    _shared_bytes += len(payload)
    while _shared_bytes > SHARED_MAX_BYTES and len(_shared) > 1:
        old, _ = _shared.popitem(last=False)
        _shared_bytes -= len(old)
    return data


class SharedDeflate(PerMessageDeflate):
    """permessage-deflate whose whole messages are compressed once per process (decoding what
    the client sends is websockets' own)."""

    def encode(self, frame):
        if frame.opcode in CTRL_OPCODES or frame.opcode is CONT or not frame.fin:
            return super().encode(frame)        # fragments: websockets' way (the portal sends none)
        payload = bytes(frame.data)
        if self.local_max_window_bits == WINDOW_BITS:
            data = _shared_compressed(payload)
        else:                                   # a client that asked for a smaller window
            data = compressed(payload, self.local_max_window_bits)
        return Frame(frame.opcode, data, frame.fin, True, frame.rsv2, frame.rsv3)


class SharedDeflateFactory(ServerPerMessageDeflateFactory):
    def __init__(self):
        super().__init__(server_no_context_takeover=True, server_max_window_bits=WINDOW_BITS,
                         client_max_window_bits=WINDOW_BITS,
                         compress_settings={"memLevel": MEMORY_LEVEL, "level": COMPRESSION_LEVEL})

    def process_request_params(self, params, accepted_extensions):
        response, made = super().process_request_params(params, accepted_extensions)
        return response, SharedDeflate(made.remote_no_context_takeover, made.local_no_context_takeover,
                                        made.remote_max_window_bits, made.local_max_window_bits,
                                        made.compress_settings)


class WebSocketProtocol(WebSocketsSansIOProtocol):
    def __init__(self, config, server_state, app_state, _loop=None):
        super().__init__(config, server_state, app_state, _loop)
        if config.ws_per_message_deflate:
            self.conn = ServerProtocol(extensions=[SharedDeflateFactory()], max_size=config.ws_max_size,
                                       logger=logging.getLogger("uvicorn.error"))

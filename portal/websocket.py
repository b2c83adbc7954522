"""uvicorn's websocket protocol with lighter compression: every launcher of the web server runs
uvicorn with `--ws portal.websocket:WebSocketProtocol` (deploy/Procfile, deploy/docker-entrypoint.sh).

uvicorn compresses each frame (permessage-deflate, on unless `--ws-per-message-deflate false`) at
zlib's default level, 6. A viewer's frames are the job's log as JSON, and compressing them was
the web process's largest cost: 40-50% of uvicorn's CPU while one viewer followed a 64-rank job,
and paid again for every viewer. Level 1 (nginx's default gzip level) compresses the same log
text in half the time to 1.25x the bytes (BENCHMARKS.md, ingest): 6.6 times smaller than
uncompressed instead of 8. Everything else (window bits, memory level, the handshake) is
uvicorn's.
"""
import logging

from uvicorn.protocols.websockets.websockets_sansio_impl import WebSocketsSansIOProtocol
from websockets.extensions.permessage_deflate import ServerPerMessageDeflateFactory
from websockets.server import ServerProtocol

COMPRESSION_LEVEL = 1


def deflate():
    """The permessage-deflate extension offered to clients: uvicorn's, at COMPRESSION_LEVEL."""
    return ServerPerMessageDeflateFactory(server_max_window_bits=12, client_max_window_bits=12,
                                          compress_settings={"memLevel": 5, "level": COMPRESSION_LEVEL})


class WebSocketProtocol(WebSocketsSansIOProtocol):
    def __init__(self, config, server_state, app_state, _loop=None):
        super().__init__(config, server_state, app_state, _loop)
        if config.ws_per_message_deflate:
            self.conn = ServerProtocol(extensions=[deflate()], max_size=config.ws_max_size, logger=logging.getLogger("uvicorn.error"))

"""The web server's frame compression (portal/websocket.py): each frame on its own, at level 1,
compressed once per process for every viewer it goes to, in a bounded amount of memory."""
import os
import zlib

from portal import websocket


def inflated(data):
    """What a client's permessage-deflate decoder makes of a frame (RFC 7692 §7.2.2)."""
    return zlib.decompressobj(-websocket.WINDOW_BITS).decompress(data + b"\x00\x00\xff\xff")


def test_a_frame_is_compressed_once_for_every_viewer_it_goes_to():
    payload = b'{"type": "lines", "lines": [' + b", ".join(b'{"seq": %d, "text": "step %d"}' % (i, i) for i in range(200)) + b"]}"
    first = websocket._shared_compressed(payload)
    assert inflated(first) == payload
    another = bytes(bytearray(payload))                               # an equal frame, another object
    assert another is not payload
    assert websocket._shared_compressed(another) is first             # no second compression
    assert websocket.compressed(payload) == first                     # the same bytes as compressing it afresh


def test_the_frames_kept_stay_within_their_bound():
    websocket._shared.clear()
    websocket._shared_bytes = 0
    size = 1 << 20
    frames = [os.urandom(16) * (size // 16) for _ in range(websocket.SHARED_MAX_BYTES // size + 4)]
    for frame in frames:
        assert inflated(websocket._shared_compressed(frame)) == frame
    assert websocket._shared_bytes <= websocket.SHARED_MAX_BYTES
    assert websocket._shared_bytes == sum(map(len, websocket._shared))
    assert frames[-1] in websocket._shared and frames[0] not in websocket._shared


def test_small_frames_are_not_kept():
    small = b'{"type": "state", "state": "RUNNING", "reason": ""}'
    assert inflated(websocket._shared_compressed(small)) == small
    assert small not in websocket._shared
